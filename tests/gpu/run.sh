#!/usr/bin/env bash
# The GPU checks of the CUDA backend, for one machine with a GPU (an H200 with
# 16 cores), in under 6 minutes all told. Logs go to $OUT (else build/gpu/logs):
# summary.txt (each step, its status and the tail of its log), one NAME.log per step,
# bench_*.json (Google Benchmark's JSON), env.txt (driver, glibc, what the carry needs).
#
# With build/gpu_carry (tests/gpu/prepare_carry.sh, run on the build machine: that GPU
# machine lacks Debian's Abseil / gRPC / LLVM and cannot install them) it unpacks the
# carried binaries and libraries into a temporary folder and runs them from there with
# LD_LIBRARY_PATH: the CUDA runtime over a fake driver, the kernel corpus on the GPU
# against the interpreter, uop-worker --device=cuda:0, uopd with --cuda-workers=1 end to
# end (Compile for cuda, Run on CUDA:0 against the interpreter), the GPU emulator against
# the GPU (cuda_gpu_test, its own summary line), the NCCL allreduce test
# if it was carried, bench_cuda (matmul vs cuBLAS, bandwidth vs cuMemcpyDtoD) and
# bench_nvrtc. NVRTC, cuBLAS and the driver are the machine's own (/usr/local/cuda).
# Without the carry it configures and builds a lean tree itself (needs the packages).
#
# Exit status: 0 when every test step passed (benchmarks do not count), else the first
# failure's (124 for a step that ran out of time).
set -u
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CARRY="${UOPD_GPU_CARRY:-$ROOT/build/gpu_carry}"
LOGS="${OUT:-$ROOT/build/gpu/logs}"
mkdir -p "$LOGS"
BUDGET_S="${UOPD_GPU_BUDGET_S:-340}"  # every step together
START=$(date +%s)
SUMMARY="$LOGS/summary.txt"
: > "$SUMMARY"
rc=0

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - START))); }

# run NAME LIMIT_S KIND(test|bench) COMMAND...: at most LIMIT_S, and never past the budget.
run() {
  local name="$1" limit="$2" kind="$3"; shift 3
  local l; l=$(left)
  if [ "$l" -lt 10 ]; then say "== $name: skipped, the time budget is spent"; return 0; fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local r=$?
  say "== $name: exit $r in $(( $(date +%s) - t0 ))s (limit ${limit}s)"
  if [ "$kind" = test ]; then
    grep -E '^\[  (FAILED|SKIPPED)  \] [A-Za-z]|^\[  PASSED  \]|^\[==========\] [0-9]+ tests? from .* ran' "$LOGS/$name.log" |
      sort -u | head -20 >> "$SUMMARY"
  else
    grep -vE '^\*\*\*WARNING|^-+$|^Benchmark ' "$LOGS/$name.log" | tail -14 >> "$SUMMARY"
  fi
  [ $r -ne 0 ] && tail -3 "$LOGS/$name.log" >> "$SUMMARY"
  if [ "$kind" = test ] && [ $r -ne 0 ] && [ $rc -eq 0 ]; then rc=$r; fi
  return 0
}

# The GPU emulator (compiler/gpu_emu, what CI runs instead of a GPU) against this GPU: its
# own line in the summary, from cuda_gpu_test's log.
emulator_line() {
  local l
  l=$(grep -E '^\[ +(OK|FAILED|SKIPPED) +\] CudaGpu\.TheEmulatorAgreesWithTheGpu' "$LOGS/cuda_gpu_test.log" 2>/dev/null | head -1)
  say "== emulator vs GPU: ${l:-no result (see cuda_gpu_test.log)}"
}

{
  echo "host $(hostname) $(date -u +%FT%TZ), $(nproc) cores"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 || echo "no nvidia-smi"
  ldd --version 2>&1 | head -1
  ls /usr/local/cuda/lib64/ 2>&1 | grep -E '^lib(nvrtc|cublas)\.so' | tr '\n' ' '; echo
} > "$LOGS/env.txt" 2>&1
nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1 || true

if [ -d "$CARRY/bin" ]; then
  # --- the carried binaries -------------------------------------------------------------
  W="$(mktemp -d "${TMPDIR:-/tmp}/uopd-gpu-carry.XXXXXX")"
  trap 'rm -rf "$W"' EXIT
  mkdir -p "$W/bin" "$W/lib/glibc" "$W/run"
  unxz_to() {  # src.xz dst
    if command -v xz > /dev/null; then xz -dc "$1" > "$2"
    else python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
    fi
  }
  for d in bin lib lib/glibc; do
    for f in "$CARRY/$d"/*; do
      [ -f "$f" ] || continue
      case "$f" in
        *.xz) unxz_to "$f" "$W/$d/$(basename "${f%.xz}")" || say "cannot unpack $f" ;;
        *) cp "$f" "$W/$d/" ;;
      esac
    done
  done
  chmod +x "$W/bin"/* "$W/lib/glibc"/ld-linux* 2>/dev/null
  cat "$CARRY/MANIFEST" >> "$LOGS/env.txt" 2>/dev/null
  # The binaries were built against a glibc that may be newer than this machine's: then
  # each one starts through the carried loader and glibc (wrappers in $W/run), else
  # directly with LD_LIBRARY_PATH.
  need=$(sed -n 's/^needs glibc >= \([0-9.]*\).*/\1/p' "$CARRY/MANIFEST" 2>/dev/null)
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  older=0
  [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$have" "$need" | sort -V | head -1)" != "$need" ] && older=1
  [ "${UOPD_GPU_FORCE_LOADER:-0}" = 1 ] && older=1  # to try this path on a machine with the right glibc
  if [ $older = 1 ] && [ -x "$W/lib/glibc/ld-linux-x86-64.so.2" ]; then
    say "== glibc $have here, the binaries need $need: starting them through the carried loader"
    for b in "$W/bin"/*; do
      printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' \
        "$W/lib/glibc/ld-linux-x86-64.so.2" "$W/lib/glibc:$W/lib" "$b" > "$W/run/$(basename "$b")"
      chmod +x "$W/run/$(basename "$b")"
    done
    B="$W/run"
  else
    say "== glibc ${have:-?} here, the binaries need ${need:-?}"
    export LD_LIBRARY_PATH="$W/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    B="$W/bin"
    missing=$(for b in "$W/bin"/*; do ldd "$b" 2>&1 | grep 'not found' | sed "s|^|$(basename "$b"): |"; done | sort -u)
    if [ -n "$missing" ]; then say "== missing libraries:"; say "$missing"; fi
  fi
  export PATH="$B:$PATH"
  # The tests start these processes; the build's own paths do not exist here.
  export UOPD_BINARY="$B/uopd" UOP_BINARY="$B/uop" UOP_WORKER_BINARY="$B/uop-worker"
  say "== unpacked $(ls "$W/bin" | wc -l) binaries, $(find "$W/lib" -type f | wc -l) libraries in $(( $(date +%s) - START ))s"

  run cuda_driver_test 30 test "$B/cuda_driver_test"
  run cuda_gpu_test 90 test "$B/cuda_gpu_test"
  emulator_line
  run cuda_compile_e2e_test 75 test "$B/cuda_compile_e2e_test"
  run cuda_worker_test 45 test "$B/cuda_worker_test"
  for t in "$B"/*nccl*; do
    [ -x "$t" ] && run "$(basename "$t")" 45 test "$t"
  done
  run bench_cuda 80 bench "$B/bench_cuda" --benchmark_min_time=0.2 \
    --benchmark_out="$LOGS/bench_cuda.json" --benchmark_out_format=json
  run bench_nvrtc 25 bench "$B/bench_nvrtc" --benchmark_filter='BM_CompileCuda/(add|softmax|sum_rows|matmul_64x128x32|transpose)$' \
    --benchmark_min_time=0.2 \
    --benchmark_out="$LOGS/bench_nvrtc.json" --benchmark_out_format=json
  run cuda_compile_test 40 test "$B/cuda_compile_test"
else
  # --- no carry: build here (needs Debian's packages) ------------------------------------
  BUILD="${UOPD_GPU_BUILD:-$ROOT/build/gpu}"
  JOBS="$(nproc 2>/dev/null || echo 4)"
  say "== no $CARRY: configure and build in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    > "$LOGS/configure.log" 2>&1 || { tail -20 "$LOGS/configure.log"; exit 2; }
  timeout 420 ninja -C "$BUILD" -j"$JOBS" cuda_driver_test cuda_compile_test cuda_gpu_test bench_nvrtc bench_cuda \
    cuda_worker_test cuda_compile_e2e_test uopd uop-worker uop > "$LOGS/build.log" 2>&1 ||
    { tail -40 "$LOGS/build.log"; exit 2; }
  run cuda_gpu_test 90 test "$BUILD/tests/unit/cuda_gpu_test"
  emulator_line
  run cuda_compile_e2e_test 75 test "$BUILD/tests/e2e/cuda_compile_e2e_test"
  run cuda_worker_test 45 test "$BUILD/tests/e2e/cuda_worker_test"
  run bench_cuda 80 bench "$BUILD/tests/bench/bench_cuda" --benchmark_min_time=0.2 \
    --benchmark_out="$LOGS/bench_cuda.json" --benchmark_out_format=json
fi

say "== rc $rc after $(( $(date +%s) - START ))s"
exit $rc
