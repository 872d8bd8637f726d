#!/usr/bin/env bash
# A local uopd cluster: one scheduler, N workers registering with it by address, and
# optionally a Redis shared cache tier. Every process listens on 127.0.0.1 on a free port;
# their pids and addresses go to STATE_DIR/cluster.env, which `stop` reads. Scheduler and
# workers share a cluster secret, STATE_DIR/cluster-secret (made at the first start, mode
# 0600): the workers register at the scheduler's internal listener with it, and take
# calls only from who has it.
#
#   deploy/cluster.sh start [--workers N] [--redis] [--state DIR] [--bin DIR] [-- UOPD_FLAGS...]
#   deploy/cluster.sh status [--state DIR]
#   deploy/cluster.sh stop [--state DIR]
#
#   --workers N   uop-worker processes (devices CPU:0 .. CPU:N-1)                [2]
#   --redis       start a redis-server for the cluster's shared cache tier (and make the
#                 key its entries are authenticated with, STATE_DIR/cache.key, mode 0600)
#   --state DIR   where pids, addresses, logs and the disk cache live  [/tmp/uopd-cluster]
#   --bin DIR     build tree holding server/uopd and worker/uop-worker [build/release]
# After `start`, `export UOPD_ADDRESS=...` as printed and use `uop`.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:-}; shift || true
workers=2 redis=0 state=/tmp/uopd-cluster bin=build/release extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --redis) redis=1; shift ;;
    --state) state=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "cluster.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
env_file=$state/cluster.env

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
  shuf -i 20000-60000 -n 1; }

# Waits for a "LISTENING host:port" line (or another WORD: INTERNAL) in a log; prints host:port.
wait_listening() {
  local log=$1 pid=$2 word=${3:-LISTENING}
  for _ in $(seq 1 200); do
    if grep -q "^$word " "$log" 2>/dev/null; then awk -v w="$word" '$1 == w {print $2; exit}' "$log"; return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "cluster.sh: process $pid exited; see $log" >&2; return 1; }
    sleep 0.1
  done
  echo "cluster.sh: no $word line from $pid within 20 s; see $log" >&2
  return 1
}

stop() {
  [ -f "$env_file" ] || { echo "cluster.sh: no cluster in $state" >&2; return 0; }
  # shellcheck disable=SC1090
  . "$env_file"
  for pid in $WORKER_PIDS $UOPD_PID $REDIS_PID; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $WORKER_PIDS $UOPD_PID $REDIS_PID; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -f "$env_file"
  echo "cluster.sh: stopped"
}

case "$cmd" in
  start)
    [ -x "$bin/server/uopd" ] && [ -x "$bin/worker/uop-worker" ] ||
      { echo "cluster.sh: build first: $bin/server/uopd and $bin/worker/uop-worker are missing" >&2; exit 1; }
    [ -f "$env_file" ] && { echo "cluster.sh: a cluster is running ($env_file); stop it first" >&2; exit 1; }
    mkdir -p "$state"
    secret=$state/cluster-secret
    if [ ! -s "$secret" ]; then
      (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$secret")
    fi
    chmod 600 "$secret"
    redis_pid="" redis_flag=()
    if [ "$redis" = 1 ]; then
      port=$(free_port)
      redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$state/redis.log" 2>&1 &
      redis_pid=$!
      # Schedulers sharing a Redis authenticate its entries with one key; this cluster's
      # is made once, readable by this user only.
      [ -s "$state/cache.key" ] || (umask 077 && head -c 32 /dev/urandom >"$state/cache.key")
      redis_flag=(--redis="127.0.0.1:$port" --cache-key-file="$state/cache.key")
      for _ in $(seq 1 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    fi
    "$bin/server/uopd" --listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 --workers=0 \
      --cluster-secret-file="$secret" --cache-dir="$state/cache" "${redis_flag[@]}" "${extra[@]}" \
      >"$state/uopd.out" 2>"$state/uopd.log" &
    uopd_pid=$!
    addr=$(wait_listening "$state/uopd.out" "$uopd_pid")
    internal=$(wait_listening "$state/uopd.out" "$uopd_pid" INTERNAL)
    worker_pids=""
    for i in $(seq 0 $((workers - 1))); do
      "$bin/worker/uop-worker" --device="cpu:$i" --listen=127.0.0.1:0 --scheduler="$internal" \
        --cluster-secret-file="$secret" >"$state/worker$i.out" 2>"$state/worker$i.log" &
      worker_pids="$worker_pids $!"
      wait_listening "$state/worker$i.out" "$!" >/dev/null
    done
    cat >"$env_file" <<EOF
UOPD_ADDRESS=$addr
UOPD_INTERNAL=$internal
UOPD_PID=$uopd_pid
WORKER_PIDS="$worker_pids"
REDIS_PID=$redis_pid
EOF
    # Workers register in the background: wait until the scheduler serves every device.
    for _ in $(seq 1 100); do
      up=$(grep -c "is up\|registered" "$state/uopd.log" 2>/dev/null || true)
      [ "$up" -ge "$workers" ] && break
      sleep 0.1
    done
    echo "cluster.sh: uopd at $addr (pid $uopd_pid), $workers workers${redis_pid:+, redis pid $redis_pid}; logs in $state"
    echo "export UOPD_ADDRESS=$addr"
    ;;
  status)
    [ -f "$env_file" ] || { echo "cluster.sh: no cluster in $state"; exit 1; }
    cat "$env_file"
    ;;
  stop) stop ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
