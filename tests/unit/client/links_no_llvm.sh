#!/bin/sh
# The `uop` binary (and the client library in it) must not load LLVM or CUDA (docs/ARCHITECTURE.md, Arrows):
# fails if ldd lists libLLVM, libcuda, libcudart, libnvrtc or libnccl.
set -u
bin=$1
deps=$(ldd "$bin") || { echo "FAIL: ldd $bin failed"; exit 1; }
bad=$(printf '%s\n' "$deps" | grep -Ei 'libLLVM|libclang|libcuda|libcudart|libnvrtc|libnccl')
if [ -n "$bad" ]; then
  echo "FAIL: $bin links what the client must not:"; printf '%s\n' "$bad"; exit 1
fi
echo "ok: $bin links no LLVM or CUDA"
