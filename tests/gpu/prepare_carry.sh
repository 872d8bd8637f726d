#!/usr/bin/env bash
# Packs what tests/gpu/run.sh runs on the GPU machine into one folder, build/gpu_carry,
# built HERE: that machine has the repository and the CUDA toolkit (/usr/local/cuda: NVRTC,
# cuBLAS) and a driver, but not Debian's Abseil / gRPC / Protobuf / LLVM, and no network.
#
#   build/gpu_carry/bin/   the stripped binaries (NAME, or NAME.xz when large)
#   build/gpu_carry/lib/   every shared library they need that is not part of glibc or the
#                          NVIDIA driver (SONAME, or SONAME.xz when large: libLLVM is 129 MB
#                          raw, 25 MB as xz)
#   build/gpu_carry/lib/glibc/  this machine's loader and glibc (Debian 12: 2.36), used only
#                          where the GPU machine's glibc is older than the binaries need
#                          (libLLVM and libstdc++ want arc4random, GLIBC_2.36): run.sh then
#                          starts every binary through the carried loader
#   build/gpu_carry/MANIFEST  what is there, the build's commit, the newest GLIBC symbol
#                          version the binaries need
#
# run.sh unpacks it into a temporary folder and runs everything with LD_LIBRARY_PATH
# pointing there. The folder must stay under 60 MiB (the device tool carries 64 MiB in
# all): this script fails if it does not. Large files are compressed once and kept in
# $BUILD/carry_cache (libraries by path, size and mtime; binaries by content hash).
#
# usage: tests/gpu/prepare_carry.sh        (JOBS=2 by default; UOPD_CUDA_BUILD, UOPD_GPU_CARRY)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${UOPD_CUDA_BUILD:-$ROOT/build/cuda}"
CARRY="${UOPD_GPU_CARRY:-$ROOT/build/gpu_carry}"
CACHE="$BUILD/carry_cache"
JOBS="${JOBS:-2}"
LIMIT_BYTES=$((60 * 1024 * 1024))
RAW_MAX=$((64 * 1024))  # files above this travel as .xz

TARGETS=(cuda_driver_test cuda_gpu_test cuda_compile_test cuda_worker_test cuda_compile_e2e_test
         uopd uop-worker uop bench_nvrtc bench_cuda)

[ -f "$BUILD/build.ninja" ] || { echo "prepare_carry: no build in $BUILD (configure it first)" >&2; exit 2; }
echo "== build ($BUILD, -j$JOBS)"
ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}"

# The NCCL allreduce test, if one exists by now (tests/unit/worker/collectives/; another
# engineer's): included only when it builds.
OPTIONAL=()
while read -r t; do
  [ -n "$t" ] || continue
  if ninja -C "$BUILD" -j"$JOBS" "$t" > "$BUILD/carry_$t.log" 2>&1; then
    OPTIONAL+=("$t")
  else
    echo "prepare_carry: $t does not build (see $BUILD/carry_$t.log); left out" >&2
  fi
done < <(ninja -C "$BUILD" -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_-]*nccl[A-Za-z0-9_-]*\): phony$/\1/p' |
         grep -v '^cmake_object_order' | grep -E 'test' || true)

find_binary() {
  find "$BUILD" -type f -name "$1" -perm -u+x -not -path '*/CMakeFiles/*' -not -path "$CACHE/*" \
    -not -path '*/gpu_carry/*' 2>/dev/null | head -1
}

rm -rf "$CARRY"
mkdir -p "$CARRY/bin" "$CARRY/lib" "$CACHE"

# Puts file $1 into folder $2 as name $3 (raw or .xz), compressing through the cache with key $4.
put() {
  local src="$1" dir="$2" name="$3" key="$4"
  local size; size=$(stat -L -c %s "$src")
  if [ "$size" -le "$RAW_MAX" ]; then
    cp -L "$src" "$dir/$name"
    return
  fi
  local cached="$CACHE/$name.$key.xz"
  if [ ! -f "$cached" ]; then
    echo "   xz $name ($((size / 1024 / 1024)) MiB)"
    xz -T"$JOBS" -9 -c "$src" > "$cached.tmp"
    mv "$cached.tmp" "$cached"
  fi
  cp "$cached" "$dir/$name.xz"
}

# glibc and the NVIDIA driver are the GPU machine's own; everything else travels.
is_system_lib() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*) return 0 ;;
    libcuda.so*|libnvidia*|libnvrtc*|libcublas*) return 0 ;;
  esac
  return 1
}

echo "== binaries"
declare -A LIBS=()
STRIPPED="$CACHE/stripped"
mkdir -p "$STRIPPED"
glibc_max="GLIBC_2.2.5"
for t in "${TARGETS[@]}" "${OPTIONAL[@]}"; do
  bin=$(find_binary "$t")
  [ -n "$bin" ] || { echo "prepare_carry: built $t but cannot find its binary" >&2; exit 1; }
  strip --strip-all -o "$STRIPPED/$t" "$bin"
  hash=$(sha1sum "$STRIPPED/$t" | cut -c1-16)
  put "$STRIPPED/$t" "$CARRY/bin" "$t" "$hash"
  v=$(objdump -T "$STRIPPED/$t" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 || true)
  [ -n "$v" ] && glibc_max=$(printf '%s\n%s\n' "$glibc_max" "$v" | sort -V | tail -1)
  while read -r soname path; do
    [ -n "$path" ] && LIBS["$soname"]="$path"
  done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
  echo "   $t"
done

echo "== libraries"
for soname in $(printf '%s\n' "${!LIBS[@]}" | sort); do
  is_system_lib "$soname" && continue
  path="${LIBS[$soname]}"
  key="$(stat -L -c %s "$path")"
  put "$path" "$CARRY/lib" "$soname" "$key"
  v=$(objdump -T "$path" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 || true)
  [ -n "$v" ] && glibc_max=$(printf '%s\n%s\n' "$glibc_max" "$v" | sort -V | tail -1)
done

# This machine's glibc, apart (lib/glibc): only for a GPU machine whose glibc is older than
# the binaries need, where run.sh starts every binary through the carried loader.
mkdir -p "$CARRY/lib/glibc"
for soname in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
  path=$(ldconfig -p 2>/dev/null | awk -v n="$soname" '$1 == n && /x86-64/ {print $NF; exit}')
  [ -z "$path" ] && [ "$soname" = ld-linux-x86-64.so.2 ] && path=/lib64/ld-linux-x86-64.so.2
  [ -n "$path" ] && put "$path" "$CARRY/lib/glibc" "$soname" "$(stat -L -c %s "$path")"
done

{
  echo "built $(date -u +%FT%TZ) from $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') (+ working tree) in $BUILD"
  echo "needs glibc >= ${glibc_max#GLIBC_} ($glibc_max); carries glibc $(ldd --version | head -1 | awk '{print $NF}') in lib/glibc"
  echo "binaries: ${TARGETS[*]} ${OPTIONAL[*]}"
  (cd "$CARRY" && find bin lib -type f -printf '%s %p\n' | sort -k2)
} > "$CARRY/MANIFEST"

total=$(du -sb "$CARRY" | cut -f1)
echo "== $CARRY: $((total / 1024)) KiB in $(find "$CARRY" -type f | wc -l) files; needs glibc >= ${glibc_max#GLIBC_}"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "prepare_carry: $CARRY is $((total / 1024 / 1024)) MiB, over the 60 MiB limit" >&2
  find "$CARRY" -type f -printf '%s %p\n' | sort -n | tail -10 >&2
  exit 1
fi
