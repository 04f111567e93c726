#!/usr/bin/env bash
# Benchmarks `tollgate serve` (memory store) with redis-benchmark, next to a plain redis-server's
# INCR measured in the same run (the loopback ceiling on this machine).
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
trap 'kill $TG_PID $REDIS_PID 2>/dev/null || true' EXIT
# Both must answer within 20 s, and neither may have exited meanwhile (a port taken, say).
for _ in $(seq 200); do
  redis-cli -p "$TG_PORT" ping >/dev/null 2>&1 && redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  kill -0 "$TG_PID" 2>/dev/null || { echo "tollgate serve exited" >&2; exit 1; }
  kill -0 "$REDIS_PID" 2>/dev/null || { echo "redis-server exited" >&2; exit 1; }
  sleep 0.1
done
redis-cli -p "$TG_PORT" ping >/dev/null 2>&1 || { echo "tollgate serve did not answer within 20 s" >&2; exit 1; }

rps() { redis-benchmark -p "$1" -c 64 -n "$N" --csv "${@:2}" 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'; }
incr1=$(rps "$REDIS_PORT" INCR counter)
incr16=$(rps "$REDIS_PORT" -P 16 INCR counter)
printf '%-44s %14s %10s\n' "case (-c 64 -n $N)" "requests/s" "vs INCR"
row() { printf '%-44s %14.0f %9.2fx\n' "$1" "$2" "$(echo "$2 / $3" | bc -l)"; }
row "redis-server INCR" "$incr1" "$incr1"
row "redis-server INCR -P 16" "$incr16" "$incr16"
row "CL.THROTTLE hot key" "$(rps "$TG_PORT" CL.THROTTLE user 15 30 60 1)" "$incr1"
row "CL.THROTTLE -r 100000" "$(rps "$TG_PORT" -r 100000 CL.THROTTLE user:__rand_int__ 15 30 60 1)" "$incr1"
row "CL.THROTTLE hot key -P 16" "$(rps "$TG_PORT" -P 16 CL.THROTTLE user 15 30 60 1)" "$incr16"
row "CL.THROTTLE -r 100000 -P 16" "$(rps "$TG_PORT" -P 16 -r 100000 CL.THROTTLE user:__rand_int__ 15 30 60 1)" "$incr16"
