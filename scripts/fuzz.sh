#!/usr/bin/env bash
# Runs every cargo-fuzz target for a number of inputs each, on the stable toolchain.
#   bash scripts/fuzz.sh [RUNS]        (default 10000000 inputs per target)
#   TARGETS="resp_frame http_json" bash scripts/fuzz.sh 100000
# libFuzzer needs unstable compiler flags: RUSTC_BOOTSTRAP=1 lets the stable toolchain pass them.
# A crash stops the run and leaves its input in fuzz/artifacts/TARGET/: commit it under
# fuzz/regressions/TARGET/: it seeds later runs, and crates/server/tests/fuzz_inputs.rs (the
# targets whose bodies are tollgate_server::fuzzing) or crates/redis-client/tests/fuzz_inputs.rs
# (redis_topology, redis_url: tollgate_redis_client::fuzzing) replays it through the same code.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
RUNS="${1:-10000000}"
TARGETS="${TARGETS:-resp_frame resp_command http_json rules_file client_hello canonical_request redis_reply redis_topology redis_url}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

for target in $TARGETS; do
  echo "== $target: $RUNS inputs"
  mkdir -p "corpus/$target"
  # Seed the corpus with the committed regressions, if any.
  if [ -d "regressions/$target" ]; then cp -n "regressions/$target"/* "corpus/$target"/ 2>/dev/null || true; fi
  mkdir -p artifacts
  log="artifacts/$target.log"
  start=$(date +%s)
  status=ok
  cargo fuzz run --release "$target" "corpus/$target" -- -runs="$RUNS" -max_len=4096 -timeout=10 \
    -print_final_stats=1 >"$log" 2>&1 || status=CRASH
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
  echo "   $status after $(( $(date +%s) - start )) s (log: fuzz/$log)"
  if [ "$status" != ok ]; then tail -40 "$log"; exit 1; fi
done
