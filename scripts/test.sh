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
# crates/cli/tests/prometheus.rs runs Prometheus (and promtool) on deploy/prometheus and the
# Grafana dashboard's queries.
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
# The Envoy client tests (crates/cli/tests/envoy_python.rs) run a Python gRPC client built from
# Envoy's protos, from a virtualenv in the target dir, made once (Debian's python3 makes one only
# with python3-venv, whose ensurepip supplies the virtualenv's pip).
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
pyenv="$target_dir/pyenv"
if [ ! -x "$pyenv/bin/python" ] && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3 python3-venv)
fi
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u)
fi

# grpcio, grpcio-health-checking and xds-protos (Envoy's protos), at the versions in
# crates/cli/tests/python/requirements.txt, installed when the virtualenv cannot import them.
export TOLLGATE_PYTHON="$pyenv/bin/python"
if ! "$TOLLGATE_PYTHON" -c 'import grpc, grpc_health.v1.health_pb2, envoy.service.ratelimit.v3.rls_pb2' >/dev/null 2>&1; then
  step "installing the Python gRPC client's packages into $pyenv"
  [ -x "$TOLLGATE_PYTHON" ] || python3 -m venv --clear "$pyenv"
  "$TOLLGATE_PYTHON" -m pip install --disable-pip-version-check --no-input --quiet \
    -r crates/cli/tests/python/requirements.txt
fi

step "rustfmt"
cargo fmt --all --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
cargo test --workspace --locked

# A 3-primary Redis Cluster with one primary killed under load, for every failure policy (two
# algorithms, 8 s each), on the binary the tests just built: nothing may be lost, and --strict
# holds the run to docs/failure.md, "Failure behaviour" (no key over its bound under closed or
# local, local's rate back within 1 s, ...; scripts/failure-injection.sh without --short is the full
# run on that page).
step "failure injection (short)"
bash scripts/failure-injection.sh --short --strict --binary "$target_dir/debug/tollgate"
# The same with replicas, then with Sentinel: a primary killed, Redis promoting its replica, and
# tollgate following the promotion (the run fails if it still falls back at its end).
step "failure injection (short, a cluster with replicas)"
bash scripts/failure-injection.sh --short --strict --topology replicas --policies closed --binary "$target_dir/debug/tollgate"
step "failure injection (short, Sentinel)"
bash scripts/failure-injection.sh --short --strict --topology sentinel --policies closed --binary "$target_dir/debug/tollgate"
