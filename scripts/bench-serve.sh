#!/usr/bin/env bash
# Benchmarks `tollgate serve` (memory store) next to a plain redis-server's INCR measured in the
# same run (the loopback ceiling on this machine), each case with two clients: redis-benchmark and
# `tollgate bench resp` (same connections, pipeline and key spread), so either checks the other.
#   bash scripts/bench-serve.sh [REQUESTS]      (default 200000; needs redis-server, redis-benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-200000}"

cargo build --release -q -p tollgate
TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
[ -x "$TOLLGATE" ] || { echo "no binary at $TOLLGATE after cargo build" >&2; exit 1; }
free_port() {
  local port
  for port in $(seq 21000 21999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
  done
  echo "no free port" >&2; exit 1
}
TG_PORT=$(free_port)
"$TOLLGATE" serve --resp "127.0.0.1:$TG_PORT" --http 127.0.0.1:0 --log-level warn &
TG_PID=$!
REDIS_PORT=$(( TG_PORT + 1000 ))
redis-server --port "$REDIS_PORT" --save "" --appendonly no --daemonize no >/dev/null &
REDIS_PID=$!
# Both must answer within 20 s, and neither may have exited meanwhile (a port taken, say).
for _ in $(seq 200); do
  redis-cli -p "$TG_PORT" ping >/dev/null 2>&1 && redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  kill -0 "$TG_PID" 2>/dev/null || { echo "tollgate serve exited" >&2; exit 1; }
  kill -0 "$REDIS_PID" 2>/dev/null || { echo "redis-server exited" >&2; exit 1; }
  sleep 0.1
done
redis-cli -p "$TG_PORT" ping >/dev/null 2>&1 || { echo "tollgate serve did not answer within 20 s" >&2; exit 1; }

rps() { redis-benchmark -p "$1" -c 64 -n "$N" --csv "${@:2}" 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'; }
# tollgate bench's throughput: PORT, then its flags.
ours() {
  "$TOLLGATE" bench resp --addr "127.0.0.1:$1" -c 64 -n "$N" -q --json "$work/run.json" "${@:2}" >/dev/null
  grep -o '"throughput_per_s": [0-9.]*' "$work/run.json" | cut -d' ' -f2
}
work=$(mktemp -d)
trap 'kill $TG_PID $REDIS_PID 2>/dev/null || true; rm -rf "$work"' EXIT
incr1=$(rps "$REDIS_PORT" INCR counter)
incr16=$(rps "$REDIS_PORT" -P 16 INCR counter)
printf '%-32s %18s %18s %10s\n' "case (-c 64 -n $N)" "redis-benchmark/s" "tollgate bench/s" "vs INCR"
# CASE, redis-benchmark's figure, tollgate bench's, the INCR figure it is compared with.
row() { printf '%-32s %18.0f %18.0f %9.2fx\n' "$1" "$2" "$3" "$(echo "$2 / $4" | bc -l)"; }
row "redis-server INCR" "$incr1" "$(ours "$REDIS_PORT" --command 'INCR counter')" "$incr1"
row "redis-server INCR -P 16" "$incr16" "$(ours "$REDIS_PORT" -P 16 --command 'INCR counter')" "$incr16"
row "CL.THROTTLE hot key" "$(rps "$TG_PORT" CL.THROTTLE user 15 30 60 1)" \
  "$(ours "$TG_PORT" --command 'CL.THROTTLE user 15 30 60 1')" "$incr1"
row "CL.THROTTLE -r 100000" "$(rps "$TG_PORT" -r 100000 CL.THROTTLE user:__rand_int__ 15 30 60 1)" \
  "$(ours "$TG_PORT" --keys 100000 --command 'CL.THROTTLE {key} 15 30 60 1')" "$incr1"
row "CL.THROTTLE hot key -P 16" "$(rps "$TG_PORT" -P 16 CL.THROTTLE user 15 30 60 1)" \
  "$(ours "$TG_PORT" -P 16 --command 'CL.THROTTLE user 15 30 60 1')" "$incr16"
row "CL.THROTTLE -r 100000 -P 16" "$(rps "$TG_PORT" -P 16 -r 100000 CL.THROTTLE user:__rand_int__ 15 30 60 1)" \
  "$(ours "$TG_PORT" -P 16 --keys 100000 --command 'CL.THROTTLE {key} 15 30 60 1')" "$incr16"
echo "(vs INCR: redis-benchmark's figure over redis-benchmark's INCR at the same pipeline depth)"
