#!/usr/bin/env bash
# Runs every libFuzzer harness for a bounded time, starting from its checked-in
# seed corpus (tests/fuzz/corpus/<harness>/), and fails on any finding: a
# crash, a sanitizer report, a leak, a timeout or a contract violation the
# harness detects. Prints the executions of each run.
#
#   tests/fuzz/run.sh <build-dir> [seconds-per-harness] [harness...]
#
# <build-dir> was configured with CC=clang -DPA_BUILD_FUZZERS=ON. New inputs
# go to a scratch directory; PA_FUZZ_MERGE=1 merges them into the checked-in
# corpus afterwards (only inputs that reach new edges: -merge=1 -use_counters=0).
set -euo pipefail

build=${1:?usage: run.sh <build-dir> [seconds] [harness...]}
seconds=${2:-30}
shift $(($# >= 2 ? 2 : 1))
here=$(cd "$(dirname "$0")" && pwd)
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(write_kv copy_blocks swap_blocks plan_create paged_attention varlen_attention
             layer_create merge_states)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

failed=0
printf '%-18s %12s %10s %8s\n' harness executions exec/s corpus
for harness in "${harnesses[@]}"; do
  binary=$build/tests/fuzz/fuzz_$harness
  seeds=$here/corpus/$harness
  [ -x "$binary" ] || { echo "missing $binary" >&2; exit 2; }
  mkdir -p "$work/$harness" "$seeds"
  log=$work/$harness.log
  if "$binary" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 -max_len=512 \
      -print_final_stats=1 -artifact_prefix="$work/$harness-" \
      "$work/$harness" "$seeds" >"$log" 2>&1; then
    runs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$log")
    rate=$(awk '/stat::average_exec_per_sec/ { print $2 }' "$log")
    corpus=$(find "$work/$harness" "$seeds" -type f | wc -l)
    printf '%-18s %12s %10s %8s\n' "$harness" "$runs" "$rate" "$corpus"
    if [ "${PA_FUZZ_MERGE:-0}" = 1 ]; then
      # Edges only (no hit counts): the checked-in corpus stays small.
      "$binary" -merge=1 -use_counters=0 -max_len=512 "$seeds" "$work/$harness" >/dev/null 2>&1
    fi
  else
    failed=1
    echo "=== fuzz_$harness: FINDING" >&2
    grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse)|NEW_FUNC' "$log" | tail -60 >&2
    for artifact in "$work/$harness"-*; do
      [ -e "$artifact" ] || continue
      keep=$build/fuzz-findings
      mkdir -p "$keep"
      cp "$artifact" "$keep/"
      echo "reproduce: $binary $keep/$(basename "$artifact")" >&2
    done
  fi
done
exit $failed
