#!/usr/bin/env bash
# Measures how long Envoy's ShouldRateLimit takes while Redis is frozen (SIGSTOP: connections open,
# nothing answers), with the Python client built from Envoy's protos (target/pyenv, made by
# scripts/test.sh): 500 healthy calls, then 200 with Redis frozen; prints p50/p99 and how many
# took longer than Envoy's 20 ms default. Extra arguments go to `tollgate serve`
# (e.g. --grpc-store-timeout 50ms).
#   bash scripts/grpc-stall.sh [SERVE FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
PYTHON="${TOLLGATE_PYTHON:-$TARGET/pyenv/bin/python}"
[ -x "$PYTHON" ] || { echo "no $PYTHON: run bash scripts/test.sh once (it makes the Python environment)" >&2; exit 1; }
cargo build --release -q -p tollgate
free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(free_port); GRPC_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save "" --appendonly no >/dev/null &
REDIS_PID=$!
"$TARGET/release/tollgate" serve --resp 127.0.0.1:0 --http 127.0.0.1:0 --grpc "127.0.0.1:$GRPC_PORT" \
  --store "redis://127.0.0.1:$REDIS_PORT" --envoy-config deploy/envoy/ratelimit.yaml --log-level error "$@" &
SERVE_PID=$!
trap 'kill -CONT $REDIS_PID 2>/dev/null; kill $SERVE_PID $REDIS_PID 2>/dev/null || true' EXIT
for _ in $(seq 200); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
sleep 1
"$PYTHON" - "$GRPC_PORT" "$REDIS_PID" <<'PY'
import os, signal, statistics, sys, time
import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

port, redis_pid = sys.argv[1], int(sys.argv[2])
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

def call(i):
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value=f"10.0.0.{i % 200}")
    request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])
    start = time.perf_counter()
    stub.ShouldRateLimit(request, timeout=5)
    return (time.perf_counter() - start) * 1000

for i in range(50):
    call(i)
healthy = sorted(call(i) for i in range(500))
print(f"healthy: p50 {statistics.median(healthy):.2f} ms, p99 {healthy[494]:.2f} ms")
os.kill(redis_pid, signal.SIGSTOP)
try:
    frozen = [call(i) for i in range(200)]
finally:
    os.kill(redis_pid, signal.SIGCONT)
rest = sorted(frozen[6:])
print("frozen: first 6 calls (ms):", " ".join(f"{m:.1f}" for m in frozen[:6]))
print(f"then p50 {statistics.median(rest):.2f} ms, p99 {rest[int(len(rest) * 0.99)]:.2f} ms, max {rest[-1]:.2f} ms;"
      f" over 20 ms: {sum(m > 20 for m in frozen)} of {len(frozen)}")
PY
