#!/usr/bin/env bash
# What a Redis-backed decision costs, next to redis-cell's CL.THROTTLE measured in the same run
# (its module built here from crates.io, never committed) and to the memory store:
#   - decisions/s through `tollgate serve --lease off` (redis-benchmark -c 50, random keys), the
#     script's and the native module's, against redis-cell's own server; `serve`'s CPU per
#     decision on Redis and on the memory store; redis-server's CPU per decision (utime + stime
#     from /proc, over the decisions);
#   - one hot key at redis-benchmark -P 16 (leases, `--lease auto`), admitted and denied, against
#     the memory store;
#   in two set-ups: *shared* (everything on every core) and *a fleet in miniature* (redis-server
#   and redis-benchmark pinned to core 0, as redis-cell's server and its client are; `serve`
#   alone on core 1, started there, as on a machine of its own);
#   - time inside Redis per decision (INFO commandstats usec_per_call: tollgate's FCALL, which
#     includes the commands the script runs; redis-cell's CL.THROTTLE), GCRA and every algorithm;
#   - the floor of any Lua script here: a function that only runs TIME, GET and SET.
# Each figure is the median of ROUNDS runs (default 3), tollgate's and its peer's interleaved.
#   bash scripts/bench-redis-cost.sh [REQUESTS]   (default 200000; hot keys 10x that; needs
#   redis-server, redis-benchmark, taskset, cargo with access to crates.io for redis-cell)
#   QUICK=1: the tables of the two set-ups only (not the per-algorithm times).
#   TOLLGATE=path, MODULE=path, CELL=path: binaries built elsewhere (another commit's).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-200000}"
N_HOT=$((N * 10))
KEYS=100000
ROUNDS="${ROUNDS:-3}"

if [ -z "${TOLLGATE:-}" ]; then
  cargo build --release -q -p tollgate -p tollgate-redis-module
  TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
  MODULE="$(cd "${CARGO_TARGET_DIR:-target}/release" && pwd)/libtollgate_redis_module.so"
fi
[ -x "$TOLLGATE" ] || { echo "no binary at $TOLLGATE" >&2; exit 1; }
[ -f "$MODULE" ] || { echo "no module at $MODULE" >&2; exit 1; }
work=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

# redis-cell's module, from its crate on crates.io (the newest published there), built in $work.
cell_module() {
  mkdir -p "$work/fetch/src"
  printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nredis-cell = "*"\n' \
    > "$work/fetch/Cargo.toml"
  echo 'fn main() {}' > "$work/fetch/src/main.rs"
  (cd "$work/fetch" && cargo fetch -q)
  local src
  src=$(cd "$work/fetch" && cargo metadata --format-version 1 -q \
    | python3 -c 'import json,sys; m=json.load(sys.stdin); print(next(p["manifest_path"] for p in m["packages"] if p["name"]=="redis-cell"))')
  cp -r "$(dirname "$src")" "$work/cell"
  basename "$(dirname "$src")" > "$work/cell-version"
  (cd "$work/cell" && CARGO_TARGET_DIR="$work/cell/target" cargo build --release -q 2>/dev/null)
  ls "$work"/cell/target/release/libredis_cell.so
}
if [ -z "${CELL:-}" ]; then
  CELL=$(cell_module)
  CELL_VERSION=$(cat "$work/cell-version")
else
  CELL_VERSION="redis-cell ($CELL)"
fi

free_port() {
  local port
  for port in $(seq 23000 23999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      # Not handed out twice in one run.
      if ! grep -qx "$port" "$work/ports" 2>/dev/null; then echo "$port" >> "$work/ports"; echo "$port"; return; fi
    fi
  done
  echo "no free port" >&2; exit 1
}
wait_ping() { for _ in $(seq 200); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.1; done; echo "port $1 never answered" >&2; exit 1; }
redis() { # PORT [ARGS...]: a redis-server in the background; prints its pid
  redis-server --port "$1" --save "" --appendonly no --daemonize no "${@:2}" >/dev/null &
  echo $!
}
# CPU seconds (user + system) a process has used so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.4f\n", ($14 + $15) / hz }' "/proc/$1/stat"; }
usec() { redis-cli -p "$1" info commandstats | grep "^cmdstat_$2:" | grep -o 'usec_per_call=[0-9.]*' | cut -d= -f2; }
# The cores redis-benchmark runs on ("" for all).
BENCH_CORES=""
bench() { if [ -n "$BENCH_CORES" ]; then taskset -c "$BENCH_CORES" redis-benchmark "$@"; else redis-benchmark "$@"; fi; }
rps() { bench -p "$1" -c 50 -n "$N" -r "$KEYS" --csv "${@:2}" 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'; }
pin() { local cores=$1; shift; for pid in "$@"; do taskset -a -cp "$cores" "$pid" >/dev/null; done; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

TG_REDIS=$(free_port); TG_REDIS_PID=$(redis "$TG_REDIS"); PIDS+=("$TG_REDIS_PID")
NATIVE_REDIS=$(free_port); NATIVE_REDIS_PID=$(redis "$NATIVE_REDIS" --loadmodule "$MODULE"); PIDS+=("$NATIVE_REDIS_PID")
CELL_PORT=$(free_port); CELL_PID=$(redis "$CELL_PORT" --loadmodule "$CELL"); PIDS+=("$CELL_PID")
wait_ping "$TG_REDIS"; wait_ping "$CELL_PORT"; wait_ping "$NATIVE_REDIS"

SERVE_CORES=""
serve() { # PORT [FLAGS...]: tollgate serve in the background (on SERVE_CORES if set); prints its pid
  local run=("$TOLLGATE")
  [ -n "$SERVE_CORES" ] && run=(taskset -c "$SERVE_CORES" "$TOLLGATE")
  "${run[@]}" serve --resp "127.0.0.1:$1" --http 127.0.0.1:0 --grpc 127.0.0.1:0 --log-level warn "${@:2}" \
    >"$work/serve-$1.log" 2>&1 &
  echo $!
}
# The four `serve`s of one set-up: the script (lease off), the module (lease off), the memory
# store, and the script with leases (hot keys).
start_serves() {
  SERVE_REDIS=$(free_port); SERVE_REDIS_PID=$(serve "$SERVE_REDIS" --store "redis://127.0.0.1:$TG_REDIS" --lease off)
  SERVE_MEMORY=$(free_port); SERVE_MEMORY_PID=$(serve "$SERVE_MEMORY")
  SERVE_NATIVE=$(free_port)
  SERVE_NATIVE_PID=$(serve "$SERVE_NATIVE" --store "redis://127.0.0.1:$NATIVE_REDIS" --lease off --store-module)
  SERVE_LEASE=$(free_port); SERVE_LEASE_PID=$(serve "$SERVE_LEASE" --store "redis://127.0.0.1:$TG_REDIS" --lease auto)
  SERVES=("$SERVE_REDIS_PID" "$SERVE_MEMORY_PID" "$SERVE_NATIVE_PID" "$SERVE_LEASE_PID")
  PIDS+=("${SERVES[@]}")
  wait_ping "$SERVE_REDIS"; wait_ping "$SERVE_MEMORY"; wait_ping "$SERVE_NATIVE"; wait_ping "$SERVE_LEASE"
}
stop_serves() { kill "${SERVES[@]}" 2>/dev/null || true; wait "${SERVES[@]}" 2>/dev/null || true; }

THROTTLE=(CL.THROTTLE "user:__rand_int__" 15 30 60 1)
# One measured run: PORT of the client's target, pids whose CPU counts (redis, serve or -), then
# the command. Prints: decisions/s, redis CPU us/decision, serve CPU us/decision.
measure() {
  local port=$1 redis_pid=$2 serve_pid=$3; shift 3
  local r0 s0 r1 s1 rate
  r0=$( [ "$redis_pid" = - ] && echo 0 || cpu "$redis_pid"); s0=$( [ "$serve_pid" = - ] && echo 0 || cpu "$serve_pid")
  rate=$(rps "$port" "$@")
  r1=$( [ "$redis_pid" = - ] && echo 0 || cpu "$redis_pid"); s1=$( [ "$serve_pid" = - ] && echo 0 || cpu "$serve_pid")
  echo "$rate $(echo "($r1 - $r0) * 1000000 / $N" | bc -l) $(echo "($s1 - $s0) * 1000000 / $N" | bc -l)"
}
# One hot key at -P 16: PORT, then the command (its key fresh per run). Prints decisions/s.
hot() {
  local port=$1; shift
  bench -p "$port" -c 50 -P 16 -n "$N_HOT" --csv "$@" 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"'
}
DENIED=(999 1000 1)              # burst 1,000, 1,000/s: nearly every call denied
ADMITTED=(999999999 1000000000 1) # nothing denied
ratio() { echo "$1 / $2" | bc -l; }
# Column $2 of file $1's lines, median.
col() { awk -v c="$2" '{ print $c }' "$1" | median; }

# One set-up's table: ROUNDS interleaved rounds of every measurement, medians printed.
setup_table() {
  local name=$1 out="$work/$1"
  rm -f "$out".*
  # Warm-up: the script loaded, connections made.
  rps "$SERVE_REDIS" "${THROTTLE[@]}" >/dev/null
  rps "$SERVE_NATIVE" "${THROTTLE[@]}" >/dev/null
  rps "$SERVE_MEMORY" "${THROTTLE[@]}" >/dev/null
  for round in $(seq "$ROUNDS"); do
    measure "$SERVE_REDIS" "$TG_REDIS_PID" "$SERVE_REDIS_PID" "${THROTTLE[@]}" >> "$out.script"
    measure "$CELL_PORT" "$CELL_PID" - "${THROTTLE[@]}" >> "$out.cell"
    measure "$SERVE_NATIVE" "$NATIVE_REDIS_PID" "$SERVE_NATIVE_PID" "${THROTTLE[@]}" >> "$out.module"
    measure "$SERVE_MEMORY" - "$SERVE_MEMORY_PID" "${THROTTLE[@]}" >> "$out.memory"
    hot "$SERVE_MEMORY" CL.THROTTLE "deny:$RANDOM:$round" "${DENIED[@]}" >> "$out.memory-denied"
    hot "$SERVE_LEASE" CL.THROTTLE "deny:$RANDOM:$round" "${DENIED[@]}" >> "$out.lease-denied"
    hot "$SERVE_MEMORY" CL.THROTTLE "admit:$RANDOM:$round" "${ADMITTED[@]}" >> "$out.memory-admitted"
    hot "$SERVE_LEASE" CL.THROTTLE "admit:$RANDOM:$round" "${ADMITTED[@]}" >> "$out.lease-admitted"
  done
  local cell_rate cell_cpu mem_cpu
  cell_rate=$(col "$out.cell" 1); cell_cpu=$(col "$out.cell" 2); mem_cpu=$(col "$out.memory" 3)
  echo
  echo "$name: $ROUNDS rounds, medians; -c 50, $N decisions over $KEYS random keys, serve --lease off;"
  echo "hot key: -c 50 -P 16, $N_HOT decisions, serve --lease auto; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  printf '%-58s %12s %12s %8s\n' "" "tollgate" "peer" "ratio"
  local kind
  for kind in script module; do
    local rate redis_cpu serve_cpu
    rate=$(col "$out.$kind" 1); redis_cpu=$(col "$out.$kind" 2); serve_cpu=$(col "$out.$kind" 3)
    printf '%-58s %12.0f %12.0f %7.2fx\n' "decisions/s through serve on Redis ($kind) / redis-cell" \
      "$rate" "$cell_rate" "$(ratio "$rate" "$cell_rate")"
    printf '%-58s %12.2f %12.2f %7.2fx\n' "serve's CPU per Redis decision ($kind) / memory (us)" \
      "$serve_cpu" "$mem_cpu" "$(ratio "$serve_cpu" "$mem_cpu")"
    printf '%-58s %12.2f %12.2f %7.2fx\n' "redis-server CPU per decision ($kind) / redis-cell (us)" \
      "$redis_cpu" "$cell_cpu" "$(ratio "$redis_cpu" "$cell_cpu")"
  done
  printf '%-58s %12.0f\n' "decisions/s through serve on the memory store" "$(col "$out.memory" 1)"
  local which
  for which in denied admitted; do
    local leased memory
    leased=$(median < "$out.lease-$which"); memory=$(median < "$out.memory-$which")
    printf '%-58s %12.0f %12.0f %7.2fx\n' "one hot key, -P 16, $which: Redis (leases) / memory" \
      "$leased" "$memory" "$(ratio "$leased" "$memory")"
  done
}

echo "per decision; $CELL_VERSION; $(redis-server --version | cut -d' ' -f1-3); $(nproc) cores"

# Shared: everything on every core.
start_serves
setup_table "shared (every process on every core)"
stop_serves

# A fleet in miniature: Redis and its client on core 0, `serve` alone on core 1.
if [ "$(nproc)" -ge 2 ]; then
  pin 0 "$TG_REDIS_PID" "$NATIVE_REDIS_PID" "$CELL_PID"
  BENCH_CORES=0 SERVE_CORES=1
  start_serves
  setup_table "a fleet in miniature (redis-server and redis-benchmark on core 0, serve on core 1)"
  stop_serves
  pin "0-$(($(nproc) - 1))" "$TG_REDIS_PID" "$NATIVE_REDIS_PID" "$CELL_PID"
  BENCH_CORES="" SERVE_CORES=""
fi
[ -n "${QUICK:-}" ] && exit 0

# The time inside Redis, GCRA: through serve, and sent directly.
start_serves
rps "$SERVE_REDIS" "${THROTTLE[@]}" >/dev/null
redis-cli -p "$TG_REDIS" config resetstat >/dev/null; redis-cli -p "$CELL_PORT" config resetstat >/dev/null
rps "$SERVE_REDIS" "${THROTTLE[@]}" >/dev/null
tg_usec=$(usec "$TG_REDIS" fcall)
rps "$CELL_PORT" "${THROTTLE[@]}" >/dev/null
cell_usec=$(usec "$CELL_PORT" cl.throttle)
rps "$SERVE_NATIVE" "${THROTTLE[@]}" >/dev/null
redis-cli -p "$NATIVE_REDIS" config resetstat >/dev/null
rps "$SERVE_NATIVE" "${THROTTLE[@]}" >/dev/null
nat_usec=$(usec "$NATIVE_REDIS" tollgate.check)

# The FCALL `serve` sends for one command, as words (read with MONITOR), its key in place of KEY.
fcall_of() {
  timeout 2 redis-cli -p "$TG_REDIS" monitor > "$work/monitor" &
  local monitor=$!
  sleep 0.3
  redis-cli -p "$SERVE_REDIS" "$@" >/dev/null
  wait "$monitor" 2>/dev/null || true
  grep -m1 '"FCALL"' "$work/monitor" | python3 -c '
import shlex, sys
words = shlex.split(sys.stdin.read().split("]", 1)[1])
words[3] = "KEY"  # FCALL function numkeys key ...
print("\n".join(words))'
}

# The same FCALL as serve's CL.THROTTLE, sent by redis-benchmark directly (as redis-cell's is).
mapfile -t call < <(fcall_of CL.THROTTLE probe 15 30 60 1)
call=("${call[@]/#KEY/direct:user:__rand_int__}")
redis-cli -p "$TG_REDIS" config resetstat >/dev/null
rps "$TG_REDIS" "${call[@]}" >/dev/null
tg_direct_usec=$(usec "$TG_REDIS" fcall)
native_call=(TOLLGATE.CHECK "${call[@]:3}")
redis-cli -p "$NATIVE_REDIS" config resetstat >/dev/null
rps "$NATIVE_REDIS" "${native_call[@]}" >/dev/null
nat_direct_usec=$(usec "$NATIVE_REDIS" tollgate.check)

# The floor: a function that only reads the time, gets and sets the key (what any decision
# script needs), called directly.
printf '#!lua name=floor\nredis.register_function("floor", function(keys, args)\n  redis.call("TIME")\n  redis.call("GET", keys[1])\n  redis.call("SET", keys[1], "1795668175635067000", "PX", 60000)\n  return 1\nend)\n' \
  > "$work/floor.lua"
redis-cli -p "$TG_REDIS" -x function load replace < "$work/floor.lua" >/dev/null
redis-cli -p "$TG_REDIS" config resetstat >/dev/null
rps "$TG_REDIS" FCALL floor 1 "floor:__rand_int__" >/dev/null
floor_usec=$(usec "$TG_REDIS" fcall)

echo
echo "time inside Redis per decision, GCRA (usec_per_call)"
printf '%-52s %12s %14s %8s\n' "" "tollgate" "redis-cell" "ratio"
row() { printf '%-52s %12.2f %14.2f %7.2fx\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }
row "the script, sent directly (us)" "$tg_direct_usec" "$cell_usec"
row "the script, sent by serve (us)" "$tg_usec" "$cell_usec"
row "the module, sent directly (us)" "$nat_direct_usec" "$cell_usec"
row "the module, sent by serve (us)" "$nat_usec" "$cell_usec"
row "floor: a function running TIME, GET, SET (us)" "$floor_usec" "$cell_usec"

echo
echo "time inside Redis per algorithm, usec_per_call: sent by serve (TG.CHECK; 2 cores shared by"
echo "redis-benchmark, serve and Redis), and the same call sent by redis-benchmark directly (as"
echo "redis-cell's and the floor's are measured); the script's FCALL, then the module's TOLLGATE.CHECK"
printf '  %-16s %10s %7s %10s %7s %12s %7s %10s %7s\n' "" "script" "x cell" "direct" "x cell" "module" "x cell" "direct" "x cell"
for algorithm in gcra token-bucket leaky-bucket fixed-window sliding-window sub-window sliding-log; do
  slices=(); [ "$algorithm" = sub-window ] && slices=(SLICES 10)
  redis-cli -p "$TG_REDIS" config resetstat >/dev/null
  rps "$SERVE_REDIS" TG.CHECK "$algorithm:__rand_int__" "$algorithm" 30 60000 "${slices[@]}" >/dev/null
  via=$(usec "$TG_REDIS" fcall)
  mapfile -t call < <(fcall_of TG.CHECK probe "$algorithm" 30 60000 "${slices[@]}")
  call=("${call[@]/#KEY/direct:$algorithm:__rand_int__}")
  redis-cli -p "$TG_REDIS" config resetstat >/dev/null
  rps "$TG_REDIS" "${call[@]}" >/dev/null
  direct=$(usec "$TG_REDIS" fcall)
  printf '  %-16s %7.2f us %6.2fx %7.2f us %6.2fx' "$algorithm" "$via" "$(ratio "$via" "$cell_usec")" \
    "$direct" "$(ratio "$direct" "$cell_usec")"
  # The module leaves the sliding log (a list it would have to read whole) to the script.
  if [ "$algorithm" = sliding-log ]; then printf '  %s\n' "(the script's)"; continue; fi
  redis-cli -p "$NATIVE_REDIS" config resetstat >/dev/null
  rps "$SERVE_NATIVE" TG.CHECK "$algorithm:__rand_int__" "$algorithm" 30 60000 "${slices[@]}" >/dev/null
  via=$(usec "$NATIVE_REDIS" tollgate.check)
  redis-cli -p "$NATIVE_REDIS" config resetstat >/dev/null
  rps "$NATIVE_REDIS" TOLLGATE.CHECK "${call[@]:3}" >/dev/null
  direct=$(usec "$NATIVE_REDIS" tollgate.check)
  printf ' %9.2f us %6.2fx %7.2f us %6.2fx\n' "$via" "$(ratio "$via" "$cell_usec")" "$direct" "$(ratio "$direct" "$cell_usec")"
done
