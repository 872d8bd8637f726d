#!/usr/bin/env bash
# Builds the uopd container image from deploy/Dockerfile and smoke-tests it, with or
# without a Docker daemon. Slow (the build compiles the whole project: 25-60 minutes on
# two cores), so it is NOT part of CI; run it by hand after changing the Dockerfile, the
# dependencies (deploy/setup.sh) or the set of binaries. From the repository root, as root:
#
#   deploy/image.sh                 # base image if missing, build, smoke check
#   deploy/image.sh --no-build      # smoke check of an image already built
#
# Engines. With a working Docker daemon (`docker info` answers) it runs `docker build`
# and `docker run`, base images from Docker Hub. Without one it uses buildah (build) and
# podman (run) with the vfs storage driver, and makes the Debian 12 base image itself with
# debootstrap from deb.debian.org (imported as localhost/debian:12 and :12-slim), so no
# registry is needed at all. If podman cannot start containers on this host, the smoke
# check runs the image's binaries with chroot in a buildah working container instead,
# which still proves the runtime stage carries every shared library.
#
# The smoke check starts uopd from the image on free loopback ports (host network), then:
# the image's HEALTHCHECK; `uop stats`; every examples/*.json run through the containerized
# uopd (`uop run --random 1`) compared with `uopc run --random 1 --check` inside the image
# (the in-process compiler, itself checked against the reference interpreter), matmul's
# output compared byte for byte as .npy; a second run answered from the compile cache; a
# uop-worker container registering with the scheduler (as in deploy/compose.yaml) and
# running a graph; /metrics; no missing shared library; the non-root user; a clean
# SIGTERM drain; uopd as PID 1 (no init) starting its workers. One PASS/FAIL line per
# check; exit status 1 if any failed.
# The run-mode functions below are called only through each other: shellcheck cannot tell.
# shellcheck disable=SC2317
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: deploy/image.sh [options]

  --tag=IMAGE        image to build and test (default: localhost/uopd:dev)
  --engine=E         auto (default), docker, or buildah (buildah builds, podman runs)
  --no-build         skip the build; smoke-test the image already tagged IMAGE
  --no-smoke         build only
  --chroot           smoke-test with chroot into the image's filesystem instead of podman
  --client=PATH      also drive the server with this host `uop` client (default: the first
                     of build/release/client/uop, build/dev/client/uop that exists; the
                     image's own `uop` is always used too)
  --work=DIR         debootstrap root, logs and smoke files (default: /var/tmp/uopd-image)
  --help             this text

Environment: UOPD_STORAGE_DRIVER (buildah/podman storage driver, default vfs),
UOPD_PODMAN_RUN_OPTS (podman run options, default: probed), UOPD_BUILD_NICE (default 19),
DEBIAN_MIRROR (default http://deb.debian.org/debian).
Needs root for buildah/podman/debootstrap. Exit status: 0 all checks passed, 1 a check
or the build failed, 2 usage.
EOF
}

tag=localhost/uopd:dev
engine=auto
do_build=1
do_smoke=1
use_chroot=0
client=
work=/var/tmp/uopd-image
for arg in "$@"; do
  case $arg in
    --tag=*) tag=${arg#*=} ;;
    --engine=*) engine=${arg#*=} ;;
    --no-build) do_build=0 ;;
    --no-smoke) do_smoke=0 ;;
    --chroot) use_chroot=1 ;;
    --client=*) client=${arg#*=} ;;
    --work=*) work=${arg#*=} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "deploy/image.sh: unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$work"
log() { echo "deploy/image.sh: $*" >&2; }

# ---------------------------------------------------------------------------- engine
if [ "$engine" = auto ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then engine=docker
  elif command -v buildah >/dev/null 2>&1 && command -v podman >/dev/null 2>&1; then engine=buildah
  else log "neither a Docker daemon nor buildah + podman"; exit 1
  fi
fi
case $engine in
  docker) ctr=(docker) ;;
  # The storage driver must be the same for buildah and podman (they share
  # /var/lib/containers/storage). vfs works everywhere, overlay needs kernel support.
  buildah) storage=(--storage-driver "${UOPD_STORAGE_DRIVER:-vfs}")
           ctr=(podman "${storage[@]}") ;;
  *) echo "deploy/image.sh: --engine must be auto, docker or buildah" >&2; exit 2 ;;
esac
log "engine: $engine"

# ---------------------------------------------------------------------- base images
# Docker pulls debian:12 and debian:12-slim from Docker Hub. For buildah we make them
# from Debian's own mirror: a minbase debootstrap with the apt sources of the official
# image (bookworm, bookworm-updates, bookworm-security). One rootfs serves both names:
# the real -slim only drops documentation, which changes nothing the Dockerfile does.
base=localhost/debian:12
make_base() {
  if "${ctr[@]}" image exists "$base" && "${ctr[@]}" image exists "$base-slim"; then return; fi
  command -v debootstrap >/dev/null || { log "installing debootstrap"; apt-get install -y -q debootstrap >/dev/null; }
  local root=$work/rootfs
  rm -rf "$root"
  log "debootstrap bookworm into $root (a few minutes)"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root" \
    "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; log "debootstrap failed"; exit 1; }
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar --numeric-owner -C "$root" -c . | "${ctr[@]}" import --quiet --change 'CMD ["bash"]' - "$base" >/dev/null
  "${ctr[@]}" tag "$base" "$base-slim"
  log "imported $base and $base-slim"
}

# --------------------------------------------------------------------------- build
build() {
  local start=$SECONDS nice=(nice -n "${UOPD_BUILD_NICE:-19}")
  log "building $tag, log in $work/build.log"
  if [ "$engine" = docker ]; then
    # BuildKit reads deploy/Dockerfile.dockerignore next to the Dockerfile by itself.
    "${nice[@]}" docker build -f deploy/Dockerfile -t "$tag" . 2>&1 | tee "$work/build.log"
  else
    # --format docker: OCI image configs have no SHELL or HEALTHCHECK, buildah would drop
    #   them. --isolation chroot: no nested namespaces or cgroups needed. --ignorefile:
    #   buildah 1.28 does not look for <Dockerfile>.dockerignore by itself.
    "${nice[@]}" buildah "${storage[@]}" bud --isolation chroot --layers --format docker \
      --ignorefile deploy/Dockerfile.dockerignore --build-arg DEBIAN_IMAGE="$base" \
      -f deploy/Dockerfile -t "$tag" . 2>&1 | tee "$work/build.log"
  fi || { echo "FAIL build of $tag (log: $work/build.log)"; exit 1; }
  log "built $tag in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
}

if [ $do_build = 1 ]; then
  [ "$engine" = buildah ] && make_base
  build
fi
[ $do_smoke = 1 ] || exit 0

# --------------------------------------------------------------------- smoke check
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

"${ctr[@]}" image inspect "$tag" >/dev/null 2>&1 || { log "no image $tag (build it first)"; exit 1; }
smoke=$work/smoke.$$
mkdir -p "$smoke"
chmod 777 "$smoke"   # the image runs as uid 10001; it writes .npy files here
cp -r examples "$smoke/examples"
chmod -R a+rX "$smoke/examples"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api=$(free_port); metrics=$(free_port); wport=$(free_port); iport=$(free_port)
addr=127.0.0.1:$api
# The cluster secret of the scheduler and the worker container, owned by the image's user.
od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$smoke/cluster-secret"
chown 10001:10001 "$smoke/cluster-secret"; chmod 600 "$smoke/cluster-secret"
secret_flag=--cluster-secret-file=/smoke/cluster-secret
log "uopd on $addr, metrics on 127.0.0.1:$metrics, worker on 127.0.0.1:$wport"

# The three ways of running the image: docker, podman, chroot. Each mode defines
#   start NAME ARGS...   run ARGS (a command of the image) in the background as NAME
#   cexec NAME ARGS...   run a command next to NAME (same filesystem, env UOPD_ADDRESS)
#   logs NAME            its stdout and stderr so far
#   stop NAME            SIGTERM, wait; its exit status in stop_rc
#   remove NAME          clean up, quietly
# /smoke in the container is $smoke here (examples and output files).
mode=$engine
run_opts=()
if [ "$engine" = buildah ] && [ $use_chroot = 0 ]; then
  # Probe what podman needs on this host. Seen in sandboxes: crun refusing cgroup v1+v2
  # hybrids ("cgroups in hybrid mode not supported"), and setrlimit refused because the
  # default RLIMIT_NOFILE/NPROC are above the host's hard limits: runc and explicit,
  # lower ulimits work there.
  if [ -n "${UOPD_PODMAN_RUN_OPTS:-}" ]; then
    read -r -a run_opts <<<"$UOPD_PODMAN_RUN_OPTS"
  else
    found=0
    ul="--ulimit nofile=16384:16384 --ulimit nproc=32768:32768"
    for cand in "" "$ul" "--runtime runc $ul" "--runtime crun --cgroups=disabled $ul"; do
      read -r -a run_opts <<<"$cand"
      if "${ctr[@]}" run --rm --network=host "${run_opts[@]}" "$tag" true >/dev/null 2>"$work/probe.err"; then
        found=1; break
      fi
      log "podman run ${cand:-(no options)}: $(tail -n 1 "$work/probe.err")"
    done
    if [ $found = 0 ]; then log "podman cannot run containers here: falling back to chroot"; use_chroot=1; fi
  fi
  [ $use_chroot = 0 ] && mode=podman && log "podman run options: ${run_opts[*]:-(none)}"
fi
[ $use_chroot = 1 ] && mode=chroot

declare -A pids=()
case $mode in
  docker | podman)
    # Without systemd, podman logs "unable to get systemd connection to add healthchecks"
    # at start: only the periodic timer is missing; `podman healthcheck run` still works.
    start() {
      local name=$1; shift
      "${ctr[@]}" run -d --name "$name" --network=host "${run_opts[@]}" -e "UOPD_ADDRESS=$addr" \
        -v "$smoke:/smoke" "$@" >/dev/null
    }
    cexec() { local name=$1; shift; "${ctr[@]}" exec "$name" "$@"; }
    logs() { "${ctr[@]}" logs "$1" 2>&1; }
    alive() { [ "$("${ctr[@]}" inspect --format '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }
    remove() { "${ctr[@]}" rm -f "$1" >/dev/null 2>&1 || true; }
    stop() {  # sets stop_rc
      "${ctr[@]}" stop -t 30 "$1" >/dev/null 2>&1 || true
      stop_rc=$("${ctr[@]}" inspect --format '{{.State.ExitCode}}' "$1")
    }
    ;;
  chroot)
    # A writable working container (not the image's own layers), with /proc, /dev and
    # /smoke mounted in; processes run as the image's user.
    [ "$engine" = buildah ] || { log "--chroot needs --engine=buildah"; exit 2; }
    wc=$(buildah "${storage[@]}" from --name "uopd-smoke-$$" "$tag")
    root=$(buildah "${storage[@]}" mount "$wc")
    mkdir -p "$root/smoke"
    mount -t proc proc "$root/proc"; mount --rbind /dev "$root/dev"; mount --bind "$smoke" "$root/smoke"
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    # The image's user (USER uopd:uopd, uid and gid 10001 in the Dockerfile), its HOME
    # and WORKDIR; chroot, env and sh each exec the next, so the pid is the program's.
    in_root=(chroot --userspec=10001:10001 "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin
             HOME=/var/lib/uopd UOPD_ADDRESS="$addr" /bin/sh -c 'cd /var/lib/uopd && exec "$@"' sh)
    start() {
      local name=$1; shift
      while [ "${1:0:1}" = - ]; do shift; done   # container options (--no-healthcheck, ...)
      shift                                     # the image
      "${in_root[@]}" "$@" >"$smoke/$name.log" 2>&1 &
      pids[$name]=$!
    }
    cexec() { shift; "${in_root[@]}" "$@"; }
    logs() { cat "$smoke/$1.log"; }
    alive() { kill -0 "${pids[$1]}" 2>/dev/null; }
    stop() { stop_rc=0; kill -TERM "${pids[$1]}"; wait "${pids[$1]}" || stop_rc=$?; }
    remove() { kill -KILL "${pids[$1]:-}" 2>/dev/null || true; }
    ;;
esac
log "smoke check mode: $mode"

server=uopd-smoke-$$
worker=uopd-smoke-worker-$$
pid1=uopd-smoke-pid1-$$
cleanup() {
  remove "$worker"; remove "$server"; remove "$pid1"
  if [ "$mode" = chroot ]; then
    umount "$root/smoke" "$root/proc" 2>/dev/null || true; umount -R "$root/dev" 2>/dev/null || true
    buildah "${storage[@]}" rm "$wc" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

wait_log() {  # NAME REGEX SECONDS: wait until NAME's output matches, while it runs
  local deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do
    grep -Eq "$2" <<<"$(logs "$1")" && return 0
    alive "$1" || return 1
    sleep 0.5
  done
  return 1
}

# The image's default command, on loopback and free ports (host network): two embedded
# CPU workers, the disk cache on the volume path.
start "$server" "$tag" uopd --listen="$addr" --metrics-listen="127.0.0.1:$metrics" --cache-dir=/var/cache/uopd \
  --internal-listen="127.0.0.1:$iport" "$secret_flag"
if wait_log "$server" '^LISTENING ' 60 && wait_log "$server" 'uopd: serving' 60; then
  pass "uopd starts from the image: $(logs "$server" | grep -m1 'uopd: serving')"
else
  fail "uopd did not start from the image; its output:"; logs "$server" | tail -n 20
  exit 1
fi

# The HEALTHCHECK as the image declares it (UOPD_ADDRESS is set to our port).
case $mode in
  podman) if podman "${storage[@]}" healthcheck run "$server" 2>/dev/null; then pass "HEALTHCHECK (podman healthcheck run)"; else fail "HEALTHCHECK (podman healthcheck run)"; fi ;;
  docker) st=; for _ in $(seq 1 60); do
            st=$(docker inspect --format '{{.State.Health.Status}}' "$server"); [ "$st" = healthy ] && break; sleep 1
          done
          if [ "$st" = healthy ]; then pass "HEALTHCHECK: healthy"; else fail "HEALTHCHECK: $st"; fi ;;
  chroot) if cexec "$server" uop stats --deadline=4 >/dev/null; then pass "HEALTHCHECK command (uop stats --deadline=4)"; else fail "HEALTHCHECK command"; fi ;;
esac

# Clients: the image's own uop, and a host build's one if there is one.
clients=("in-image")
if [ -z "$client" ]; then
  for c in build/release/client/uop build/dev/client/uop; do if [ -x "$c" ]; then client=$c; break; fi; done
fi
if [ -n "$client" ]; then clients+=("$(realpath "$client")"); fi
uop() {  # CLIENT ARGS...: paths under /smoke (the container's view) in ARGS
  local c=$1; shift
  if [ "$c" = in-image ]; then cexec "$server" uop "$@" --server="$addr"
  else (cd "$smoke" && args=("${@//\/smoke\//}") && "$c" "${args[@]}" --server="$addr")
  fi
}

for c in "${clients[@]}"; do
  if out=$(uop "$c" stats 2>&1) && grep -q '^workers: 2' <<<"$out" && [ "$(grep -c ' up ' <<<"$out")" = 2 ]; then
    pass "uop stats ($c client): 2 workers up"
  else
    fail "uop stats ($c client):"; echo "$out"
  fi
done
uop in-image stats

# Every example: the server's result against the image's in-process compiler.
for g in "$smoke"/examples/*.json; do
  g=/smoke/examples/$(basename "$g")
  ref=$(cexec "$server" uopc run "$g" --random 1 --check 2>/dev/null) || { fail "uopc run --check $g"; continue; }
  for c in "${clients[@]}"; do
    got=$(uop "$c" run "$g" --random 1 2>/dev/null) || { fail "uop run $g ($c client)"; continue; }
    if [ "$got" = "$(grep -v '^check ' <<<"$ref")" ]; then first=${got%%$'\n'*}; pass "uop run $(basename "$g") ($c client) = uopc run --check: ${first:0:60}"
    else fail "uop run $g ($c client) differs from uopc:"; echo "server: $got"; echo "uopc:   $ref"
    fi
  done
done
cexec "$server" uopc run /smoke/examples/matmul.json --random 1 --out C=/smoke/matmul.uopc.npy >/dev/null 2>&1 || true
uop "${clients[-1]}" run /smoke/examples/matmul.json --random 1 --out C=/smoke/matmul.uopd.npy >/dev/null 2>&1 || true
if [ -s "$smoke/matmul.uopd.npy" ] && cmp -s "$smoke/matmul.uopc.npy" "$smoke/matmul.uopd.npy"; then
  pass "matmul C (.npy) from uopd identical to uopc's ($(stat -c %s "$smoke/matmul.uopd.npy") bytes)"
else fail "matmul C (.npy): uopd and uopc outputs differ or are missing"
fi
out=$(uop in-image run /smoke/examples/matmul.json --random 1 2>&1 || true)
if grep -q 'hit (memory)' <<<"$out"; then
  pass "second run of matmul: compile cache hit (memory)"
else fail "second run of matmul: no memory cache hit"
fi

# A uop-worker container registering with the containerized scheduler, as in
# deploy/compose.yaml (healthcheck off: it is not a uopd).
start "$worker" --no-healthcheck "$tag" uop-worker --device=cpu:2 --listen="127.0.0.1:$wport" \
  --scheduler="127.0.0.1:$iport" "$secret_flag"
if wait_log "$worker" 'registered' 60 && grep -Eq 'CPU:2 +up' <<<"$(uop in-image stats)"; then
  pass "uop-worker from the image registered: $(logs "$worker" | grep -m1 registered)"
  ref=$(cexec "$server" uopc run /smoke/examples/reduction.json --random 1 2>/dev/null)
  got=$(uop in-image run /smoke/examples/reduction.json --random 1 --device=CPU:2 2>/dev/null) || got="(failed)"
  if [ "$got" = "$ref" ]; then pass "reduction.json on the registered worker CPU:2 = uopc"; else fail "reduction.json on CPU:2: $got"; fi
else
  fail "uop-worker did not register; its output:"; logs "$worker" | tail -n 20; uop in-image stats || true
fi

if grep -q '^uopd_workers_up' <<<"$(curl -fsS "http://127.0.0.1:$metrics/metrics" || true)"; then
  pass "/metrics on 127.0.0.1:$metrics has uopd_workers_up"
else fail "/metrics on 127.0.0.1:$metrics"
fi
if missing=$(cexec "$server" sh -c 'ldd /usr/local/bin/* | grep "not found"'); then
  fail "shared libraries missing in the runtime stage: $missing"
else pass "ldd: every shared library of uopd, uop-worker, uop, uopc is in the image"
fi
if [ "$(cexec "$server" id -u)" = 10001 ]; then pass "runs as uid 10001 (uopd)"; else fail "not running as uid 10001"; fi

stop "$worker"
if [ "$stop_rc" = 0 ]; then pass "uop-worker stops cleanly on SIGTERM"; else fail "uop-worker exit status $stop_rc after SIGTERM"; fi
stop "$server"
if [ "$stop_rc" = 0 ]; then pass "uopd drains and exits 0 on SIGTERM"; else fail "uopd exit status $stop_rc after SIGTERM"; fi

# uopd as PID 1 itself (`--entrypoint uopd`: a runtime without an init): its embedded
# workers must not take their parent of pid 1 for a dead one. Containers only: chroot
# has no pid namespace.
if [ "$mode" != chroot ]; then
  api1=$(free_port); metrics1=$(free_port)
  start "$pid1" --entrypoint uopd "$tag" --listen="127.0.0.1:$api1" --metrics-listen="127.0.0.1:$metrics1" \
    --cache-dir=/var/cache/uopd
  if wait_log "$pid1" 'uopd: serving.*2 CPU workers' 60 && [ "$(cexec "$pid1" cat /proc/1/comm)" = uopd ]; then
    pass "uopd as PID 1 starts its 2 embedded workers"
  else
    fail "uopd as PID 1; its output:"; logs "$pid1" | tail -n 20
  fi
  stop "$pid1"
  if [ "$stop_rc" = 0 ]; then pass "uopd as PID 1 drains and exits 0 on SIGTERM"; else fail "uopd as PID 1: exit status $stop_rc"; fi
fi

"${ctr[@]}" images 2>/dev/null | grep -E "uopd|debian" || true
if [ $fails = 0 ]; then echo "PASS all checks ($mode, $tag)"; rm -rf "$smoke"; exit 0; fi
echo "FAIL $fails check(s) ($mode, $tag); files in $smoke"
exit 1
