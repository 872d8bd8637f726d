#!/usr/bin/env bash
# The whole test suite, from a fresh clone on Debian 12: installs what is missing, builds
# the release preset, runs the libFuzzer target for a bounded time, then ctest (whose
# summary is the last thing printed). This is what CI runs (.ci/run).
#   UOPD_FUZZ_SECONDS  how long the fuzzer runs (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh

cmake --preset release >/dev/null
cmake --build --preset release

# Fuzz decode + verify (clang + libFuzzer), seeded with the examples in binary form.
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target fuzz_decode_verify
corpus=build/fuzz/corpus/decode_verify
mkdir -p "$corpus"
for g in examples/*.json; do build/release/compiler/uopc convert "$g" "$corpus/$(basename "$g" .json).uopb"; done
log=build/fuzz/fuzz_decode_verify.log
set +e
build/fuzz/tests/fuzz/fuzz_decode_verify -max_total_time="${UOPD_FUZZ_SECONDS:-60}" -max_len=65536 \
  -print_final_stats=1 "$corpus" >"$log" 2>&1
rc=$?
set -e
grep -E '^(#[0-9]+ *DONE|stat::number_of_executed_units)' "$log" || true
if [ "$rc" -ne 0 ]; then tail -n 60 "$log"; echo "fuzz_decode_verify failed (exit $rc), log: $log"; exit 1; fi

ctest --preset release
