#!/usr/bin/env bash
# Benchmarks Envoy's rate-limit service (gRPC ShouldRateLimit, one descriptor) next to the same
# fixed-window decision over RESP (TG.CHECK), in the same run, on the memory store and on Redis,
# with `tollgate bench`: gRPC as CONCURRENCY streams on one HTTP/2 connection (as Envoy sends
# them), RESP as CONCURRENCY connections, keys spread over 10,000 users, every call admitted.
#   bash scripts/bench-grpc.sh [SECONDS] [CONCURRENCY]      (default 5 s, 64; needs redis-server)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-5}"
CONCURRENCY="${2:-64}"

cargo build --release -q -p tollgate
TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
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
# One run's figures from its --json: calls/s, then p50/p99/p99.9 in µs.
figures() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l = r["latency_us"]
print(f"{r['throughput_per_s']:>12.0f} {l['p50']:>10} {l['p99']:>10} {l['p999']:>10}  errors {r['errors']}, denied {r['denied']}")
PY
}

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save "" --appendonly no >/dev/null &
pids+=($!)
wait_for "$REDIS_PORT"

for store in memory "redis://127.0.0.1:$REDIS_PORT"; do
  RESP_PORT=$(free_port); GRPC_PORT=$(free_port)
  "$TOLLGATE" serve --resp "127.0.0.1:$RESP_PORT" --http 127.0.0.1:0 --grpc "127.0.0.1:$GRPC_PORT" \
    --store "$store" --envoy-config "$work/bench.yaml" --log-level warn &
  pids+=($!)
  wait_for "$RESP_PORT"
  echo "== store: $store"
  printf '%-24s %12s %10s %10s %10s\n' "-c $CONCURRENCY, $SECONDS_EACH s" "calls/s" "p50 µs" "p99 µs" "p99.9 µs"
  "$TOLLGATE" bench grpc --addr "127.0.0.1:$GRPC_PORT" --domain bench --descriptor 'user={key}' --key-prefix u \
    --keys 10000 -c 1 -P "$CONCURRENCY" --duration "${SECONDS_EACH}s" -q --json "$work/grpc.json" >/dev/null
  printf '%-24s %s\n' "gRPC ShouldRateLimit" "$(figures "$work/grpc.json")"
  "$TOLLGATE" bench resp --addr "127.0.0.1:$RESP_PORT" --command 'TG.CHECK {key} fixed-window 1000000000 1000' \
    --key-prefix u --keys 10000 -c "$CONCURRENCY" --duration "${SECONDS_EACH}s" -q --json "$work/resp.json" >/dev/null
  printf '%-24s %s\n' "RESP TG.CHECK" "$(figures "$work/resp.json")"
done
