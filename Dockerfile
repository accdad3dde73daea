# Builds the pgoutbox binary and ships it alone on a small Debian image.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
RUN cargo build --release --locked --bin pgoutbox

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/pgoutbox /usr/local/bin/pgoutbox
USER 65534
ENTRYPOINT ["pgoutbox"]
CMD ["run"]
