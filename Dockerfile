# Builds the pgoutbox binary and ships it alone on a small Debian image.
# The build stage copies every path cargo needs to read the manifest: Cargo.toml declares
# the bench (benches/pgoutbox.rs), so cargo refuses a tree without it even for --bin;
# examples/ is discovered and copied too; fuzz/ is its own workspace and is not needed.
# scripts/check-dockerfile.sh builds exactly these COPY lines in an empty directory (CI
# runs it): add a path here when a new target needs one.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY examples ./examples
COPY benches ./benches
RUN cargo build --release --locked --bin pgoutbox

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/pgoutbox /usr/local/bin/pgoutbox
USER 65534
ENTRYPOINT ["pgoutbox"]
CMD ["run"]
