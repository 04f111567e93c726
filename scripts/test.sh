#!/usr/bin/env bash
# Runs every check and test of the workspace; CI (.ci/run) calls exactly this.
# Works on a fresh machine with a Rust toolchain: installs what the tests need when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# One target dir for every step (and for a CARGO_TARGET_DIR the caller already shares).
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

# The Redis tests start their own redis-server processes (and a 3-node cluster with redis-cli);
# the server tests drive it with redis-cli, redis-benchmark and curl.
missing=()
for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null 2>&1 || missing+=(redis-server)
done
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y $(printf '%s\n' "${missing[@]}" | sort -u)
fi

step "rustfmt"
cargo fmt --all --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo test --workspace --locked
