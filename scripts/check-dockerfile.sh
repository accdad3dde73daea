#!/usr/bin/env bash
# Proves the Dockerfile's build stage builds, without a Docker engine: copies exactly the
# paths its COPY lines name (read from the Dockerfile itself, so the check cannot drift
# from it) into an empty directory, as Docker would lay them out under WORKDIR, and runs
# `cargo build --locked --bin pgoutbox` there. A file the build needs but the COPY set
# leaves out (a [[bench]] declared in Cargo.toml, a module under a new directory) fails
# here as it would fail in `docker build`.
#
# Debug build (the check is about the file set, not the optimiser). The target directory
# is a fresh temporary one unless DOCKERFILE_CHECK_TARGET_DIR names one to reuse (outside
# ./target): the dependencies then compile once, and pgoutbox itself still compiles from
# the copied tree every time (copied without keeping mtimes, so cargo never takes an
# earlier build of it as fresh). Crates come from CARGO_HOME's registry as usual.
# Measured on a 2-core machine: 113 to 226 s with a fresh target directory (depending on
# what else runs), 16 s reusing one.
set -euo pipefail
cd "$(dirname "$0")/.."
dockerfile=${1:-Dockerfile}

work=$(mktemp -d /tmp/pgoutbox-dockerfile-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
ctx="$work/ctx"
mkdir -p "$ctx"

# The build stage: from its FROM line to the next FROM. Continuation lines are joined.
stage=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$dockerfile" | awk '
  /^[[:space:]]*FROM[[:space:]]/ { n++ }
  n == 1 && !/^[[:space:]]*(#|$)/ { print }')
[ -n "$stage" ] || { echo "check-dockerfile: no build stage in $dockerfile" >&2; exit 1; }

workdir=/
copies=0
runs=()
while read -r instr rest; do
  case "${instr^^}" in
    WORKDIR)
      case "$rest" in /*) workdir=$rest ;; *) workdir="${workdir%/}/$rest" ;; esac ;;
    COPY|ADD)
      read -r -a args <<<"$rest"
      for a in "${args[@]}"; do
        case "$a" in
          --from=*) echo "check-dockerfile: COPY $a in the build stage is not supported" >&2; exit 1 ;;
          --*) echo "check-dockerfile: ignoring COPY option $a" >&2 ;;
        esac
      done
      paths=()
      for a in "${args[@]}"; do [[ "$a" == --* ]] || paths+=("$a"); done
      ((${#paths[@]} >= 2)) || { echo "check-dockerfile: cannot read: $instr $rest" >&2; exit 1; }
      dest=${paths[-1]}
      unset 'paths[-1]'
      case "$dest" in /*) ;; *) dest="${workdir%/}/$dest" ;; esac
      for src in "${paths[@]}"; do
        [ -e "$src" ] || { echo "check-dockerfile: $instr names $src, which does not exist" >&2; exit 1; }
        if [ -d "$src" ]; then
          # Docker copies a directory's contents into the destination.
          mkdir -p "$ctx$dest"
          cp -R "$src/." "$ctx$dest/"
        elif [[ "$dest" == */ || ${#paths[@]} -gt 1 ]]; then
          mkdir -p "$ctx$dest"
          cp -R "$src" "$ctx$dest/"
        else
          mkdir -p "$(dirname "$ctx$dest")"
          cp -R "$src" "$ctx$dest"
        fi
        copies=$((copies + 1))
      done ;;
    RUN)
      runs+=("$rest") ;;
  esac
done <<<"$stage"

((copies > 0)) || { echo "check-dockerfile: no COPY in the build stage" >&2; exit 1; }
build=""
for r in "${runs[@]}"; do [[ "$r" == *"cargo build"* ]] && build=$r; done
[ -n "$build" ] || { echo "check-dockerfile: no 'RUN cargo build' in the build stage" >&2; exit 1; }
[[ "$build" == *--locked* ]] || { echo "check-dockerfile: the build must use --locked: $build" >&2; exit 1; }

echo "check-dockerfile: copied $copies paths of $dockerfile's build stage into an empty directory:"
(cd "$ctx$workdir" && find . -maxdepth 2 -not -path . | sort | sed 's/^/  /')
export CARGO_TARGET_DIR=${DOCKERFILE_CHECK_TARGET_DIR:-$work/target}
start=$(date +%s)
if ! (cd "$ctx$workdir" && cargo build --locked --bin pgoutbox); then
  echo "check-dockerfile: FAILED: $dockerfile's build stage ('$build') does not build from the" >&2
  echo "  files it copies (a missing path? add it to the COPY lines)" >&2
  exit 1
fi
echo "check-dockerfile: ok, built in $(($(date +%s) - start)) s (the Dockerfile runs: $build)"
