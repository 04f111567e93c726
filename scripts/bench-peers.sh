#!/usr/bin/env bash
# tollgate against every peer on its own ground, in one run, one table of ratios (tollgate ÷ peer):
#   - in-process, ns per check: against governor, every algorithm, 1 key and 100k keys (the
#     tollgate-store `memory` bench); against limitador's library (crates.io), its memory storage
#     and its Redis storage on a redis-server started here (bench/peers, a crate of its own);
#   - tower middleware overhead per request against tower_governor (the tollgate-tower bench);
#   - Envoy's gRPC ShouldRateLimit against limitador-server built from LIMITADOR_SRC (a checkout
#     of github.com/Kuadrant/limitador; it is on no registry), memory store and Redis: calls/s,
#     server CPU per call, Redis CPU per call (/proc) and Redis time in commands per call (INFO
#     commandstats);
#   - RESP against throttlecrab-server (cargo install) and redis-cell (its module from crates.io):
#     server CPU per decision and decisions/s at -P 1 and -P 16, one hot key and 100k random keys.
# Pairs run in alternating rounds (ROUNDS, default 3; medians). Equal work: same keys, same client,
# the limits translated (bench/peers/src/lib.rs, whose tests prove the translations decision by
# decision); every decision is counted, and a side admitting more than its limit allows in the
# time it ran is reported as OVER-GRANTS, errors as errors. A peer that cannot be built or run
# keeps its rows, which say why.
#   bash scripts/bench-peers.sh            (needs cargo with crates.io; installs redis-server,
#                                           protoc, libclang, pkg-config and librocksdb-dev with
#                                           apt-get when missing and root)
#   QUICK=1: fewer and shorter runs (a minute or two once built).
#   ONLY="grpc limitador": only those grounds (of governor, limitador, middleware, grpc, resp), and
#     only the peers they need built; the table has their rows.
#   LIMITADOR_SRC=path: limitador's checkout (built into $CARGO_TARGET_DIR/peers/limitador-target).
#   LIMITADOR_LIB_REDIS=0: limitador's library without its Redis storage (which links RocksDB).
#   ROCKSDB=system (the default): limitador's RocksDB is the system's library (librocksdb-dev,
#     found with pkg-config unless ROCKSDB_LIB_DIR names its directory), so librocksdb-sys only
#     generates its bindings (minutes); ROCKSDB=bundled compiles RocksDB's C++ sources bundled in
#     librocksdb-sys instead (over 40 minutes on two shared cores), at nice 19.
# Progress goes to stderr, the table to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
PEERS="$CARGO_TARGET_DIR/peers"
QUICK="${QUICK:-}"
ROUNDS="${ROUNDS:-3}"
if [ -n "$QUICK" ]; then
  SECONDS_EACH=2 RESP_N=50000 RESP_N_PIPELINED=200000
else
  SECONDS_EACH=5 RESP_N=200000 RESP_N_PIPELINED=1000000
fi
mkdir -p "$PEERS"
work=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
ROWS="$work/rows"
: > "$ROWS"

log() { echo "bench-peers: $*" >&2; }
# Whether a ground is to be measured (ONLY unset: every one).
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
# A tool, installed with apt-get when it is missing and we may.
need() { # COMMAND PACKAGE
  command -v "$1" >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing $2"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
  fi
  command -v "$1" >/dev/null
}
# A Debian package that installs no command (a library), installed when missing and we may.
need_package() { # PACKAGE
  dpkg -s "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing $1"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" >/dev/null
  fi
  dpkg -s "$1" >/dev/null 2>&1
}
for tool in redis-server:redis-server redis-cli:redis-tools python3:python3 bc:bc; do
  need "${tool%%:*}" "${tool#*:}" || { log "needs ${tool%%:*}"; exit 1; }
done

# One row of the table: LABEL TOLLGATE PEER RATIO GOAL NOTE (RATIO empty: TOLLGATE / PEER; GOAL
# `<=x`, `>=x` or `-`). A row that could not be measured: LABEL GOAL WHY.
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" "${5:--}" "${6:-}" >> "$ROWS"; }
missing() { row "$1" - - - "$2" "NOT MEASURED: $3"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { # PORT: until something accepts on it (10 s)
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  log "nothing listens on $1"; return 1
}
# CPU seconds (user + system) a process has used so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.4f\n", ($12 + $13) / hz }' "/proc/$1/stat"; }
# Microseconds Redis spent in commands so far (INFO commandstats, every command).
redis_usec() { redis-cli -p "$1" info commandstats | grep -o 'usec=[0-9]*' | cut -d= -f2 | awk '{ s += $1 } END { print s + 0 }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# The median of column COLUMN of FILE.
col() { awk -v c="$2" '{ print $c }' "$1" | median; } # FILE COLUMN
# A field of a `tollgate bench --json` file.
field() { python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))[sys.argv[2]]; print(0 if v is None else v)' "$1" "$2"; }
redis_server() { # PORT [ARGS...]: a redis-server in the background; prints its pid
  redis-server --port "$1" --save "" --appendonly no --daemonize no "${@:2}" >/dev/null 2>&1 &
  echo $!
}

# ---- builds ------------------------------------------------------------------------------------
log "building tollgate and bench/peers (release)"
cargo build --release -q -p tollgate
TOLLGATE="$CARGO_TARGET_DIR/release/tollgate"
# RocksDB, for limitador's disk storage: limitador 0.14's Redis storage (bench/peers'
# `limitador-redis`) compiles only with it, and limitador-server always has it. Nothing here opens
# a RocksDB database (the Redis storage uses the disk storage's module only to encode its keys),
# so the system's library serves: librocksdb-sys links it through ROCKSDB_LIB_DIR and compiles
# no C++ (Debian 12's RocksDB 7.8.3 links with the librocksdb-sys of limitador 0.14, 0.17.3+10.4.2,
# and of limitador-server's checkout, 0.16.0+8.10.0: their bindings are generated from their
# own headers, and only the functions called must exist). ROCKSDB=bundled compiles RocksDB instead.
# Either way both need libclang (librocksdb-sys's bindings).
[ -n "$(ls /usr/lib/llvm-*/lib/libclang.so* 2>/dev/null)" ] || need_package libclang-dev || true
ROCKSDB_USED="RocksDB bundled in librocksdb-sys"
BUILD_NICE=()
case "${ROCKSDB:-system}" in
  system)
    if [ -z "${ROCKSDB_LIB_DIR:-}" ]; then
      need pkg-config pkg-config || true
      pkg-config --exists rocksdb 2>/dev/null || need_package librocksdb-dev || true
      ROCKSDB_LIB_DIR=$(pkg-config --variable=libdir rocksdb 2>/dev/null || true)
    fi
    if [ -n "$ROCKSDB_LIB_DIR" ]; then
      export ROCKSDB_LIB_DIR
      ROCKSDB_USED="the system's RocksDB $(pkg-config --modversion rocksdb 2>/dev/null || echo "(ROCKSDB_LIB_DIR)")"
    else
      log "no system RocksDB (librocksdb-dev): compiling the bundled one"
      unset ROCKSDB_LIB_DIR
      BUILD_NICE=(nice -n 19)
    fi
    ;;
  bundled) unset ROCKSDB_LIB_DIR; BUILD_NICE=(nice -n 19) ;;
  *) log "ROCKSDB is system or bundled"; exit 1 ;;
esac
log "limitador on $ROCKSDB_USED"
# bench/peers (its own workspace, in the same target dir: tollgate-store's build is shared).
# Without limitador's Redis storage (LIMITADOR_LIB_REDIS=0, or a build that failed), the memory
# storage's comparison still runs and the Redis rows say why they are missing.
PEERS_TARGET="$CARGO_TARGET_DIR"
peers_build() { "${BUILD_NICE[@]}" cargo build --release -q --manifest-path bench/peers/Cargo.toml "$@"; }
if [ "${LIMITADOR_LIB_REDIS:-1}" = 0 ] || ! peers_build 2>"$work/peers-build.log"; then
  tail -5 "$work/peers-build.log" >&2 2>/dev/null || true
  log "bench/peers without limitador's Redis storage"
  peers_build --no-default-features
fi
PEERS_BIN="$PEERS_TARGET/release/tollgate-bench-peers"

THROTTLECRAB="$PEERS/bin/throttlecrab-server"
if wanted resp && [ ! -x "$THROTTLECRAB" ]; then
  log "installing throttlecrab-server"
  CARGO_TARGET_DIR="$PEERS/throttlecrab-target" cargo install -q --locked throttlecrab-server --root "$PEERS" \
    >"$work/throttlecrab.log" 2>&1 || tail -5 "$work/throttlecrab.log" >&2
fi
THROTTLECRAB_VERSION=$([ -x "$THROTTLECRAB" ] && "$THROTTLECRAB" --version 2>/dev/null | head -1 || echo "throttlecrab-server")

# redis-cell's module from its crate on crates.io (the newest published there), as
# bench-redis-cost.sh builds it.
CELL="$PEERS/redis-cell/libredis_cell.so"
if wanted resp && [ ! -f "$CELL" ]; then
  log "building redis-cell"
  mkdir -p "$work/fetch/src" "$PEERS/redis-cell"
  printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nredis-cell = "*"\n' > "$work/fetch/Cargo.toml"
  echo 'fn main() {}' > "$work/fetch/src/main.rs"
  if (cd "$work/fetch" && cargo fetch -q); then
    src=$(cd "$work/fetch" && cargo metadata --format-version 1 -q |
      python3 -c 'import json,sys; m=json.load(sys.stdin); print(next(p["manifest_path"] for p in m["packages"] if p["name"]=="redis-cell"))')
    rm -rf "$work/cell" && cp -r "$(dirname "$src")" "$work/cell"
    basename "$(dirname "$src")" > "$PEERS/redis-cell/version"
    (cd "$work/cell" && CARGO_TARGET_DIR="$PEERS/redis-cell/target" cargo build --release -q 2>/dev/null) &&
      cp "$PEERS/redis-cell/target/release/libredis_cell.so" "$CELL"
  fi
fi
CELL_VERSION=$(cat "$PEERS/redis-cell/version" 2>/dev/null || echo "redis-cell")

# limitador-server from a checkout (LIMITADOR_SRC), with its own release profile (LTO); it needs
# protoc, and RocksDB as above.
LIMITADOR=""
LIMITADOR_WHY="LIMITADOR_SRC unset (a checkout of github.com/Kuadrant/limitador builds limitador-server)"
if [ -n "${LIMITADOR_SRC:-}" ] && wanted grpc; then
  LIMITADOR_WHY="limitador-server did not build from $LIMITADOR_SRC (see the log above)"
  need protoc protobuf-compiler || true
  # An older system RocksDB may lack a function that limitador-server's bindings reference and
  # it never calls: Debian 12's 7.8.3 has no rocksdb_write_buffer_manager_destroy (RocksDB 8),
  # referenced by the drop of rocksdb's Options; but a write buffer manager is only ever made by
  # rocksdb_write_buffer_manager_create*, which nothing in limitador-server calls (the linker
  # finds no reference to them), so none is ever destroyed. Such a function is linked as one
  # that aborts (were it ever called, the server would stop, not misbehave), from an object kept
  # under the target dir (the same path every run: the build stays fresh).
  link_args=()
  if [ -n "${ROCKSDB_LIB_DIR:-}" ] &&
    ! nm -D --defined-only "$ROCKSDB_LIB_DIR/librocksdb.so" 2>/dev/null | grep -qw rocksdb_write_buffer_manager_destroy; then
    log "the system's RocksDB has no rocksdb_write_buffer_manager_destroy: linked as abort (never called)"
    printf '#include <stdlib.h>\nvoid rocksdb_write_buffer_manager_destroy(void *manager) { (void)manager; abort(); }\n' \
      >"$PEERS/rocksdb-missing.c"
    cc -c -O2 -fPIC -o "$PEERS/rocksdb-missing.o" "$PEERS/rocksdb-missing.c"
    link_args=(-C "link-arg=$PEERS/rocksdb-missing.o")
  fi
  log "building limitador-server from $LIMITADOR_SRC"
  if (cd "$LIMITADOR_SRC" && CARGO_TARGET_DIR="$PEERS/limitador-target" "${BUILD_NICE[@]}" cargo rustc --release -q --locked \
      -p limitador-server --bin limitador-server -- "${link_args[@]}" >"$work/limitador.log" 2>&1); then
    LIMITADOR="$PEERS/limitador-target/release/limitador-server"
  else
    tail -20 "$work/limitador.log" >&2
  fi
  LIMITADOR_VERSION="limitador-server $(git -C "$LIMITADOR_SRC" rev-parse --short HEAD 2>/dev/null || echo "($LIMITADOR_SRC)")"
fi

REDIS_PORT=$(free_port)
REDIS_PID=$(redis_server "$REDIS_PORT"); PIDS+=("$REDIS_PID")
wait_port "$REDIS_PORT"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- in-process: governor (the tollgate-store bench) --------------------------------------------
if wanted governor; then
log "in-process against governor (cargo bench -p tollgate-store --bench memory)"
if SUMMARY_ONLY=1 cargo bench -q -p tollgate-store --bench memory >"$work/memory.txt" 2>"$work/memory.err"; then
  # Rows `algorithm  ns (ratiox)  ns (ratiox) …`: the 1-thread columns (1 key, 100k keys).
  python3 - "$work/memory.txt" >>"$ROWS" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("Summary:", 1)[1].splitlines()
governor = next(l.split()[1:] for l in lines if l.startswith("governor"))
for line in lines:
    cells = re.findall(r"([\d.]+) \(([\d.]+)x\)", line)
    if not cells:
        continue
    algorithm = line.split()[0]
    fast = algorithm not in ("sliding-log", "sub-window")
    for column, (keys, goal) in enumerate([("1 key", "<=0.8" if fast else "-"), ("100k keys", "<=0.6" if fast else "<=1.0")]):
        ours, ratio = cells[column]
        print(f"in-process vs governor, {algorithm}, {keys}, 1 thread: ns per check\t{ours}\t{governor[column]}\t{ratio}\t{goal}\t")
PY
else
  tail -5 "$work/memory.err" >&2
  missing "in-process vs governor (every algorithm)" "<=0.8" "the tollgate-store memory bench failed"
fi
fi # governor

# ---- in-process: limitador's library (bench/peers) ----------------------------------------------
if wanted limitador; then
log "in-process against limitador's library, memory and Redis storage"
quick_flag=(); [ -n "$QUICK" ] && quick_flag=(--quick)
"$PEERS_BIN" memory "${quick_flag[@]}" >>"$ROWS" 2>"$work/peers.err" ||
  missing "in-process vs limitador (memory)" "<=0.5" "$(tail -1 "$work/peers.err")"
"$PEERS_BIN" redis "redis://127.0.0.1:$REDIS_PORT" "$REDIS_PID" "${quick_flag[@]}" >>"$ROWS" 2>"$work/peers.err" ||
  missing "in-process vs limitador (Redis)" "<=0.5" "$(tail -1 "$work/peers.err")"
fi # limitador

# ---- middleware: tower_governor (the tollgate-tower bench) --------------------------------------
if wanted middleware; then
log "middleware against tower_governor (cargo bench -p tollgate-tower --bench middleware)"
if SUMMARY_ONLY=1 cargo bench -q -p tollgate-tower --bench middleware >"$work/middleware.txt" 2>"$work/middleware.err"; then
  python3 - "$work/middleware.txt" >>"$ROWS" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
ours = float(re.search(r"tollgate \+([\d.]+) ns", text).group(1))
theirs = float(re.search(r"tower_governor \+([\d.]+) ns", text).group(1))
measured = float(re.search(r"rates measured \+([\d.]+) ns", text).group(1))
print(f"middleware vs tower_governor: overhead ns per request\t{ours}\t{theirs}\t\t<=1.0\t")
print(f"middleware vs tower_governor, rates measured: overhead ns per request\t{measured}\t{theirs}\t\t<=1.5\t")
PY
else
  tail -5 "$work/middleware.err" >&2
  missing "middleware vs tower_governor" "<=1.0" "the tollgate-tower middleware bench failed"
fi
fi # middleware

# ---- Envoy gRPC: limitador-server ---------------------------------------------------------------
if wanted grpc; then
# Both servers: one descriptor `user`, 1e9 per second (every call admitted: denials or errors are
# faults), 10,000 keys, one HTTP/2 connection with 64 streams (as Envoy sends them).
cat > "$work/envoy.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
YAML
cat > "$work/limitador.yaml" <<'YAML'
- namespace: bench
  max_value: 1000000000
  seconds: 1
  conditions: []
  variables: ["descriptors[0].user"]
YAML
# One gRPC run against PORT, CPU of SERVER_PID (and of Redis on redis stores): appends to FILE
# "calls/s server_us redis_us redis_cmd_us faults".
grpc_run() { # PORT SERVER_PID FILE
  local s0 r0 u0 s1 r1 u1 json="$work/grpc.json"
  s0=$(cpu "$2"); r0=$(cpu "$REDIS_PID"); u0=$(redis_usec "$REDIS_PORT")
  "$TOLLGATE" bench grpc --addr "127.0.0.1:$1" --domain bench --descriptor 'user={key}' --key-prefix u \
    --keys 10000 -c 1 -P 64 --duration "${SECONDS_EACH}s" -q --json "$json" >/dev/null
  s1=$(cpu "$2"); r1=$(cpu "$REDIS_PID"); u1=$(redis_usec "$REDIS_PORT")
  local n errors denied
  n=$(field "$json" requests); errors=$(field "$json" errors); denied=$(field "$json" denied)
  echo "$(field "$json" throughput_per_s) $(echo "($s1 - $s0) * 1000000 / $n" | bc -l)" \
    "$(echo "($r1 - $r0) * 1000000 / $n" | bc -l) $(echo "($u1 - $u0) / $n" | bc -l) $((errors + denied))" >> "$3"
}
faults() { awk '{ s += $5 } END { print s + 0 }' "$1"; }
grpc_rows() { # STORE_NAME
  local ours="$work/grpc-tollgate" theirs="$work/grpc-limitador" what="gRPC vs limitador-server ($1)"
  local note="every call admitted, no errors"
  if [ "$(faults "$ours")" != 0 ] || [ "$(faults "$theirs")" != 0 ]; then
    note="FAULTS: errors or denials (every call should be admitted): $(faults "$ours") / $(faults "$theirs")"
  fi
  row "$what: calls/s" "$(col "$ours" 1)" "$(col "$theirs" 1)" "" ">=1.5" "$note"
  row "$what: server CPU us per call" "$(col "$ours" 2)" "$(col "$theirs" 2)" "" "<=0.6"
  if [ "$1" = redis ]; then
    row "$what: Redis CPU us per call (/proc)" "$(col "$ours" 3)" "$(col "$theirs" 3)" "" "<=1.0"
    row "$what: Redis time in commands us per call (commandstats)" "$(col "$ours" 4)" "$(col "$theirs" 4)" "" "<=1.0"
  fi
}
for store in memory redis; do
  if [ -z "$LIMITADOR" ]; then
    missing "gRPC vs limitador-server ($store): calls/s, server and Redis CPU per call" "<=0.6" "$LIMITADOR_WHY"
    continue
  fi
  log "gRPC against limitador-server, $store"
  url=memory; their_store=(memory)
  if [ "$store" = redis ]; then url="redis://127.0.0.1:$REDIS_PORT"; their_store=(redis "$url"); fi
  grpc_ours=$(free_port); grpc_theirs=$(free_port); http_theirs=$(free_port)
  "$TOLLGATE" serve --resp 127.0.0.1:0 --http 127.0.0.1:0 --grpc "127.0.0.1:$grpc_ours" --store "$url" \
    --envoy-config "$work/envoy.yaml" --log-level warn >"$work/serve-grpc.log" 2>&1 &
  ours_pid=$!; PIDS+=("$ours_pid")
  "$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$grpc_theirs" --http-ip 127.0.0.1 --http-port "$http_theirs" \
    "$work/limitador.yaml" "${their_store[@]}" >"$work/limitador-$store.log" 2>&1 &
  theirs_pid=$!; PIDS+=("$theirs_pid")
  if wait_port "$grpc_ours" && wait_port "$grpc_theirs"; then
    rm -f "$work/grpc-tollgate" "$work/grpc-limitador"
    # Warm-up (connections, scripts loaded), then the rounds.
    grpc_run "$grpc_ours" "$ours_pid" /dev/null; grpc_run "$grpc_theirs" "$theirs_pid" /dev/null
    for _ in $(seq "$ROUNDS"); do
      grpc_run "$grpc_ours" "$ours_pid" "$work/grpc-tollgate"
      grpc_run "$grpc_theirs" "$theirs_pid" "$work/grpc-limitador"
    done
    grpc_rows "$store"
  else
    tail -5 "$work/limitador-$store.log" >&2
    missing "gRPC vs limitador-server ($store)" "<=0.6" "a server did not start (see its log)"
  fi
  kill "$ours_pid" "$theirs_pid" 2>/dev/null || true
  wait "$ours_pid" "$theirs_pid" 2>/dev/null || true
done
fi # grpc

# ---- RESP: throttlecrab-server and redis-cell ---------------------------------------------------
if wanted resp; then
# GCRA, a burst of 16, 30 per 60 s, on every side: tollgate's CL.THROTTLE (the memory store),
# throttlecrab's THROTTLE, redis-cell's CL.THROTTLE (the same command line as tollgate's).
BURST=16 COUNT=30 PERIOD=60
mapfile -t commands < <("$PEERS_BIN" commands "$BURST" "$COUNT" "$PERIOD")
CMD_TOLLGATE=${commands[0]} CMD_THROTTLECRAB=${commands[1]} CMD_CELL=${commands[0]}
RESP_OURS=$(free_port)
"$TOLLGATE" serve --resp "127.0.0.1:$RESP_OURS" --http 127.0.0.1:0 --grpc 127.0.0.1:0 --log-level warn \
  >"$work/serve-resp.log" 2>&1 &
RESP_OURS_PID=$!; PIDS+=("$RESP_OURS_PID")
wait_port "$RESP_OURS"
RESP_CRAB="" RESP_CRAB_PID=""
if [ -x "$THROTTLECRAB" ]; then
  RESP_CRAB=$(free_port)
  "$THROTTLECRAB" --redis --redis-host 127.0.0.1 --redis-port "$RESP_CRAB" --store-capacity 4000000 --log-level warn \
    >"$work/throttlecrab.log" 2>&1 &
  RESP_CRAB_PID=$!; PIDS+=("$RESP_CRAB_PID")
  wait_port "$RESP_CRAB" || RESP_CRAB=""
fi
RESP_CELL="" RESP_CELL_PID=""
if [ -f "$CELL" ]; then
  RESP_CELL=$(free_port)
  RESP_CELL_PID=$(redis_server "$RESP_CELL" --loadmodule "$CELL"); PIDS+=("$RESP_CELL_PID")
  wait_port "$RESP_CELL" || RESP_CELL=""
fi
# One RESP run: PORT PID COMMAND KEYS DEPTH FILE, appending "decisions/s cpu_us_per_decision fault".
# The fault: errors, or more admitted than the limit allows over the keys touched in the time
# the run took (each key: the burst, plus COUNT per PERIOD elapsed, plus one for rounding).
resp_run() {
  local port=$1 pid=$2 command=$3 keys=$4 depth=$5 file=$6 json="$work/resp.json" n c0 c1 t0 t1
  n=$RESP_N; [ "$depth" -gt 1 ] && n=$RESP_N_PIPELINED
  c0=$(cpu "$pid"); t0=$(date +%s.%N)
  "$TOLLGATE" bench resp --addr "127.0.0.1:$port" --command "$command" --key-prefix "k$RANDOM:" --keys "$keys" \
    -c 50 -P "$depth" -n "$n" -q --json "$json" >/dev/null
  c1=$(cpu "$pid"); t1=$(date +%s.%N)
  python3 - "$json" "$c0" "$c1" "$t0" "$t1" "$keys" "$BURST" "$COUNT" "$PERIOD" >> "$file" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
c0, c1, t0, t1 = map(float, sys.argv[2:6])
keys, burst, count, period = map(int, sys.argv[6:10])
n = r["requests"]
allowed = r["allowed"]
touched = min(keys, n)
bound = touched * (burst + math.ceil(count * (t1 - t0) / period) + 1)
fault = "-"
if allowed is None:
    fault = "no-decisions"
elif r["errors"]:
    fault = f"errors:{r['errors']}"
elif allowed > bound:
    fault = f"OVER-GRANTS:{allowed}>{bound}"
print(f"{r['throughput_per_s']:.0f} {(c1 - c0) * 1e6 / n:.3f} {fault}")
PY
}
resp_note() { awk '$3 != "-" { print $3 }' "$@" | sort -u | tr '\n' ' '; }
for depth in 1 16; do
  for keys in 1 100000; do
    label="hot key"; [ "$keys" -gt 1 ] && label="100k random keys"
    log "RESP -P $depth, $label"
    rm -f "$work"/resp-*
    for _ in $(seq "$ROUNDS"); do
      resp_run "$RESP_OURS" "$RESP_OURS_PID" "$CMD_TOLLGATE" "$keys" "$depth" "$work/resp-tollgate"
      [ -n "$RESP_CRAB" ] && resp_run "$RESP_CRAB" "$RESP_CRAB_PID" "$CMD_THROTTLECRAB" "$keys" "$depth" "$work/resp-crab"
      [ -n "$RESP_CELL" ] && resp_run "$RESP_CELL" "$RESP_CELL_PID" "$CMD_CELL" "$keys" "$depth" "$work/resp-cell"
    done
    ours="$work/resp-tollgate"
    for peer in crab cell; do
      name=throttlecrab-server goal="<=0.5"
      if [ "$peer" = cell ]; then name=redis-cell; goal=$([ "$depth" = 1 ] && echo "<=0.6" || echo "-"); fi
      what="RESP vs $name, -P $depth, $label"
      if [ ! -s "$work/resp-$peer" ]; then
        missing "$what" "$goal" "$name could not be built or started"
        continue
      fi
      row "$what: server CPU us per decision" "$(col "$ours" 2)" "$(col "$work/resp-$peer" 2)" "" "$goal" \
        "$(resp_note "$ours" "$work/resp-$peer")"
      row "$what: decisions/s" "$(col "$ours" 1)" "$(col "$work/resp-$peer" 1)" "" "-"
    done
  done
done
fi # resp

# ---- the table ----------------------------------------------------------------------------------
echo "tollgate $(git rev-parse --short HEAD) against its peers; $ROUNDS rounds, medians; $(nproc) cores;" \
  "load average $LOAD_BEFORE before, $(cut -d' ' -f1-3 /proc/loadavg) after${QUICK:+; QUICK}${ONLY:+; only $ONLY}"
echo "peers: governor, tower_governor (bench dependencies), limitador $(grep -A1 '^name = "limitador"$' \
  bench/peers/Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p') (crates.io), ${LIMITADOR_VERSION:-limitador-server (not built)}, $ROCKSDB_USED," \
  "$THROTTLECRAB_VERSION, $CELL_VERSION, $(redis-server --version | cut -d' ' -f3)"
python3 - "$ROWS" <<'PY'
import sys
print(f"{'':<92} {'tollgate':>11} {'peer':>11} {'ratio':>7} {'goal':>7}  verdict")
for line in open(sys.argv[1]):
    label, ours, theirs, ratio, goal, note = (line.rstrip("\n").split("\t") + [""] * 6)[:6]
    if ours == "-":
        print(f"{label:<92} {'-':>11} {'-':>11} {'-':>7} {goal:>7}  {note}")
        continue
    ours, theirs = float(ours), float(theirs)
    ratio = float(ratio) if ratio else (ours / theirs if theirs else float("inf"))
    verdict = "-"
    if goal.startswith("<="):
        verdict = "meets" if ratio <= float(goal[2:]) else "misses"
    elif goal.startswith(">="):
        verdict = "meets" if ratio >= float(goal[2:]) else "misses"
    if any(fault in note for fault in ("OVER-GRANTS", "FAULTS", "ERRORS", "errors:", "no-decisions")):
        verdict += " (faults)"
    print(f"{label:<92} {ours:>11.2f} {theirs:>11.2f} {ratio:>6.2f}x {goal:>7}  {verdict}{'  ' + note if note else ''}")
PY
