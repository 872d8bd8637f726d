#!/usr/bin/env bash
# `uop` against the real uopd (and its uop-worker processes) on loopback: every example
# runs through --embedded with the same results as `uopc run` on this machine; against
# one long-lived server the second compile of a graph is a cache hit; stats show the
# work; `run --profile` names the kernels as `compile` does; `compile --schedule` makes
# another cache entry of the same kernel and refuses a schedule that does not fit; nothing
# started here is left running.
#   uop_cli_test.sh UOP UOPD UOPC EXAMPLES
set -u
uop=$1; uopd=$2; uopc=$3; examples=$4
tmp=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
expect() {  # expect CODE CMD...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: '$*' exited $got, want $want"; cat "$tmp/out" "$tmp/err"; fail=1
  fi
}
has() {  # has FILE TEXT
  grep -qF -- "$2" "$1" || { echo "FAIL: no '$2' in $1:"; cat "$1"; fail=1; }
}
# The disk cache of every server here lives in $tmp, not in the user's cache directory.
export XDG_CACHE_HOME=$tmp/xdg
# A path of our own for uopd, so the processes this test starts can be told apart.
ln -s "$(readlink -f "$uopd")" "$tmp/uopd"
emb=(--embedded "--uopd=$tmp/uopd")

# Every example, through a private server: the same outputs as uopc computes here.
for g in "$examples"/*.json; do
  expect 0 "$uop" "${emb[@]}" run "$g" --random 1
  cp "$tmp/out" "$tmp/uop.out"; cp "$tmp/err" "$tmp/uop.err"
  grep -q '^kernel .*: \(miss, compiled in\|hit\|coalesced\)' "$tmp/uop.err" \
    || { echo "FAIL: $g: no kernel cache status on stderr"; cat "$tmp/uop.err"; fail=1; }
  expect 0 "$uopc" run "$g" --random 1
  if ! diff -q "$tmp/out" "$tmp/uop.out" >/dev/null; then
    # Reductions may be reassociated differently; anything else must match bit for bit.
    echo "NOTE: $g: uop and uopc outputs differ:"; diff "$tmp/out" "$tmp/uop.out"
    case "$g" in *elementwise*|*kernel_sink*) fail=1 ;; esac
  fi
  expect 0 "$uop" "${emb[@]}" explain "$g";  has "$tmp/out" "=== "
done

g=$examples/elementwise.json
expect 0 "$uop" "${emb[@]}" run "$g" --random 3 --out out="$tmp/o.npy"
expect 0 "$uop" "${emb[@]}" run "$g" --in a="$tmp/o.npy" --in b="$tmp/o.npy"
expect 0 "$uopc" run "$g" --in a="$tmp/o.npy" --in b="$tmp/o.npy"
cp "$tmp/out" "$tmp/uopc.out"
expect 0 "$uop" "${emb[@]}" run "$g" --in a="$tmp/o.npy" --in b="$tmp/o.npy"
diff -q "$tmp/out" "$tmp/uopc.out" >/dev/null || { echo "FAIL: --in results differ from uopc"; fail=1; }
# Over 1 MiB per tensor: inputs go up as buffers and outputs come down, in chunks.
sed -e 's/"size": "12"/"size": "300000"/g' -e 's/{"i": "3"}, {"i": "4"}/{"i": "600"}, {"i": "500"}/' "$g" >"$tmp/big.json"
expect 0 "$uop" "${emb[@]}" run "$tmp/big.json" --random 1 --out out="$tmp/big-uop.npy"
expect 0 "$uopc" run "$tmp/big.json" --random 1 --out out="$tmp/big-uopc.npy"
cmp -s "$tmp/big-uop.npy" "$tmp/big-uopc.npy" || { echo "FAIL: large tensors differ from uopc"; fail=1; }
expect 1 "$uop" "${emb[@]}" explain "$g" --stage=no-such-stage
expect 0 "$uop" "${emb[@]}" compile "$g" --binary-out="$tmp/bin"
ls "$tmp/bin"/*.o >/dev/null 2>&1 || { echo "FAIL: compile --binary-out wrote no objects"; fail=1; }

# One long-lived server: a repeated compile hits the memory cache; stats count the work.
"$tmp/uopd" --listen=127.0.0.1:0 --metrics-listen= --workers=1 --cache-dir="$tmp/cache" >"$tmp/server.out" 2>"$tmp/server.err" &
server_pid=$!
addr=
for _ in $(seq 300); do
  addr=$(sed -n 's/^LISTENING //p' "$tmp/server.out" | head -1)
  [ -n "$addr" ] && break; sleep 0.1
done
if [ -z "$addr" ]; then
  echo "FAIL: uopd printed no LISTENING line"; cat "$tmp/server.err"; exit 1
fi
expect 0 "$uop" --server="$addr" compile "$g";  has "$tmp/out" "miss, compiled in"
expect 0 "$uop" --server="$addr" compile "$g";  has "$tmp/out" "hit (memory)"
UOPD_ADDRESS=$addr expect 0 "$uop" run "$g" --random 1;  has "$tmp/err" "hit (memory)"
# --profile: a table whose one row is the kernel `uop compile` named, run once.
expect 0 "$uop" --server="$addr" compile "$g";  kernel=$(sed -n 2p "$tmp/out" | awk '{print $1}')
expect 0 "$uop" --server="$addr" run "$g" --random 1 --profile
has "$tmp/out" "GFLOPS"
grep -qE "^$kernel +1 " "$tmp/out" || { echo "FAIL: no profile row for kernel '$kernel' launched once"; cat "$tmp/out"; fail=1; }
# --schedule: the kernel compiled with a loop schedule of ours is another cache entry of
# the same digest, whose ABI names the schedule; runs give what the heuristic's kernel
# gives; a schedule that does not fit or names no kernel is refused naming the step or the
# digest, and the server goes on serving.
expect 0 "$uop" --server="$addr" compile "$g";  digest=$(sed -n 2p "$tmp/out" | awk '{print $2}')
expect 0 "$uop" --server="$addr" compile "$g" --schedule='split(1,2,loop);thread(0)'
has "$tmp/out" "miss, compiled in";  has "$tmp/out" "schedule 25:split(1,2,loop);thread(0)"
[ "$(sed -n 2p "$tmp/out" | awk '{print $2}')" = "$digest" ] || { echo "FAIL: a schedule changed the kernel's digest"; cat "$tmp/out"; fail=1; }
expect 0 "$uop" --server="$addr" compile "$g" --schedule='split(1,2,loop);thread(0)';  has "$tmp/out" "hit (memory)"
expect 1 "$uop" --server="$addr" compile "$g" --schedule='split(7,2,upcast)'
has "$tmp/err" 'schedule step 0 "split(7,2,upcast)": the kernel has no axis 7'
expect 1 "$uop" --server="$addr" compile "$g" --schedule='split(1,1000000000,upcast)';  has "$tmp/err" "the factor must be in [2, 4]"
expect 1 "$uop" --server="$addr" compile "$g" --schedule='split(1,2,upcast);;';  has "$tmp/err" "schedule step 1 is empty"
expect 1 "$uop" --server="$addr" compile "$g" --schedule="0123abcd=split(1,2,upcast)";  has "$tmp/err" "no kernel of digest '0123abcd'"
expect 0 "$uop" --server="$addr" compile "$g" --schedule="$digest=split(1,2,upcast)";  has "$tmp/out" "schedule 17:split(1,2,upcast)"
expect 0 "$uop" --server="$addr" compile "$g";  has "$tmp/out" "hit (memory)"
expect 0 "$uopc" compile "$g" --schedule='split(1,2,loop);thread(0)';  has "$tmp/out" "schedule = split(1,2,loop);thread(0)"
expect 1 "$uopc" compile "$g" --schedule='thread(1)';  has "$tmp/err" "is not the STORE's outermost loop"
expect 0 "$uop" --server="$addr" explain "$g" --stage=optimize;  has "$tmp/out" "schedule: split(1,4,upcast)"
expect 0 "$uop" --server="$addr" stats
has "$tmp/out" "workers: 1"
grep -q 'hits [1-9][0-9]* memory' "$tmp/out" || { echo "FAIL: stats count no memory hits"; cat "$tmp/out"; fail=1; }
kill -TERM "$server_pid"; wait "$server_pid"; rc=$?; server_pid=
[ "$rc" -eq 0 ] || { echo "FAIL: uopd exited $rc on SIGTERM"; cat "$tmp/server.err"; fail=1; }
expect 1 "$uop" --server="$addr" stats --deadline=2;  has "$tmp/err" "UNAVAILABLE"

if command -v pgrep >/dev/null && pgrep -f "$tmp/uopd" >/dev/null; then echo "FAIL: a uopd is still running:"; pgrep -af "$tmp/uopd"; fail=1; fi
exit $fail
