# The Redis topologies of scripts/failure-injection.sh (sourced by it; uses its WORK, TOPOLOGY,
# NODE_TIMEOUT, NODE_PORTS, NODE_PIDS, NODE_JOBS, fail, now_ns and port_free):
#   cluster   3 primaries, no replicas: the killed primary's slots wait for its restart;
#   replicas  3 primaries + 3 replicas: the killed primary's replica is promoted by the cluster;
#   sentinel  a primary, a replica and 3 Sentinels (quorum 2): the replica is promoted by them.
# Data nodes keep AOF on (fsync every second); a killed node restarts with its nodes.conf and AOF.

SENTINEL_PORTS=() SENTINEL_PIDS=() SENTINEL_JOBS=()
MASTER_NAME=tollgate

# A port for a node: it and its cluster bus port (bus_port) free. Both stay below Linux's ephemeral
# range (32768 and up): Redis's default bus port, +10000, lands in it, where a client socket's local
# port (the load's, the nodes' own links) can hold it and a node fails to start or restart.
node_port() {
  local port
  for port in $(seq 23100 23999); do
    [[ " ${NODE_PORTS[*]} ${SENTINEL_PORTS[*]} " == *" $port "* ]] && continue
    if port_free "$port" && port_free "$(bus_port "$port")"; then echo "$port"; return; fi
  done
  fail "no free port pair in 23100-23999 / 24100-24999"
}
bus_port() { echo $(($1 + 1000)); }

# Starts data node $1 (again, after a kill: with its files); $2: a replicaof address, first start only.
start_node() {
  local i=$1 dir="$WORK/redis/node$1"
  mkdir -p "$dir"
  rm -f "$dir/redis.pid"
  local mode=(--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout "$NODE_TIMEOUT"
    --cluster-require-full-coverage no --cluster-port "$(bus_port "${NODE_PORTS[$i]}")")
  if [ "$TOPOLOGY" = sentinel ]; then
    mode=()
    [ -n "${2:-}" ] && mode=(--replicaof "${2% *}" "${2#* }")
  fi
  (
    redis-server --port "${NODE_PORTS[$i]}" --bind 127.0.0.1 --dir "$dir" --save "" \
      --appendonly yes --appendfsync everysec --repl-diskless-sync-delay 0 "${mode[@]}" \
      --logfile "$dir/redis.log" --pidfile "$dir/redis.pid" --daemonize no
    true
  ) 2>/dev/null &
  NODE_JOBS[i]=$!
  for _ in $(seq 200); do [ -s "$dir/redis.pid" ] && break; sleep 0.01; done
  [ -s "$dir/redis.pid" ] || fail "redis-server on port ${NODE_PORTS[$i]} did not start: $(tail -3 "$dir/redis.log" 2>/dev/null)"
  NODE_PIDS[i]=$(cat "$dir/redis.pid")
}

start_sentinel() {
  local i=$1 dir="$WORK/redis/sentinel$1"
  mkdir -p "$dir"
  cat >"$dir/sentinel.conf" <<EOF
port ${SENTINEL_PORTS[$i]}
bind 127.0.0.1
dir $dir
logfile $dir/sentinel.log
pidfile $dir/sentinel.pid
sentinel monitor $MASTER_NAME 127.0.0.1 ${NODE_PORTS[0]} 2
sentinel down-after-milliseconds $MASTER_NAME $NODE_TIMEOUT
sentinel failover-timeout $MASTER_NAME 2000
sentinel parallel-syncs $MASTER_NAME 1
EOF
  (redis-server "$dir/sentinel.conf" --sentinel; true) 2>/dev/null &
  SENTINEL_JOBS[i]=$!
  for _ in $(seq 200); do [ -s "$dir/sentinel.pid" ] && break; sleep 0.01; done
  [ -s "$dir/sentinel.pid" ] || fail "redis-sentinel on port ${SENTINEL_PORTS[$i]} did not start ($dir/sentinel.log)"
  SENTINEL_PIDS[i]=$(cat "$dir/sentinel.pid")
}

answers_ping() { [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }
running() { kill -0 "${NODE_PIDS[$1]}" 2>/dev/null; }
synced() { redis-cli -p "$1" info replication 2>/dev/null | grep -q 'master_link_status:up'; }

# The data node the Sentinels name the primary.
sentinel_primary() {
  local port
  port=$(redis-cli -p "${SENTINEL_PORTS[0]}" sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null | sed -n 2p)
  for i in "${!NODE_PORTS[@]}"; do [ "${NODE_PORTS[$i]}" = "$port" ] && echo "$i" && return; done
}

# Every running node healthy: cluster_state:ok, no node flagged failing, every replica in sync
# (sentinel: the primary named, the other node its replica in sync, every Sentinel knowing both).
topology_ok() {
  local i
  if [ "$TOPOLOGY" = sentinel ]; then
    local primary
    primary=$(sentinel_primary)
    [ -n "$primary" ] || return 1
    for i in "${!NODE_PORTS[@]}"; do
      [ "$i" = "$primary" ] && continue
      running "$i" && synced "${NODE_PORTS[$i]}" || return 1
    done
    for i in "${!SENTINEL_PORTS[@]}"; do
      redis-cli -p "${SENTINEL_PORTS[$i]}" sentinel replicas "$MASTER_NAME" 2>/dev/null | grep -q 'slave' || return 1
    done
    return 0
  fi
  for i in "${!NODE_PORTS[@]}"; do
    running "$i" || continue
    local port=${NODE_PORTS[$i]}
    redis-cli -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
    ! redis-cli -p "$port" cluster nodes 2>/dev/null | grep -q fail || return 1
    if redis-cli -p "$port" role 2>/dev/null | head -1 | grep -q slave; then synced "$port" || return 1; fi
  done
}
wait_topology_ok() {
  local deadline=$(( $(now_ns) + 60000000000 ))
  until topology_ok; do
    [ "$(now_ns)" -lt "$deadline" ] || fail "the $TOPOLOGY topology did not become healthy within 60 s (logs in $WORK/redis)"
    sleep 0.1
  done
}

setup_topology() {
  local nodes=3 i
  case "$TOPOLOGY" in replicas) nodes=6 ;; sentinel) nodes=2 ;; esac
  for i in $(seq 0 $((nodes - 1))); do NODE_PORTS[i]=$(node_port); done
  for i in $(seq 0 $((nodes - 1))); do
    if [ "$TOPOLOGY" = sentinel ] && [ "$i" -gt 0 ]; then start_node "$i" "127.0.0.1 ${NODE_PORTS[0]}"; else start_node "$i"; fi
  done
  for i in $(seq 0 $((nodes - 1))); do
    for _ in $(seq 100); do answers_ping "${NODE_PORTS[$i]}" && break; sleep 0.1; done
    answers_ping "${NODE_PORTS[$i]}" ||
      fail "redis-server on port ${NODE_PORTS[$i]} does not answer: $(tail -3 "$WORK/redis/node$i/redis.log" 2>/dev/null)"
  done
  if [ "$TOPOLOGY" = sentinel ]; then
    for i in 0 1 2; do SENTINEL_PORTS[i]=$(node_port); start_sentinel "$i"; done
    STORE="redis+sentinel://$(IFS=,; echo "${SENTINEL_PORTS[*]/#/127.0.0.1:}")/$MASTER_NAME"
  else
    local replicas=0
    [ "$TOPOLOGY" = replicas ] && replicas=1
    redis-cli --cluster create "${NODE_PORTS[@]/#/127.0.0.1:}" --cluster-replicas "$replicas" --cluster-yes \
      >"$WORK/cluster-create.log" 2>&1 || fail "redis-cli --cluster create failed: $(cat "$WORK/cluster-create.log")"
    STORE="redis+cluster://$(IFS=,; echo "${NODE_PORTS[*]/#/127.0.0.1:}")"
  fi
  wait_topology_ok
}

# PRIMARIES: the data nodes serving as primaries now, one per key group (the Sentinel group's one
# primary three times: every group's keys live on it); SLOTS: the slot ranges each owns.
read_primaries() {
  PRIMARIES=() SLOTS=()
  if [ "$TOPOLOGY" = sentinel ]; then
    local p
    p=$(sentinel_primary)
    PRIMARIES=("$p" "$p" "$p")
    return
  fi
  local i
  for i in "${!NODE_PORTS[@]}"; do
    running "$i" || continue
    local mine
    mine=$(redis-cli -p "${NODE_PORTS[$i]}" cluster nodes | awk '/myself/ && /master/ { for (i = 9; i <= NF; i++) printf "%s ", $i }')
    if [ -n "$mine" ]; then PRIMARIES+=("$i"); SLOTS+=("$mine"); fi
  done
  [ "${#PRIMARIES[@]}" -eq 3 ] || fail "expected 3 primaries, found ${#PRIMARIES[@]}"
}

# A hash tag starting with $2 whose slot key group $1's primary owns: keys "{tag}:N" all live there.
tag_on() {
  local group=$1 base=$2
  if [ "$TOPOLOGY" = sentinel ]; then echo "${base}0"; return; fi
  local candidates
  candidates=$(for n in $(seq 0 99); do echo "cluster keyslot $base$n"; done | redis-cli -p "${NODE_PORTS[${PRIMARIES[0]}]}")
  echo "$candidates" | awk -v base="$base" -v ranges="${SLOTS[$group]}" '
    BEGIN { n = split(ranges, r, " ") }
    { for (i = 1; i <= n; i++) { split(r[i], ab, "-"); if (ab[2] == "") ab[2] = ab[1]
        if ($1 >= ab[1] + 0 && $1 <= ab[2] + 0) { print base (NR - 1); exit } } }'
}

# Whether Redis has replaced the killed primary $1: a running node serves its key groups'
# slots (cluster_state:ok on every running node), or the Sentinels name another primary.
promoted() {
  local victim=$1
  if [ "$TOPOLOGY" = sentinel ]; then
    local p
    p=$(sentinel_primary)
    [ -n "$p" ] && [ "$p" != "$victim" ] && answers_ping "${NODE_PORTS[$p]}" \
      && redis-cli -p "${NODE_PORTS[$p]}" role | head -1 | grep -q master
    return
  fi
  local i
  for i in "${!NODE_PORTS[@]}"; do
    running "$i" || continue
    redis-cli -p "${NODE_PORTS[$i]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
  done
  # Some running node owns the victim's first slot as a primary.
  local slot=${VICTIM_SLOTS%%[- ]*}
  for i in "${!NODE_PORTS[@]}"; do
    [ "$i" = "$victim" ] && continue
    running "$i" || continue
    redis-cli -p "${NODE_PORTS[$i]}" cluster nodes | awk -v s="$slot" '/myself/ && /master/ {
      for (i = 9; i <= NF; i++) { split($i, ab, "-"); if (ab[2] == "") ab[2] = ab[1]; if (s >= ab[1] + 0 && s <= ab[2] + 0) found = 1 } }
      END { exit !found }' && return 0
  done
  return 1
}

stop_topology() {
  local pid
  for pid in "${SENTINEL_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SENTINEL_JOBS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
