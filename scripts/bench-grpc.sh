#!/usr/bin/env bash
# Benchmarks Envoy's rate-limit service (gRPC ShouldRateLimit, one descriptor) next to the same
# fixed-window decision over RESP (TG.CHECK), in the same run, on the memory store and on Redis.
#   bash scripts/bench-grpc.sh [SECONDS] [CONCURRENCY]      (default 5 s, 64; needs redis-server)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-5}"
CONCURRENCY="${2:-64}"

cargo build --release -q -p tollgate -p tollgate-server --example rls_load
TARGET="${CARGO_TARGET_DIR:-target}/release"
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
YAML

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 200); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "nothing answers on $1" >&2; exit 1; }

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save "" --appendonly no >/dev/null &
pids+=($!)
wait_for "$REDIS_PORT"

for store in memory "redis://127.0.0.1:$REDIS_PORT"; do
  RESP_PORT=$(free_port); GRPC_PORT=$(free_port)
  "$TARGET/tollgate" serve --resp "127.0.0.1:$RESP_PORT" --http 127.0.0.1:0 --grpc "127.0.0.1:$GRPC_PORT" \
    --store "$store" --envoy-config "$work/bench.yaml" --log-level warn &
  pids+=($!)
  wait_for "$RESP_PORT"
  echo "== store: $store"
  "$TARGET/examples/rls_load" "127.0.0.1:$GRPC_PORT" "127.0.0.1:$RESP_PORT" "$SECONDS_EACH" "$CONCURRENCY"
done
