#!/usr/bin/env bash
# The main demo on the embedded default, from a fresh clone on Debian 12: installs what is
# missing, builds the release preset, then verifies, prints and simplifies every example
# graph with uopc.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target uopc
uopc=build/release/compiler/uopc
for g in examples/*.json; do
  echo "=== $g"
  $uopc verify "$g"
  $uopc print "$g"
  echo "--- simplified"
  $uopc simplify "$g"
done
