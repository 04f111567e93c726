#!/usr/bin/env bash
# Failure injection: a Redis primary killed (SIGKILL) under open-loop load, and restarted, for
# every algorithm and every failure policy (--on-store-error), in one of three topologies
# (--topology; scripts/failure-injection/topology.sh):
#
# cluster (default): 3 redis-server primaries on free loopback ports, no replicas, AOF on (fsync
#   every second; SIGKILL loses nothing the kernel has), cluster-require-full-coverage no (the
#   other primaries keep serving their slots), --cluster-node-timeout 2000 ms. Nothing takes the
#   killed primary's slots over: its keys are unavailable for the whole outage, and again for 2 s
#   after the restart (a restarted primary answers CLUSTERDOWN until its rejoin delay,
#   CLUSTER_WRITABLE_DELAY, has passed). It restarts with its nodes.conf and AOF: it owns the same
#   slots, with its data (less the keys whose TTL ran out meanwhile).
# replicas: 3 primaries + 3 replicas, --cluster-node-timeout 1000 ms: the killed primary's replica
#   is promoted by the cluster (about 2 s after the kill); the killed node restarts as its replica.
# sentinel: a primary, a replica and 3 Sentinels (quorum 2, down-after-milliseconds 1000,
#   failover-timeout 2000): the Sentinels promote the replica; the killed node restarts and they
#   make it a replica. Every key lives on the one primary.
#
# Per policy and algorithm: a fresh `tollgate serve --store redis+cluster://...` (or
# redis+sentinel://.../tollgate; defaults: --store-timeout 50ms, breaker after 3 failures, probe
# every 100 ms) and three `tollgate bench resp` processes, one per key group, each at RATE/3
# requests/s over KEYS/3 keys hash-tagged onto one primary's slots ("{tag}:N", stored as
# tollgate:ALGORITHM:t:{tag}:N). At DURATION/3 the primary of the second group is killed with
# SIGKILL; at 2*DURATION/3 it is started again on its port with its files.
# Every limit is 10 per 1 s (burst 10 for the bucket family, 10 slices for the sub-window counter),
# via TG.CHECK (CL.THROTTLE KEY 9 10 1 1 for gcra); by default every key is offered 50 requests/s,
# 5 times its limit.
#
# The table, one row per policy and algorithm:
#   sent, answered, errors  requests bench issued (open loop: exactly rate x duration), those
#       answered with a decision, those without a valid reply (error reply, broken connection, no
#       reply within 2 s). The run fails if sent != answered + errors, if fewer were sent than were
#       due, or if serve's own count of decisions (tollgate_decisions_total) is not between
#       answered and answered + errors: a request lost.
#   fallbacks (breaker)  tollgate_store_fallbacks_total: calls the failure policy answered; and
#       tollgate_store_breaker_opened_total: how often the circuit breaker opened.
#   p99 ms before/during/after  the worst per-second p99 (bench's timeline: latency from each
#       request's intended send time; worst of the three bench processes) among the seconds
#       before the kill (the first second, connections being made, left out), the seconds that
#       overlap the outage (kill to restart), and the seconds after the restart.
#   admitted / bound  allowed decisions, and the most the algorithm admits over the run (from
#       bench's start to its end, on this host's clock, which is Redis's TIME), summed over keys:
#         gcra, token-bucket, leaky-bucket   burst + floor(span / T), T = period / count
#         fixed-window, sliding-window       count x epoch-aligned windows touched
#         sliding-log                        count x (floor(span / period) + 1)
#         sub-window                         count x ceil(slices touched / slices)
#   killed keys  what the killed primary's keys were admitted, in % of their bound.
#   others keys  the other primaries' keys (healthy throughout): what they were admitted per
#       second while the killed primary's keys were the failure policy's (from the kill until
#       they are back, at least 3 s), in % of what they were before it ("-" with Sentinel, where
#       every key lives on the killed primary).
#   over-grant killed/others  what each key was admitted over its own bound (bench's
#       allowed_per_key), summed over the killed primary's keys and over the others' (a key over
#       its bound is never made good by another under it).
#   recovery s redis/fallbacks/rate  cluster: from the restarted primary answering PING, until it
#       serves (its cluster_state:ok, polled every 50 ms). replicas, sentinel: from the kill until
#       Redis promoted a replica (it serves the slots with cluster_state:ok everywhere, or the
#       Sentinels name it and it says it is a primary; polled every 20 ms). Then, from that
#       instant (PING, or the promotion): until serve's last fallback (the counter sampled every
#       100 ms) or the end of the last second with a bench error, if later; until the start of
#       the first second from which the killed primary's keys are admitted, in every full second
#       to the end, at least 90% of what they were in the median second before the kill.
#       "never": not by the run's end.
#
# The run fails (non-zero) if a request is lost, serve dies or the load generator fails, with
# replicas or Sentinel if tollgate still falls back at the end of a run (it did not follow the
# promotion), and with --strict also if it falls short of docs/failure.md, "Failure behaviour" (without
# --strict such runs are listed under the table, and in strict.txt): closed or local admits a key
# more than its bound; open admits a healthy key more than its bound; closed admits the healthy
# keys less than 98% of what they were admitted before the kill, during the outage; local's rate on the killed keys
# is not back within 1 s of Redis serving them again (the rate column, less the redis column
# without replicas); a breaker opens more than twice for the one kill. Every process it started
# is stopped on exit.
# Files (--out DIR, default a temporary directory, printed): table.txt, results.tsv,
# strict.txt, timeline.svg (every run: admitted and fallbacks per second
# from serve's metrics, the outage, p99); per run, POLICY-ALGORITHM/: each bench process's JSON,
# timeline CSV and SVG plot (nodeN.*), serve's log, its metrics every 100 ms (metrics.tsv:
# t_ns fallbacks backend_errors breaker_open breaker_opened store_errors allowed denied debts
# charges_paid) and at the end, and the instants of the kill and the restart (events.txt).
#
#   bash scripts/failure-injection.sh [--topology cluster|replicas|sentinel] [--short] [--out DIR]
#        [--binary TOLLGATE] [--algorithms "gcra ..."] [--policies "open ..."] [--duration S]
#        [--kill-at S] [--restart-at S] [--rate R] [--keys K] [--node-timeout MS] [--strict]
#        [-- SERVE FLAGS...]
#   default: 7 algorithms x 3 policies, 30 s each (kill at 10 s, restart at 20 s), 1500
#   requests/s over 30 keys: about 15 minutes. --short (CI): gcra and fixed-window x 3 policies,
#   8 s each (kill at 2 s, restart at 4 s), --node-timeout 500 (with replicas or Sentinel: 10 s
#   each, restart at 6 s, --node-timeout 1000): about 1 minute. --node-timeout is the cluster's
#   cluster-node-timeout or the Sentinels' down-after-milliseconds. --binary skips the release
#   build. Needs redis-server and redis-cli (7.x), curl and awk.
set -euo pipefail
CALLER=$PWD
cd "$(dirname "$0")/.."
HERE=scripts/failure-injection

DURATION=30 RATE=1500 KEYS=30 NODE_TIMEOUT='' OUT='' KILL_AT='' RESTART_AT='' BIN='' STRICT=0 TOPOLOGY=cluster
EVERY_ALGORITHM="gcra token-bucket leaky-bucket fixed-window sliding-log sliding-window sub-window"
ALGORITHMS=$EVERY_ALGORITHM
POLICIES="open closed local"
SERVE_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --short) DURATION=8 KILL_AT=2 RESTART_AT=4 SHORT=1 ALGORITHMS="gcra fixed-window"; shift ;;
    --out) OUT=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --kill-at) KILL_AT=$2; shift 2 ;;
    --restart-at) RESTART_AT=$2; shift 2 ;;
    --binary) BIN=$2; shift 2 ;;
    --strict) STRICT=1; shift ;;
    --rate) RATE=$2; shift 2 ;;
    --keys) KEYS=$2; shift 2 ;;
    --algorithms) ALGORITHMS=$2; shift 2 ;;
    --policies) POLICIES=$2; shift 2 ;;
    --node-timeout) NODE_TIMEOUT=$2; shift 2 ;;
    --topology) TOPOLOGY=$2; shift 2 ;;
    --) shift; SERVE_FLAGS=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
KILL_AT=${KILL_AT:-$((DURATION / 3))} RESTART_AT=${RESTART_AT:-$((2 * DURATION / 3))}
# --short with replicas or Sentinel: 10 s runs, restart at 6 s (Redis's own failover takes 2-3 s).
if [ "${SHORT:-0}" = 1 ] && [ "$TOPOLOGY" != cluster ]; then DURATION=10 RESTART_AT=6; fi
case "$TOPOLOGY" in
  cluster) NODE_TIMEOUT=${NODE_TIMEOUT:-$([ "${SHORT:-0}" = 1 ] && echo 500 || echo 2000)} ;;
  replicas | sentinel) NODE_TIMEOUT=${NODE_TIMEOUT:-1000} ;;
  *) echo "unknown topology $TOPOLOGY (cluster, replicas, sentinel)" >&2; exit 2 ;;
esac
# --out and --binary are relative to the caller's directory.
case "$OUT" in "" | /*) ;; *) OUT="$CALLER/$OUT" ;; esac
case "$BIN" in "" | /*) ;; *) BIN="$CALLER/$BIN" ;; esac
for n in "$DURATION" "$RATE" "$KEYS" "$NODE_TIMEOUT" "$KILL_AT" "$RESTART_AT"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "--duration, --rate, --keys, --node-timeout, --kill-at, --restart-at take positive integers, got $n" >&2; exit 2; }
done
[ "$KILL_AT" -lt "$RESTART_AT" ] && [ "$RESTART_AT" -lt "$DURATION" ] || { echo "need 0 < --kill-at < --restart-at < --duration (s)" >&2; exit 2; }
[ $((RATE % 3)) -eq 0 ] && [ $((KEYS % 3)) -eq 0 ] || { echo "--rate and --keys must be multiples of 3 (one third per primary)" >&2; exit 2; }
for policy in $POLICIES; do
  case "$policy" in open | closed | local) ;; *) echo "unknown policy $policy (open, closed, local)" >&2; exit 2 ;; esac
done
for algorithm in $ALGORITHMS; do
  [[ " $EVERY_ALGORITHM " == *" $algorithm "* ]] || { echo "unknown algorithm $algorithm ($EVERY_ALGORITHM)" >&2; exit 2; }
done
for tool in redis-server redis-cli curl awk; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install -y redis-server curl)" >&2; exit 1; }
done

if [ -z "$BIN" ]; then
  cargo build --release -q -p tollgate
  BIN="${CARGO_TARGET_DIR:-target}/release/tollgate"
fi
TOLLGATE=$BIN
[ -x "$TOLLGATE" ] || { echo "no tollgate binary at $TOLLGATE" >&2; exit 1; }
"$TOLLGATE" bench resp --help >/dev/null 2>&1 || { echo "$TOLLGATE has no 'bench resp' subcommand" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-failure-injection.XXXXXX")
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# NODE_PIDS: the redis-server processes; NODE_JOBS: the subshells that wait for them (so that a
# SIGKILL is no "Killed" job notice from this shell).
NODE_PORTS=() NODE_PIDS=() NODE_JOBS=() SENTINEL_PIDS=() SENTINEL_JOBS=() SERVE_PID='' SAMPLER_PID='' BENCH_PIDS=()
cleanup() {
  local pid
  for pid in "${BENCH_PIDS[@]}" $SAMPLER_PID $SERVE_PID "${NODE_PIDS[@]}" "${SENTINEL_PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${BENCH_PIDS[@]}" $SAMPLER_PID $SERVE_PID "${NODE_JOBS[@]}" "${SENTINEL_JOBS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK/redis" "$WORK/cluster-create.log"
  rmdir "$WORK" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "failure-injection: $*" >&2; exit 1; }
now_ns() { date +%s%N; }
# Sleeps until the wall-clock instant $1 (ns since the epoch); at once if it is past.
sleep_until() {
  local ms=$(( ($1 - $(now_ns)) / 1000000 ))
  [ "$ms" -gt 0 ] && sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
  return 0
}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- the topology -------------------------------------------------------------------------------
source "$HERE/topology.sh"
setup_topology

# --- one run ------------------------------------------------------------------------------------
# The command selecting the algorithm; every limit is 10 per 1000 ms.
command_for() {
  case "$1" in
    gcra) echo "CL.THROTTLE {key} 9 10 1 1" ;;
    token-bucket | leaky-bucket) echo "TG.CHECK {key} $1 10 1000 BURST 10" ;;
    sub-window) echo "TG.CHECK {key} $1 10 1000 SLICES 10" ;;
    fixed-window | sliding-log | sliding-window) echo "TG.CHECK {key} $1 10 1000" ;;
    *) fail "unknown algorithm $1" ;;
  esac
}
# The most one key may be admitted between $2 and $3 (ns since the epoch) under algorithm $1.
bound_per_key() {
  local span=$(( $3 - $2 )) period=1000000000 count=10 burst=10 slices=10
  local t=$(( period / count ))
  case "$1" in
    gcra | token-bucket | leaky-bucket) echo $(( burst + span / t )) ;;
    fixed-window | sliding-window) echo $(( count * ($3 / period - $2 / period + 1) )) ;;
    sliding-log) echo $(( count * (span / period + 1) )) ;;
    sub-window)
      local slice=$(( period / slices ))
      local touched=$(( $3 / slice - $2 / slice + 1 ))
      echo $(( count * ((touched + slices - 1) / slices) )) ;;
  esac
}
# A number from bench's JSON ("null" when absent or null).
json_num() { awk -v key="\"$2\"" '{ s = s $0 } END {
  i = index(s, key); if (!i) { print "null"; exit }
  s = substr(s, i + length(key)); sub(/^[ \t\r\n]*:[ \t\r\n]*/, "", s); match(s, /^(-?[0-9.eE+]+|null)/)
  print (RSTART ? substr(s, 1, RLENGTH) : "null") }' "$1"; }
# What bench's keys were admitted over `bound` each (its allowed_per_key): the sum of the
# excesses, then the most over on one key.
over_per_key() { awk -v bound="$2" '{ s = s $0 } END {
  i = index(s, "\"allowed_per_key\""); if (!i) { print "null null"; exit }
  s = substr(s, i); s = substr(s, index(s, "[") + 1); s = substr(s, 1, index(s, "]") - 1)
  n = split(s, v, /[ \t\r\n,]+/); sum = 0; most = 0
  for (k = 1; k <= n; k++) if (v[k] != "") { o = v[k] - bound; if (o > 0) { sum += o; if (o > most) most = o } }
  print sum, most }' "$1"; }
# serve's metrics every 100 ms: t_ns fallbacks backend_errors breaker_open breaker_opened
# store_errors allowed denied debts charges_paid
sampler() {
  while :; do
    local t
    t=$(now_ns)
    curl -s --max-time 1 "$1" 2>/dev/null | awk -v t="$t" -f "$HERE/metrics.awk" >>"$2" || true
    sleep 0.1
  done
}
start_serve() {
  local policy=$1 log=$2
  : >"$log"
  "$TOLLGATE" serve --resp 127.0.0.1:0 --http 127.0.0.1:0 --grpc 127.0.0.1:0 --store "$STORE" \
    --on-store-error "$policy" --log-level info ${SERVE_FLAGS[@]+"${SERVE_FLAGS[@]}"} >"$log" 2>&1 &
  SERVE_PID=$!
  RESP_ADDR='' HTTP_ADDR=''
  for _ in $(seq 200); do
    RESP_ADDR=$(sed -n 's/.*RESP listening on \([0-9.:]*\).*/\1/p' "$log")
    HTTP_ADDR=$(sed -n 's/.*HTTP listening on \([0-9.:]*\).*/\1/p' "$log")
    [ -n "$RESP_ADDR" ] && [ -n "$HTTP_ADDR" ] && break
    kill -0 "$SERVE_PID" 2>/dev/null || fail "tollgate serve exited at start: $(cat "$log")"
    sleep 0.05
  done
  [ -n "$RESP_ADDR" ] && [ -n "$HTTP_ADDR" ] || fail "tollgate serve did not listen within 10 s ($log)"
  # The store up (health probes every second) before the load starts.
  for _ in $(seq 100); do
    curl -s "http://$HTTP_ADDR/healthz" | grep -q '"state":"up"' && return
    sleep 0.1
  done
  fail "tollgate serve's store was not up within 10 s: $(curl -s "http://$HTTP_ADDR/healthz")"
}
serve_alive() {
  kill -0 "$SERVE_PID" 2>/dev/null || fail "tollgate serve died during the run: $(tail -3 "$1")"
}
stop_serve() {
  kill "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true; SERVE_PID=''
}

RESULTS="$OUT/results.tsv"
rm -f "$OUT/strict.txt"
printf 'policy\talgorithm\tsent\tanswered\terrors\tfallbacks\tbreaker_opened\tp99_before_us\tp99_during_us\tp99_after_us\tadmitted\tbound\tover_killed\tover_others\tredis_ready_ms\tno_fallbacks_ms\trate_back_ms\tkilled_keys_admitted\tkilled_keys_bound\tother_keys_per_s_before_x100\tother_keys_per_s_after_x100\n' >"$RESULTS"
RUN=0
run() {
  local policy=$1 algorithm=$2
  RUN=$((RUN + 1))
  local dir="$OUT/$policy-$algorithm"
  mkdir -p "$dir"
  wait_topology_ok
  read_primaries
  # Key group 1's primary is killed (every group's, with Sentinel: there is one primary).
  VICTIM=${PRIMARIES[1]} VICTIM_SLOTS=${SLOTS[1]:-}
  local cmd groups=(0 1 2) tags=() i
  cmd=$(command_for "$algorithm")
  for i in "${groups[@]}"; do
    tags[i]=$(tag_on "$i" "r${RUN}n${i}x")
    [ -n "${tags[$i]}" ] || fail "no hash tag found for key group $i"
  done
  start_serve "$policy" "$dir/serve.log"
  # serve's connections to every primary made before the load (a peek: no state, nothing consumed).
  for i in "${groups[@]}"; do
    redis-cli -h "${RESP_ADDR%:*}" -p "${RESP_ADDR##*:}" TG.PEEK "{${tags[$i]}}:warm-up" gcra 10 1000 >/dev/null \
      || fail "serve did not answer TG.PEEK ($dir/serve.log)"
  done
  : >"$dir/metrics.tsv"
  sampler "http://$HTTP_ADDR/metrics" "$dir/metrics.tsv" &
  SAMPLER_PID=$!
  local d_ns=$((DURATION * 1000000000)) t0 t_kill t_restart t_ping='' t_ready='' t_promoted=''
  local per_rate=$((RATE / 3)) per_keys=$((KEYS / 3))
  t0=$(now_ns)
  BENCH_PIDS=()
  for i in "${groups[@]}"; do
    "$TOLLGATE" bench resp --addr "$RESP_ADDR" --command "$cmd" -c 16 --threads 1 --rate "$per_rate" --duration "${DURATION}s" \
      --keys "$per_keys" --key-prefix "{${tags[$i]}}:" --timeout 2s -q \
      --json "$dir/node$i.json" --timeline "$dir/node$i.csv" --plot "$dir/node$i.svg" >"$dir/node$i.bench.log" 2>&1 &
    BENCH_PIDS[i]=$!
  done
  sleep_until $((t0 + KILL_AT * 1000000000))
  kill -KILL "${NODE_PIDS[$VICTIM]}"
  t_kill=$(now_ns)
  wait "${NODE_JOBS[$VICTIM]}" || true
  serve_alive "$dir/serve.log"
  if [ "$TOPOLOGY" != cluster ]; then
    # Redis's own failover: until a replica serves the killed primary's keys.
    while [ "$(now_ns)" -lt $((t0 + RESTART_AT * 1000000000)) ]; do
      if promoted "$VICTIM"; then t_promoted=$(now_ns); break; fi
      serve_alive "$dir/serve.log"
      sleep 0.02
    done
    [ -n "$t_promoted" ] || fail "Redis did not promote a replica of the killed primary by ${RESTART_AT}s (logs in $WORK/redis)"
  fi
  sleep_until $((t0 + RESTART_AT * 1000000000))
  serve_alive "$dir/serve.log"
  start_node "$VICTIM"
  t_restart=$(now_ns)
  local victim_port=${NODE_PORTS[$VICTIM]}
  local t_end=''
  while [ "$(now_ns)" -lt $((t0 + d_ns + 5000000000)) ]; do
    # The load's end, if it ends while this waits for the restarted node.
    if [ -z "$t_end" ] && ! kill -0 "${BENCH_PIDS[@]}" 2>/dev/null; then t_end=$(now_ns); fi
    if [ -z "$t_ping" ] && answers_ping "$victim_port"; then t_ping=$(now_ns); fi
    # Without replicas it serves its slots again; with them it rejoins as a replica, in sync.
    if [ -n "$t_ping" ] && if [ "$TOPOLOGY" = cluster ]; then
      redis-cli -p "$victim_port" cluster info 2>/dev/null | grep -q 'cluster_state:ok'
    else topology_ok; fi; then
      t_ready=$(now_ns); break
    fi
    serve_alive "$dir/serve.log"
    sleep 0.05
  done
  [ -n "$t_ping" ] || fail "the restarted primary did not answer PING ($WORK/redis/node$VICTIM/redis.log)"
  for i in "${groups[@]}"; do
    wait "${BENCH_PIDS[$i]}" || fail "tollgate bench failed ($dir/node$i.bench.log): $(tail -5 "$dir/node$i.bench.log")"
  done
  t_end=${t_end:-$(now_ns)}
  BENCH_PIDS=()
  sleep 0.3 # one more sample after the last reply
  kill "$SAMPLER_PID"; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=''
  serve_alive "$dir/serve.log"
  curl -s --max-time 5 "http://$HTTP_ADDR/metrics" >"$dir/metrics-final.txt" || fail "serve's /metrics did not answer"
  stop_serve
  printf 't0_ns %s\nkill_ns %s\npromoted_ns %s\nrestart_ns %s\nping_ns %s\nready_ns %s\nend_ns %s\nkilled_node %s\ntags %s\ncommand %s\n' \
    "$t0" "$t_kill" "$t_promoted" "$t_restart" "$t_ping" "${t_ready:-}" "$t_end" "$VICTIM" "${tags[*]}" "$cmd" >"$dir/events.txt"
  # Without replicas, the killed primary's keys are back when it is; with them, once Redis
  # promoted a replica (what it restarts as no longer matters to them).
  local t_back=$t_restart
  [ "$TOPOLOGY" = cluster ] || t_back=$t_promoted

  # Totals, and the checks that nothing was lost.
  local sent=0 answered=0 errors=0 admitted=0 over_killed=0 over_others=0 bound=0 killed_admitted=0 killed_bound=0
  local others_before=0 others_after=0
  local per_key
  per_key=$(bound_per_key "$algorithm" "$t0" "$t_end")
  for i in "${groups[@]}"; do
    local f="$dir/node$i.json" req err al de
    req=$(json_num "$f" requests) err=$(json_num "$f" errors) al=$(json_num "$f" allowed) de=$(json_num "$f" denied)
    [ "$al" != null ] && [ "$de" != null ] || fail "bench reported no decisions ($f)"
    [ "$req" -eq $((per_rate * DURATION)) ] || fail "lost: bench sent $req requests to node $i's keys, $((per_rate * DURATION)) were due ($f)"
    [ $((al + de + err)) -eq "$req" ] || fail "lost: $req requests, $al allowed + $de denied + $err errors ($f)"
    sent=$((sent + req)) answered=$((answered + al + de)) errors=$((errors + err)) admitted=$((admitted + al))
    # Over the bound key by key: a key over it is never made good by another under it.
    local group_bound=$((per_key * per_keys)) over
    read -r over _ <<<"$(over_per_key "$f" "$per_key")"
    [ "$over" != null ] || fail "bench reported no admissions per key ($f)"
    bound=$((bound + group_bound))
    if [ "$TOPOLOGY" = sentinel ] || [ "$i" -eq 1 ]; then
      over_killed=$((over_killed + over)) killed_admitted=$((killed_admitted + al)) killed_bound=$((killed_bound + group_bound))
    else
      over_others=$((over_others + over))
    fi
  done
  # The other primaries' keys (healthy throughout): their admissions per second before the kill,
  # and while the killed primary's keys were the policy's (the seconds within the kill and their
  # return, at least 3), summed over their groups, in hundredths. Left out: the first two seconds
  # (the limits' first burst). After the outage they are not the policy's business (a restarted
  # node's full resync slows the machine: the sliding log, which never catches up, admits 2-6%
  # less then under every policy).
  if [ "$TOPOLOGY" != sentinel ]; then
    local outage_end=$(( (t_back - t0) / 1000000 ))
    [ "$outage_end" -ge $(( (t_kill - t0) / 1000000 + 3000 )) ] || outage_end=$(( (t_kill - t0) / 1000000 + 3000 ))
    read -r others_before others_after <<<"$(awk -F, -v kill="$(( (t_kill - t0) / 1000000 ))" -v back="$outage_end" '
      FNR == 1 || $1 <= 2 { next }
      $1 * 1000 <= kill { before[FILENAME] += $4; nb[FILENAME]++ }
      ($1 - 1) * 1000 >= kill && ($1 - 1) * 1000 < back { after[FILENAME] += $4; na[FILENAME]++ }
      END { for (f in before) { b += 100 * before[f] / nb[f]; if (na[f]) a += 100 * after[f] / na[f] }
            printf "%d %d\n", b, a }' "$dir/node0.csv" "$dir/node2.csv")"
  fi
  local final
  final=$(awk -v t=0 -f "$HERE/metrics.awk" "$dir/metrics-final.txt")
  [ -n "$final" ] || fail "no store metrics in serve's /metrics ($dir/metrics-final.txt)"
  local fallbacks opened s_allowed s_denied
  read -r _ fallbacks _ _ opened _ s_allowed s_denied _ _ <<<"$final"
  # serve decided every request bench got a decision for, and at most those plus the errors.
  [ $((s_allowed + s_denied)) -ge "$answered" ] && [ $((s_allowed + s_denied)) -le $((answered + errors)) ] \
    || fail "lost: serve made $((s_allowed + s_denied)) decisions, bench got $answered decisions and $errors errors ($dir)"
  [ "$s_allowed" -ge "$admitted" ] && [ "$s_allowed" -le $((admitted + errors)) ] \
    || fail "serve admitted $s_allowed, bench was told $admitted allowed (and $errors errors) ($dir)"

  # p99 per phase: seconds (s-1, s] after bench's start; worst second, worst group. The first
  # second (bench making its connections) is left out.
  local phases
  phases=$(awk -F, -v k="$(( (t_kill - t0) / 1000000 ))" -v r="$(( (t_back - t0) / 1000000 ))" '
    FNR == 1 || $1 == 1 { next }
    { s = $1 * 1000; p = $8 + 0
      if (s <= k) { if (p > b) b = p } else if (s - 1000 >= r) { if (p > a) a = p } else if (p > d) d = p }
    END { printf "%d %d %d\n", b, d, a }' "$dir"/node*.csv)
  local p_before p_during p_after
  read -r p_before p_during p_after <<<"$phases"

  # Recovery, from the restarted primary answering PING (with replicas or Sentinel: from Redis's
  # promotion of a replica): Redis ready (its cluster_state:ok; with replicas or Sentinel: the
  # time Redis took to promote, from the kill); the last sample that saw a new fallback, or the
  # end of the last second with a bench error; the first second from which the killed primary's
  # keys are admitted, in every full second to the end, at least 90% of what they were in the
  # median second before the kill.
  local base=$t_ping ready_ms=never fallbacks_ms rate_ms
  [ -n "$t_ready" ] && ready_ms=$(( (t_ready - t_ping) / 1000000 ))
  if [ "$TOPOLOGY" != cluster ]; then base=$t_promoted ready_ms=$(( (t_promoted - t_kill) / 1000000 )); fi
  fallbacks_ms=$(awk -v from="$base" '
    { if (seen && $2 > prev && $1 > from) last = $1; prev = $2; seen = 1; final = $1 }
    END { if (last != "" && last == final) print "never"; else printf "%.0f\n", last == "" ? from : last }' "$dir/metrics.tsv")
  if [ "$fallbacks_ms" != never ]; then
    local last_error
    last_error=$(awk -F, -v t0="$t0" 'FNR > 1 && $3 > 0 { e = t0 + $1 * 1e9; if (e > m) m = e } END { printf "%.0f\n", m + 0 }' "$dir"/node*.csv)
    [ "$last_error" -gt "$fallbacks_ms" ] && fallbacks_ms=$last_error
    fallbacks_ms=$(( (fallbacks_ms - base) / 1000000 ))
    [ "$fallbacks_ms" -ge 0 ] || fallbacks_ms=0
  fi
  rate_ms=$(awk -F, -v from="$(( (base - t0) / 1000000 ))" -v kill="$(( (t_kill - t0) / 1000000 ))" -v per_s="$per_rate" '
    FNR == 1 || $2 < per_s / 2 { next }
    $1 >= 2 && $1 * 1000 <= kill { before[++n] = $4 + 0 }
    $1 * 1000 > from { after[++m] = $4 + 0; second[m] = $1 }
    END {
      for (i = 2; i <= n; i++) for (j = i; j > 1 && before[j - 1] > before[j]; j--) { t = before[j]; before[j] = before[j - 1]; before[j - 1] = t }
      usual = before[int((n + 1) / 2)]
      good = ""
      for (i = 1; i <= m; i++) if (after[i] >= 0.9 * usual) { if (good == "") good = second[i] } else good = ""
      if (good == "") print "never"; else { ms = (good - 1) * 1000 - from; print (ms < 0 ? 0 : ms) }
    }' "$dir/node1.csv")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$policy" "$algorithm" "$sent" "$answered" \
    "$errors" "$fallbacks" "$opened" "$p_before" "$p_during" "$p_after" "$admitted" "$bound" "$over_killed" "$over_others" \
    "$ready_ms" "$fallbacks_ms" "$rate_ms" "$killed_admitted" "$killed_bound" "$others_before" "$others_after" >>"$RESULTS"
  awk -F'\t' -f "$HERE/table.awk" <(head -1 "$RESULTS"; tail -1 "$RESULTS") | tail -1
  # With replicas or Sentinel, tollgate must follow Redis's promotion, whatever the policy.
  [ "$TOPOLOGY" = cluster ] || [ "$fallbacks_ms" != never ] \
    || fail "tollgate still fell back at the end of the run, $(( (t_end - t_promoted) / 1000000 )) ms after Redis promoted a replica ($dir)"
  # What docs/failure.md ("Failure behaviour") promises (failures with --strict, else listed).
  local broken=()
  if [ "$policy" != open ] && [ $((over_killed + over_others)) -gt 0 ]; then
    broken+=("$over_killed admitted over the keys' bounds on the killed primary's keys, $over_others on the others")
  fi
  [ "$policy" = open ] && [ "$over_others" -gt 0 ] && broken+=("$over_others admitted over the healthy keys' bounds")
  if [ "$policy" = closed ] && [ "$others_before" -gt 0 ] && [ $((others_after * 100)) -lt $((others_before * 98)) ]; then
    broken+=("the healthy keys were admitted $((others_after / 100))/s after the kill, $((others_before / 100))/s before (under 98%)")
  fi
  # The rate column counts from the restarted primary's PING without replicas; Redis serves
  # its slots again ready_ms later.
  local served_ms=$rate_ms
  if [ "$TOPOLOGY" = cluster ] && [ "$rate_ms" != never ]; then
    [ "$ready_ms" = never ] && served_ms=never || served_ms=$((rate_ms - ready_ms))
  fi
  if [ "$policy" = local ] && { [ "$served_ms" = never ] || [ "$served_ms" -gt 1000 ]; }; then
    broken+=("the killed keys' rate back $served_ms ms after Redis served them again (over 1 s)")
  fi
  [ "$opened" -gt 2 ] && broken+=("the breaker opened $opened times for one kill")
  local why
  for why in "${broken[@]}"; do
    local note="--on-store-error $policy, $algorithm: $why ($dir)"
    echo "$note" >>"$OUT/strict.txt"
    [ "$STRICT" = 0 ] || fail "$note"
  done
}

START=$(date +%s)
case "$TOPOLOGY" in
  cluster)
    echo "cluster: $STORE, 3 primaries, no replicas; in each run a primary is killed (SIGKILL) at ${KILL_AT}s and"
    echo "  restarted at ${RESTART_AT}s: its slots (a third of the keys) are unavailable from the kill until it serves"
    echo "  again, 2 s after its restart; the other primaries' keys stay available" ;;
  replicas)
    echo "cluster: $STORE, 3 primaries + 3 replicas, cluster-node-timeout ${NODE_TIMEOUT} ms; in each run a primary is"
    echo "  killed (SIGKILL) at ${KILL_AT}s: Redis promotes its replica; it is restarted at ${RESTART_AT}s and rejoins as a replica" ;;
  sentinel)
    echo "sentinel: $STORE, a primary, a replica and 3 Sentinels (down-after ${NODE_TIMEOUT} ms); in each run the primary"
    echo "  is killed (SIGKILL) at ${KILL_AT}s: the Sentinels promote the replica; it is restarted at ${RESTART_AT}s as a replica;"
    echo "  every key lives on the one primary (\"killed keys\" are all of them)" ;;
esac
echo "load: per run, $RATE requests/s (open loop) over $KEYS keys for ${DURATION}s, $((RATE / KEYS)) requests/s per key, whose limit is 10/s;"
echo "  output in $OUT"
awk -F'\t' -f "$HERE/table.awk" "$RESULTS" | head -2
for policy in $POLICIES; do
  for algorithm in $ALGORITHMS; do
    run "$policy" "$algorithm"
  done
done
echo
awk -F'\t' -f "$HERE/table.awk" "$RESULTS" | tee "$OUT/table.txt"
if [ -s "$OUT/strict.txt" ]; then
  echo "short of what docs/failure.md (\"Failure behaviour\") promises (--strict fails on these):"
  sed 's/^/  /' "$OUT/strict.txt"
fi
awk -F'\t' -v out="$OUT" -v duration="$DURATION" -v rate="$RATE" -v limit="$((KEYS * 10))" -f "$HERE/timeline.awk" "$RESULTS" >"$OUT/timeline.svg"
echo
echo "$(( $(date +%s) - START )) s; files in $OUT (timeline.svg: every run; <policy>-<algorithm>/: bench JSON, CSV and SVG per primary, serve's log and metrics)"
