#!/usr/bin/env bash
# A uopd cluster on this machine: one scheduler, N workers registering with it by address,
# and optionally a Redis shared cache tier. Scheduler and workers share a cluster secret,
# STATE_DIR/cluster-secret (made at the first start, mode 0600): the workers register at
# the scheduler's internal listener with it, and take calls only from who has it. Pids,
# addresses and namespaces go to STATE_DIR/cluster.env, which `stop` / `--netns down` read.
#
#   deploy/cluster.sh start [--workers N] [--worker-threads N] [--redis] [--state DIR] [--bin DIR]
#                           [-- UOPD_FLAGS...]
#   deploy/cluster.sh status [--state DIR]
#   deploy/cluster.sh stop [--state DIR]
#
# Every process listens on 127.0.0.1 on a free port. Or, as hosts of their own (root only):
#
#   deploy/cluster.sh --netns up [--workers N] [--worker-threads N] [--redis] [--schedulers 1|2]
#                                [--prefix NAME] [--state DIR] [--bin DIR] [-- UOPD_FLAGS...]
#   deploy/cluster.sh --netns train [--state DIR] [-- UOP_TRAIN_DEMO_FLAGS...]
#   deploy/cluster.sh --netns bench [--state DIR] [-- BENCH_TRAIN_FLAGS...]
#   deploy/cluster.sh --netns exec HOST [--state DIR] -- COMMAND...
#   deploy/cluster.sh --netns status|down [--state DIR]
#
# Each "host" is a Linux network namespace, PREFIX-HOST, with one interface, eth0, on a
# bridge in PREFIX-sw (the switch), in 10.77.0.0/24 (private to these namespaces, so two
# clusters with different prefixes do not clash): s0 10.77.0.1 runs uopd, w0..wN-1
# 10.77.0.10.. a uop-worker each (devices CPU:0..; workers on different hosts reduce over
# Gloo, not shared memory), redis 10.77.0.3 the Redis tier (with a password), s1 10.77.0.2
# a second uopd with its own embedded workers sharing that Redis (--schedulers 2, which
# needs --redis). `train` runs uop-train-demo on s0 against its uopd over the workers;
# `bench` runs bench_train's BM_TrainStepAcrossHosts on s0: a step there against the same
# step on one host's shared memory (a peer it starts), both p50s and their ratio; `exec
# HOST` runs a command on a host with UOPD_ADDRESS set to that host's uopd (s0's
# elsewhere). `down` stops every process and deletes the namespaces; so does a failed `up`.
#
#   --workers N   uop-worker processes (devices CPU:0 .. CPU:N-1)                [2]
#   --redis       start a redis-server for the cluster's shared cache tier (and make the
#                 key its entries are authenticated with, STATE_DIR/cache.key, mode 0600)
#   --worker-threads N  kernel threads per worker                 [the machine's cores]
#   --schedulers  (--netns) 2: a second scheduler sharing the Redis tier           [1]
#   --prefix NAME (--netns) the namespaces' names begin with NAME-                 [uopd]
#   --state DIR   where pids, addresses, logs and the disk caches live [/tmp/uopd-cluster]
#   --bin DIR     build tree holding server/uopd and worker/uop-worker [build/release]
# After `start`, `export UOPD_ADDRESS=...` as printed and use `uop`.
# Exit status: 0 done; 1 a failure; 2 usage; 3 (--netns up) no namespaces can be made here.
set -euo pipefail
cd "$(dirname "$0")/.."

# The comment above, up to its first line that is not one.
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit "${1:-2}"; }
cmd=${1:-}; shift || true
netns=0
if [ "$cmd" = --netns ]; then netns=1 cmd=${1:-}; shift || true; fi
case "$cmd" in -h|--help|help) usage 0 ;; esac
workers=2 threads="" redis=0 schedulers=1 prefix=uopd state=/tmp/uopd-cluster bin=build/release extra=() host=""
[ "$netns" = 1 ] && [ "$cmd" = exec ] && { host=${1:-}; shift || true; }
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --redis) redis=1; shift ;;
    --worker-threads) threads=$2; shift 2 ;;
    --schedulers) schedulers=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --state) state=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "cluster.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
env_file=$state/cluster.env
case "$workers" in ''|*[!0-9]*) echo "cluster.sh: --workers takes a number" >&2; exit 2 ;; esac
[ "$workers" -le 200 ] || { echo "cluster.sh: --workers: at most 200" >&2; exit 2; }
case "$threads" in *[!0-9]*) echo "cluster.sh: --worker-threads takes a number" >&2; exit 2 ;; esac
case "$schedulers" in 1|2) ;; *) echo "cluster.sh: --schedulers is 1 or 2" >&2; exit 2 ;; esac
[ "$schedulers" = 1 ] || [ "$redis" = 1 ] || { echo "cluster.sh: --schedulers 2 shares a Redis tier: add --redis" >&2; exit 2; }
# A namespace's name is a file name; keep it to what ip(8) and logs show plainly.
case "$prefix" in ''|*[!A-Za-z0-9_.-]*) echo "cluster.sh: --prefix: letters, digits, '_', '.', '-'" >&2; exit 2 ;; esac
[ "${#prefix}" -le 40 ] || { echo "cluster.sh: --prefix: at most 40 characters" >&2; exit 2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
  shuf -i 20000-60000 -n 1; }

# Runs "$@" every 0.1 s until it succeeds, while process $1 lives, for at most 20 s; else
# fails, naming $2 (what it waited for).
wait_for() {
  local pid=$1 what=$2; shift 2
  for _ in $(seq 1 200); do
    "$@" && return 0
    kill -0 "$pid" 2>/dev/null || { echo "cluster.sh: process $pid exited while waiting for $what" >&2; return 1; }
    sleep 0.1
  done
  echo "cluster.sh: no $what within 20 s" >&2
  return 1
}

# Waits until a line of log $1 (of process $2) matches the extended regex $3.
wait_line() { wait_for "$2" "line like '$3' in $1" grep -Eqs "$3" "$1"; }

# Waits for a "LISTENING host:port" line (or another WORD: INTERNAL) in a log; prints host:port.
wait_listening() {
  local log=$1 pid=$2 word=${3:-LISTENING}
  wait_line "$log" "$pid" "^$word " && awk -v w="$word" '$1 == w {print $2; exit}' "$log"
}

# The command prefix that runs a process on host $1 (nothing outside --netns).
on() { if [ "$netns" = 1 ]; then echo "ip netns exec $prefix-$1"; fi; }

# A redis-server at $1:$2 on host $3, its entries' key in STATE/cache.key and a password
# in STATE/redis-password (both made once, mode 0600; the password reaches redis-server in
# a config file, never in argv). Sets redis_pid and redis_flag.
start_redis() {
  local ip=$1 port=$2 where=$3
  [ -s "$state/cache.key" ] || (umask 077 && head -c 32 /dev/urandom >"$state/cache.key")
  [ -s "$state/redis-password" ] || (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$state/redis-password")
  (umask 077 && printf 'bind %s\nport %s\nsave ""\nappendonly no\nrequirepass %s\n' "$ip" "$port" \
    "$(cat "$state/redis-password")" >"$state/redis.conf")
  $(on "$where") redis-server "$state/redis.conf" >"$state/redis.log" 2>&1 &
  redis_pid=$!
  # Schedulers sharing a Redis authenticate its entries with one key.
  redis_flag=(--redis="$ip:$port" --cache-key-file="$state/cache.key" --redis-password-file="$state/redis-password")
  wait_for "$redis_pid" "answer from redis-server at $ip:$port (see $state/redis.log)" redis_answers "$ip" "$port" "$where"
}

redis_answers() {
  REDISCLI_AUTH=$(cat "$state/redis-password") $(on "$3") redis-cli -h "$1" -p "$2" ping 2>/dev/null | grep -q PONG
}

# uopd on host $2 listening on $1 (its client API, internal services and /metrics), logs
# STATE/$3.{out,log}, with the flags after $4 (its disk cache: STATE/cache-$3), once it
# serves. Sets uopd_pid, addr, internal and metrics (the /metrics address).
start_uopd() {
  local ip=$1 where=$2 name=$3; shift 3
  $(on "$where") "$bin/server/uopd" --listen="$ip:0" --internal-listen="$ip:0" --metrics-listen="$ip:0" \
    --cluster-secret-file="$secret" --cache-dir="$state/cache-$name" "$@" >"$state/$name.out" 2>"$state/$name.log" &
  uopd_pid=$!
  addr=$(wait_listening "$state/$name.out" "$uopd_pid")
  internal=$(wait_listening "$state/$name.out" "$uopd_pid" INTERNAL)
  wait_line "$state/$name.log" "$uopd_pid" '^uopd: serving '
  metrics=$(sed -n 's|.*metrics on http://\([^/]*\)/metrics.*|\1|p' "$state/$name.log" | head -1)
}

# uop-worker I on host $2 listening on $1, registering at $internal. Appends to worker_pids.
start_worker() {
  local ip=$1 where=$2 i=$3
  $(on "$where") "$bin/worker/uop-worker" --device="cpu:$i" --listen="$ip:0" --scheduler="$internal" \
    --cluster-secret-file="$secret" ${threads:+--threads="$threads"} >"$state/worker$i.out" 2>"$state/worker$i.log" &
  worker_pids="$worker_pids $!"
  wait_listening "$state/worker$i.out" "$!" >/dev/null
}

# Workers register in the background: wait until the scheduler (pid $1, log $2) has $3.
wait_registered() {
  wait_for "$1" "$3 workers registered (see $2 and $state/worker*.log)" registered_at_least "$2" "$3"
}
registered_at_least() { [ "$(grep -c "registered" "$1" 2>/dev/null || true)" -ge "$2" ]; }

make_secret() {
  mkdir -p "$state"
  secret=$state/cluster-secret
  if [ ! -s "$secret" ]; then
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$secret")
  fi
  chmod 600 "$secret"
}

need_binaries() {
  [ -x "$bin/server/uopd" ] && [ -x "$bin/worker/uop-worker" ] ||
    { echo "cluster.sh: build first: $bin/server/uopd and $bin/worker/uop-worker are missing" >&2; exit 1; }
  [ -f "$env_file" ] && { echo "cluster.sh: a cluster is running ($env_file); stop it first" >&2; exit 1; }
  return 0
}

# cluster.env's variables, or a message and exit 1 when there is no cluster in $state.
load_env() {
  [ -f "$env_file" ] || { echo "cluster.sh: no cluster in $state" >&2; exit 1; }
  # shellcheck disable=SC1090
  . "$env_file"
}

# An EXIT trap while starting: a start that fails takes down what it made.
stop_on_failure() {
  local rc=$?
  [ "$rc" = 0 ] || { echo "cluster.sh: $cmd failed; stopping what it started" >&2; stop >/dev/null; }
  exit "$rc"
}

# Stops what cluster.env names (by pid), then whatever else still runs in its namespaces
# (they are this cluster's own), and deletes the namespaces.
stop() {
  [ -f "$env_file" ] || { echo "cluster.sh: no cluster in $state" >&2; return 0; }
  local UOPD_PID="" UOPD2_PID="" WORKER_PIDS="" REDIS_PID="" NETNS=""
  load_env
  local pids="$WORKER_PIDS $UOPD_PID $UOPD2_PID $REDIS_PID" ns
  for ns in $NETNS; do pids="$pids $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"; done
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $pids; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  for ns in $NETNS; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -f "$env_file"
  echo "cluster.sh: stopped${NETNS:+; namespaces $NETNS deleted}"
}

# The cluster so far, written after each step so that `stop` (and a failed `up`) finds it.
save_env() {
  cat >"$env_file" <<EOF
UOPD_ADDRESS=${addr:-}
UOPD_INTERNAL=${internal:-}
UOPD_PID=${uopd_pid:-}
UOPD_METRICS=${metrics:-}
UOPD2_ADDRESS=${addr2:-}
UOPD2_PID=${uopd2_pid:-}
UOPD2_METRICS=${metrics2:-}
WORKER_PIDS="${worker_pids:-}"
REDIS_PID=${redis_pid:-}
NETNS="${netns_made:-}"
NETNS_PREFIX=$prefix
EOF
}

# Namespace PREFIX-$1 with lo up and eth0 at $2/24 on the switch's bridge.
add_host() {
  local ns=$prefix-$1
  ip netns add "$ns" || return 1
  netns_made="$netns_made $ns"; save_env
  ip -n "$ns" link set lo up
  ip -n "$prefix-sw" link add "h-$1" type veth peer name eth0 netns "$ns"
  ip -n "$prefix-sw" link set "h-$1" master br0 up
  ip -n "$ns" addr add "$2/24" dev eth0
  ip -n "$ns" link set eth0 up
}

netns_up() {
  [ "$(id -u)" = 0 ] || { echo "cluster.sh: --netns needs root (ip netns add)" >&2; exit 3; }
  command -v ip >/dev/null || { echo "cluster.sh: --netns needs ip(8) (iproute2)" >&2; exit 3; }
  [ "$redis" = 0 ] || command -v redis-server >/dev/null || { echo "cluster.sh: --redis needs redis-server" >&2; exit 1; }
  need_binaries
  if ip netns list | awk '{print $1}' | grep -q "^$prefix-"; then
    echo "cluster.sh: namespaces named $prefix-* exist; '--netns down' them or pick another --prefix" >&2
    exit 1
  fi
  make_secret
  netns_made="" worker_pids="" redis_pid="" redis_flag=() addr="" internal="" uopd_pid="" metrics="" addr2="" uopd2_pid="" metrics2=""
  # A failure from here on takes down what was made.
  trap stop_on_failure EXIT
  if ! ip netns add "$prefix-sw" 2>"$state/netns.err"; then
    echo "cluster.sh: cannot make network namespaces here: $(cat "$state/netns.err")" >&2; trap - EXIT; exit 3
  fi
  netns_made="$prefix-sw"; save_env
  if ! ip -n "$prefix-sw" link add br0 type bridge 2>"$state/netns.err"; then
    echo "cluster.sh: cannot make a bridge in a namespace: $(cat "$state/netns.err")" >&2
    stop >/dev/null; trap - EXIT; exit 3
  fi
  ip -n "$prefix-sw" link set br0 up
  add_host s0 10.77.0.1
  for i in $(seq 0 $((workers - 1))); do add_host "w$i" "10.77.0.$((10 + i))"; done
  [ "$redis" = 0 ] || add_host redis 10.77.0.3
  [ "$schedulers" = 1 ] || add_host s1 10.77.0.2
  [ "$redis" = 0 ] || { start_redis 10.77.0.3 6379 redis; save_env; }
  start_uopd 10.77.0.1 s0 uopd --workers=0 "${redis_flag[@]}" "${extra[@]}"
  save_env
  for i in $(seq 0 $((workers - 1))); do start_worker "10.77.0.$((10 + i))" "w$i" "$i"; save_env; done
  wait_registered "$uopd_pid" "$state/uopd.log" "$workers"
  if [ "$schedulers" = 2 ]; then
    local a=$addr in=$internal p=$uopd_pid m=$metrics
    start_uopd 10.77.0.2 s1 uopd2 --workers="$workers" ${threads:+--worker-threads="$threads"} "${redis_flag[@]}" "${extra[@]}"
    addr2=$addr uopd2_pid=$uopd_pid metrics2=$metrics addr=$a internal=$in uopd_pid=$p metrics=$m
  fi
  save_env
  trap - EXIT
  echo "cluster.sh: uopd at $addr on $prefix-s0, workers on$(for i in $(seq 0 $((workers - 1))); do printf ' %s' "$prefix-w$i"; done)${redis_pid:+, redis on $prefix-redis}${addr2:+, a second uopd at $addr2 on $prefix-s1}; logs in $state"
  echo "deploy/cluster.sh --netns train --state $state    # or: --netns exec s0 --state $state -- $bin/client/uop stats"
}

# Runs "$@" on host $host with UOPD_ADDRESS set to that host's uopd (s0's elsewhere).
netns_exec() {
  load_env
  [ -n "${NETNS_PREFIX:-}" ] && [ -n "${NETNS:-}" ] || { echo "cluster.sh: the cluster in $state is not --netns" >&2; exit 1; }
  case " $NETNS " in *" $NETNS_PREFIX-$host "*) ;; *)
    echo "cluster.sh: no host '$host' (hosts: $(echo "$NETNS" | tr ' ' '\n' | sed -n "s/^$NETNS_PREFIX-//p" | grep -v '^sw$' | tr '\n' ' '))" >&2
    exit 2 ;;
  esac
  [ $# -gt 0 ] || { echo "cluster.sh: --netns exec HOST -- COMMAND..." >&2; exit 2; }
  local a=$UOPD_ADDRESS
  [ "$host" = s1 ] && a=$UOPD2_ADDRESS
  UOPD_ADDRESS=$a exec ip netns exec "$NETNS_PREFIX-$host" "$@"
}

start() {
  need_binaries
  make_secret
  worker_pids="" redis_pid="" redis_flag=() netns_made=""
  trap stop_on_failure EXIT
  [ "$redis" = 0 ] || { start_redis 127.0.0.1 "$(free_port)" ""; save_env; }
  start_uopd 127.0.0.1 "" uopd --workers=0 "${redis_flag[@]}" "${extra[@]}"
  save_env
  for i in $(seq 0 $((workers - 1))); do start_worker 127.0.0.1 "" "$i"; save_env; done
  wait_registered "$uopd_pid" "$state/uopd.log" "$workers"
  trap - EXIT
  echo "cluster.sh: uopd at $addr (pid $uopd_pid), $workers workers${redis_pid:+, redis pid $redis_pid}; logs in $state"
  echo "export UOPD_ADDRESS=$addr"
}

case "$netns:$cmd" in
  0:start) start ;;
  0:status|1:status)
    load_env
    cat "$env_file"
    ;;
  0:stop|1:down) stop ;;
  1:up) netns_up ;;
  1:exec) netns_exec "${extra[@]}" ;;
  1:train)
    host=s0
    [ -x "$bin/client/uop-train-demo" ] || { echo "cluster.sh: build first: $bin/client/uop-train-demo is missing" >&2; exit 1; }
    load_env
    devices=""
    for i in $(seq 0 $(($(echo "${WORKER_PIDS:-}" | wc -w) - 1))); do devices="$devices${devices:+,}CPU:$i"; done
    netns_exec "$bin/client/uop-train-demo" --devices="$devices" "${extra[@]}"
    ;;
  1:bench)
    host=s0
    [ -x "$bin/tests/bench/bench_train" ] || { echo "cluster.sh: build first: $bin/tests/bench/bench_train is missing" >&2; exit 1; }
    load_env
    netns_exec env UOPD_BENCH_ACROSS_HOSTS="$UOPD_ADDRESS" "$bin/tests/bench/bench_train" \
      --benchmark_filter=AcrossHosts --benchmark_counters_tabular=true "${extra[@]}"
    ;;
  *) usage 2 ;;
esac
