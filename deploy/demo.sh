#!/usr/bin/env bash
# The main demo, from a fresh clone on Debian 12: installs what is missing, builds the
# release preset, starts uopd as the embedded default would (loopback, two CPU workers,
# a disk cache, metrics) and runs every example graph through it with the `uop` client:
# each kernel misses the compile cache once, hits it in memory on the next run, and hits
# it on disk after uopd restarts. Then data-parallel training (uop-train-demo): a small
# MLP on two spirals, the batch sharded over CPU:0 and CPU:1, the gradients allreduced
# between the two workers every step; per step the loss, the compile cache's hits and
# misses, and where the time went. Nothing is left running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target uopd uop-worker uop uopc uop-train-demo

bin=build/release
work=$(mktemp -d)
trap 'kill -TERM $pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

start_uopd() {
  # A fresh cache directory for the demo, so the first run is a real miss.
  "$bin/server/uopd" --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 --cache-dir="$work/cache" \
    >"$work/uopd.out" 2>"$work/uopd.log" &
  pid=$!
  for _ in $(seq 1 200); do grep -q '^LISTENING ' "$work/uopd.out" && break; sleep 0.1; done
  UOPD_ADDRESS=$(awk '/^LISTENING / {print $2}' "$work/uopd.out")
  export UOPD_ADDRESS
  sed -n 's/^uopd: serving/uopd serving/p' "$work/uopd.log"
}

start_uopd
for g in examples/*.json; do
  echo
  echo "=== $g"
  "$bin/compiler/uopc" verify "$g"
  echo "--- first run: compiled"
  "$bin/client/uop" run "$g" --random 1
  echo "--- second run: cached"
  "$bin/client/uop" run "$g" --random 1 2>&1 | grep -E '^kernel'
done

echo
echo "=== uopd restarted: its disk cache answers"
kill -TERM $pid; wait $pid || true
start_uopd
for g in examples/*.json; do "$bin/client/uop" run "$g" --random 1 2>&1 | grep -E '^kernel'; done
echo
"$bin/client/uop" stats

echo
echo "=== data-parallel training on CPU:0 + CPU:1 (one Run per step: forward, backward, allreduce, SGD)"
"$bin/client/uop-train-demo" --steps=40
