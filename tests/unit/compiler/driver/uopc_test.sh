#!/usr/bin/env bash
# uopc's command line contract: every example verifies, prints, digests and simplifies;
# conversions keep the digest; bad files exit 1, bad usage exits 2.
set -u
uopc=$1; examples=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
expect() {  # expect CODE CMD...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: '$*' exited $got, want $want"; cat "$tmp/out" "$tmp/err"; fail=1
  fi
}
for g in "$examples"/*.json; do
  expect 0 "$uopc" verify "$g"
  expect 0 "$uopc" print "$g"
  grep -q '^\[' "$tmp/out" || { echo "FAIL: print $g printed no tree"; fail=1; }
  expect 0 "$uopc" digest "$g"; d1=$(cat "$tmp/out")
  expect 0 "$uopc" simplify "$g" -o "$tmp/s.json"
  expect 0 "$uopc" verify "$tmp/s.json"
  expect 0 "$uopc" convert "$g" "$tmp/g.uopb"
  expect 0 "$uopc" digest "$tmp/g.uopb"; d2=$(cat "$tmp/out")
  [ "$d1" = "$d2" ] || { echo "FAIL: $g digest changed through .uopb: $d1 vs $d2"; fail=1; }
done
head -c 300 /dev/urandom >"$tmp/garbage.uopb"
expect 1 "$uopc" verify "$tmp/garbage.uopb"
echo '{"format_version": 1, "nodes": [{"op": "ADD", "src": [0, 1]}]}' >"$tmp/fwd.json"
expect 1 "$uopc" verify "$tmp/fwd.json"
grep -q 'codec.topological' "$tmp/err" || { echo "FAIL: forward reference not named"; cat "$tmp/err"; fail=1; }
expect 1 "$uopc" print "$tmp/does-not-exist.json"
expect 2 "$uopc"
expect 2 "$uopc" frobnicate "$examples/matmul.json"
expect 2 "$uopc" verify
expect 2 "$uopc" verify "$examples/matmul.json" --stage=bogus
expect 2 "$uopc" verify "$examples/matmul.json" --bogus
expect 0 "$uopc" --help
has() {  # has FILE TEXT: FILE contains TEXT
  grep -qF -- "$2" "$1" || { echo "FAIL: no '$2' in $1:"; cat "$1"; fail=1; }
}
m=$examples/matmul.json
# Values after '=' or a space; each command takes its own options, and --stage means one
# thing per command: verify's IR level, explain's pipeline stage.
expect 0 "$uopc" verify "$m" --stage tensor;  has "$tmp/out" "ok (tensor level"
expect 1 "$uopc" verify "$m" --stage=kernel
expect 2 "$uopc" verify "$m" --stage=linearize;  has "$tmp/err" "--stage takes tensor, kernel or linear, got 'linearize'"
expect 0 "$uopc" explain "$m" --stage verify;  has "$tmp/out" "=== verify"
expect 2 "$uopc" explain "$m" --stage=kernel;  has "$tmp/err" "unknown stage 'kernel'"
expect 2 "$uopc" run "$m" --stage=kernel;  has "$tmp/err" "--stage is not an option of 'uopc run'"
expect 2 "$uopc" digest "$m" --in x=y.npy;  has "$tmp/err" "--in is not an option of 'uopc digest'"
expect 2 "$uopc" convert "$m";  has "$tmp/err" "'uopc convert' needs OUT"
expect 2 "$uopc" print "$m" extra;  has "$tmp/err" "unexpected argument 'extra' for 'uopc print'"
expect 0 "$uopc" help explain;  has "$tmp/out" "usage: uopc explain GRAPH"; has "$tmp/out" "stages (explain --stage):"
expect 0 "$uopc" run --help;  has "$tmp/out" "--check"
exit $fail
