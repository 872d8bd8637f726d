#!/usr/bin/env bash
# The whole test suite, from a fresh clone on Debian 12: installs what is missing, builds
# the release preset, runs the libFuzzer targets for a bounded time, then ctest (whose
# summary is the last thing printed). This is what CI runs (.ci/run).
#   UOPD_FUZZ_SECONDS  how long the fuzzers run, all four together (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh

cmake --preset release >/dev/null
cmake --build --preset release

# The libFuzzer targets (clang, ASan + UBSan), each for a quarter of UOPD_FUZZ_SECONDS. The
# fuzz preset builds a second, instrumented copy of what they link (the IR, the codec, the
# planner's passes; no LLVM codegen, no service): only these targets.
#   fuzz_decode_verify  graph bytes through the decoders and the verifier, seeded with the
#                       examples in binary form;
#   fuzz_requests       client API requests (Compile, Run, Explain, Upload, Download) through
#                       decoding, the handlers' checks and the planner, seeded with the
#                       examples as requests (written by the release build's replay);
#   fuzz_bounds         generated kernels with gated index expressions through the bounds
#                       proof, every accepted access evaluated under wrapping arithmetic;
#   fuzz_onnx_import    ONNX model bytes through LoadModel's import (the importer and the
#                       decode limits), seeded with the conformance models.
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target fuzz_decode_verify fuzz_requests fuzz_bounds fuzz_onnx_import
total="${UOPD_FUZZ_SECONDS:-60}"
quarter=$(( total / 4 > 0 ? total / 4 : 1 ))
rest=$(( total - 3 * quarter > 0 ? total - 3 * quarter : 1 ))
corpus=build/fuzz/corpus
mkdir -p "$corpus/decode_verify" "$corpus/requests" "$corpus/bounds" "$corpus/onnx_import"
for g in examples/*.json; do build/release/compiler/uopc convert "$g" "$corpus/decode_verify/$(basename "$g" .json).uopb"; done
build/release/tests/fuzz_requests_replay examples --write-seeds "$corpus/requests" >/dev/null
build/release/tests/fuzz_bounds_replay --write-seeds "$corpus/bounds"
build/release/tests/fuzz_onnx_import_replay tests/conformance/models --write-seeds "$corpus/onnx_import"
fuzz() {  # NAME SECONDS: run build/fuzz/tests/fuzz/NAME over its corpus; fail CI on a finding
  local name=$1 seconds=$2 corpus_dir=$corpus/${1#fuzz_} log=build/fuzz/$1.log rc
  set +e
  "build/fuzz/tests/fuzz/$name" -max_total_time="$seconds" -max_len=65536 -timeout=60 -rss_limit_mb=4096 \
    -print_final_stats=1 "$corpus_dir" >"$log" 2>&1
  rc=$?
  set -e
  echo "$name:"
  grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units)' "$log" || true
  if [ "$rc" -ne 0 ]; then tail -n 60 "$log"; echo "$name failed (exit $rc), log: $log"; exit 1; fi
}
fuzz fuzz_decode_verify "$quarter"
fuzz fuzz_requests "$quarter"
fuzz fuzz_bounds "$quarter"
fuzz fuzz_onnx_import "$rest"

ctest --preset release
