#!/usr/bin/env bash
# The `uop` command's contract, with fake_uopd as the server (through --embedded, so the
# launch, LISTENING handshake and shutdown are exercised too): verbs and their output,
# files written, exit codes (0 ok, 1 invalid input or failure, 2 usage), and no uopd left
# running afterwards, even when uop itself is killed.
set -u
uop=$1; fake=$2; examples=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
expect() {  # expect CODE CMD...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL: '$*' exited $got, want $want"; cat "$tmp/out" "$tmp/err"; fail=1
  fi
}
has() {  # has FILE TEXT: FILE contains TEXT
  grep -qF -- "$2" "$1" || { echo "FAIL: no '$2' in $1:"; cat "$1"; fail=1; }
}
# A path of our own, so the processes this test starts can be told apart from any other.
ln -s "$(readlink -f "$fake")" "$tmp/uopd"
emb=(--embedded "--uopd=$tmp/uopd")
g=$examples/elementwise.json

# Usage (2) and local failures (1), before any server is involved.
expect 0 "$uop" help;  has "$tmp/out" "usage: uop COMMAND"
expect 0 "$uop" --help
expect 2 "$uop"
expect 2 "$uop" frobnicate "$g"
expect 2 "$uop" run
expect 2 "$uop" stats "$g"
expect 2 "$uop" run "$g" --bogus
expect 2 "$uop" run "$g";  has "$tmp/err" "input a is not bound"
expect 2 "$uop" run "$g" --random x
expect 2 "$uop" run "$g" --random 1 --out nope="$tmp/x.npy"
expect 2 "$uop" run "$g" --in nope="$tmp/x.npy"
expect 2 "$uop" compile "$g" --target=gpu
expect 2 "$uop" stats --embedded --server=127.0.0.1:1
expect 2 "$uop" stats --deadline=0
expect 1 "$uop" run "$tmp/missing.json" --random 1
# Each command takes its own options (stats once took --in and ignored it), and says which.
expect 2 "$uop" stats --in x=y.npy;  has "$tmp/err" "--in is not an option of 'uop stats'"
expect 2 "$uop" compile "$g" --stage=render;  has "$tmp/err" "--stage is not an option of 'uop compile'"
expect 0 "$uop" help run;  has "$tmp/out" "usage: uop run GRAPH"; has "$tmp/out" "--in=NAME=FILE.npy"
expect 0 "$uop" explain --help;  has "$tmp/out" "usage: uop explain GRAPH"
# The help points at nothing a client-only install lacks.
expect 0 "$uop" help
if grep -q "uopc help" "$tmp/out"; then echo "FAIL: uop help points at uopc"; fail=1; fi
head -c 300 /dev/urandom >"$tmp/garbage.uopb"
expect 1 "$uop" compile "$tmp/garbage.uopb"
expect 1 "$uop" stats --embedded --uopd="$tmp/no-such-uopd";  has "$tmp/err" "no-such-uopd"

# An unreachable server: 1, naming the address, from --server and from UOPD_ADDRESS.
expect 1 "$uop" stats --server=127.0.0.1:1 --deadline=1;  has "$tmp/err" "UNAVAILABLE"; has "$tmp/err" "127.0.0.1:1"
UOPD_ADDRESS=127.0.0.1:2 expect 1 "$uop" stats --deadline=1;  has "$tmp/err" "127.0.0.1:2"
expect 1 "$uop" --server 127.0.0.1:3 stats --deadline 1;  has "$tmp/err" "127.0.0.1:3"

# The verbs, each against a private server.
expect 0 "$uop" "${emb[@]}" run "$g" --random 1
has "$tmp/out" "out = float32[12]"
has "$tmp/err" "kernel E_fake "; has "$tmp/err" ": hit (disk)"
expect 0 "$uop" "${emb[@]}" run "$g" --random 1 --out out="$tmp/o1.npy"
[ -s "$tmp/o1.npy" ] || { echo "FAIL: --out wrote nothing"; fail=1; }
# The fake returns its first input: what went in as a file must come back byte for byte.
expect 0 "$uop" "${emb[@]}" run "$g" --in a="$tmp/o1.npy" --in b="$tmp/o1.npy" --out out="$tmp/o2.npy"
cmp -s "$tmp/o1.npy" "$tmp/o2.npy" || { echo "FAIL: run changed the data"; fail=1; }

# Over 1 MiB: the input goes up as a buffer and the output comes down, both in chunks.
n=300000
h="{'descr': '<f4', 'fortran_order': False, 'shape': ($n,), }"
pad=$(( (64 - (10 + ${#h} + 1) % 64) % 64 ))
hl=$(( ${#h} + pad + 1 ))
{ printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $((hl & 255)))\\x$(printf %02x $((hl >> 8)))"
  printf '%s%*s\n' "$h" "$pad" ''; head -c $((4 * n)) /dev/urandom; } >"$tmp/big.npy"
expect 0 "$uop" "${emb[@]}" run "$g" --in a="$tmp/big.npy" --random 2 --out out="$tmp/big-out.npy"
cmp -s <(tail -c $((4 * n)) "$tmp/big.npy") <(tail -c $((4 * n)) "$tmp/big-out.npy") \
  || { echo "FAIL: a large input did not round-trip"; fail=1; }

expect 0 "$uop" "${emb[@]}" compile "$g" --target=cuda:sm_90 --binary-out="$tmp/bin" --source-out="$tmp/src"
has "$tmp/out" "target cuda:sm_90"; has "$tmp/out" "miss, compiled in"; has "$tmp/out" "    slot 0: float32[12] read"
[ -s "$tmp/bin/E_fake.cubin" ] || { echo "FAIL: no binary written"; ls -R "$tmp"; fail=1; }
[ -s "$tmp/src/E_fake.cu" ] || { echo "FAIL: no source written"; fail=1; }
expect 0 "$uop" "${emb[@]}" explain "$g";  has "$tmp/out" "=== decode"
expect 1 "$uop" "${emb[@]}" explain "$g" --stage=bogus;  has "$tmp/err" "unknown stage 'bogus'"; has "$tmp/err" "stages: decode"
expect 0 "$uop" "${emb[@]}" stats;  has "$tmp/out" "workers: 1"; has "$tmp/out" "compiler fake-1"

# A uopd that dies before it listens: 1, with its log.
printf '#!/bin/sh\necho "uopd: port in use" >&2\nexit 4\n' >"$tmp/broken-uopd"; chmod +x "$tmp/broken-uopd"
expect 1 "$uop" stats --embedded --uopd="$tmp/broken-uopd";  has "$tmp/err" "port in use"

if ! command -v pgrep >/dev/null; then echo "pgrep missing (procps): process checks skipped"; exit $fail; fi

# Killing uop (even with SIGKILL) takes its embedded uopd down too: this one listens on a
# dead port, so uop sits in connect() until it is killed.
printf '#!/bin/sh\ntrap "exit 0" TERM\necho LISTENING 127.0.0.1:1\nwhile :; do sleep 0.05; done\n' >"$tmp/hang-uopd"
chmod +x "$tmp/hang-uopd"
"$uop" stats --embedded --uopd="$tmp/hang-uopd" --deadline=30 >/dev/null 2>&1 &
upid=$!
for _ in $(seq 100); do pgrep -f "$tmp/hang-uopd" >/dev/null && break; sleep 0.05; done
pgrep -f "$tmp/hang-uopd" >/dev/null || { echo "FAIL: the hanging uopd never started"; fail=1; }
kill -KILL "$upid"; wait "$upid" 2>/dev/null
for _ in $(seq 100); do pgrep -f "$tmp/hang-uopd" >/dev/null || break; sleep 0.05; done
if pgrep -f "$tmp/hang-uopd" >/dev/null; then echo "FAIL: uopd outlived a killed uop"; fail=1; fi

# Nothing this test started is still running.
if pgrep -f "$tmp/uopd" >/dev/null; then echo "FAIL: an embedded uopd is still running"; pgrep -af "$tmp/uopd"; fail=1; fi
exit $fail
