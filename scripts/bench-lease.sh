#!/usr/bin/env bash
# Hot keys on Redis with leases, next to the memory store and to Redis without leases, in one run:
#   1. `tollgate serve` with redis-benchmark -c 64 -P 16 on one hot key (CL.THROTTLE, nothing
#      denied): memory store, Redis with --lease auto, Redis with --lease off; ratios to memory.
#   2. Two `tollgate serve` processes on one redis-server, 32 clients each on one key for 3 s:
#      admitted against the algorithm's bound, Redis calls per decision (crates/cli/tests/lease.rs).
#   3. In-process, 2 threads on one hot key (cargo bench -p tollgate-store --bench lease).
#   bash scripts/bench-lease.sh [REQUESTS]      (default 1000000; needs redis-server, redis-benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000000}"

cargo build --release -q -p tollgate
TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
free_port() {
  local port
  for port in $(seq 22000 22999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
  done
  echo "no free port" >&2; exit 1
}
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save "" --appendonly no --daemonize no >/dev/null &
REDIS_PID=$!
TG_PID=
trap 'kill $REDIS_PID $TG_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

# One serve at a time on a fresh key: requests/s, then its script calls per decision.
serve() {
  local port
  port=$(free_port)
  local http
  http=$(( port + 1 ))
  "$TOLLGATE" serve --resp "127.0.0.1:$port" --http "127.0.0.1:$http" --grpc 127.0.0.1:0 --log-level warn "$@" &
  TG_PID=$!
  for _ in $(seq 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  local key="hot:$RANDOM$RANDOM"
  local rps
  rps=$(redis-benchmark -p "$port" -c 64 -P 16 -n "$N" --csv CL.THROTTLE "$key" 999999999 1000000000 1 1 2>/dev/null \
    | tail -1 | cut -d, -f2 | tr -d '"')
  local calls
  calls=$(curl -s "127.0.0.1:$http/metrics" | awk '/^tollgate_store_script_calls_total/ {print $2}')
  kill "$TG_PID"; wait "$TG_PID" 2>/dev/null || true; TG_PID=
  echo "$rps ${calls:-0}"
}
read -r memory _ < <(serve)
read -r leased leased_calls < <(serve --store "redis://127.0.0.1:$REDIS_PORT" --lease auto)
read -r unleased unleased_calls < <(serve --store "redis://127.0.0.1:$REDIS_PORT" --lease off)
printf '%-40s %14s %10s %16s\n' "serve, one hot key (-c 64 -P 16 -n $N)" "requests/s" "vs memory" "calls/decision"
row() { printf '%-40s %14.0f %9.2fx %16s\n' "$1" "$2" "$(echo "$2 / $memory" | bc -l)" "$3"; }
row "memory" "$memory" "-"
row "redis, --lease auto" "$leased" "$(echo "scale=6; $leased_calls / $N" | bc -l)"
row "redis, --lease off" "$unleased" "$(echo "scale=6; $unleased_calls / $N" | bc -l)"
kill $REDIS_PID; wait $REDIS_PID 2>/dev/null || true

echo
echo "two serve processes, one redis-server, 32 clients each on one key for 3 s (burst 1000, 10000/s):"
TOLLGATE_LEASE_LIMIT="1000 10000" cargo test --release -q -p tollgate --test lease -- --nocapture 2>&1 \
  | grep -E "requests in|panicked|FAILED" || true

echo
cargo bench -q -p tollgate-store --bench lease 2>/dev/null
