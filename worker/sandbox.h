// uop-worker's sandbox: what a CPU worker may still do once it has started. A kernel is
// code the worker did not write (and a CUSTOM op calls any C function of the process); if
// one ever escaped the bounds proof, or the operator allowed custom ops, this is what it
// finds: a process that can run kernels, move its buffers and talk to its scheduler and
// its collective peers, and nothing else. Two layers, installed by uop-worker (main.cc):
//
// 1. confine_files(), first thing, before any thread exists: Landlock (where the kernel
//    has it) lets the process read files, but create, write and remove regular files only
//    beneath /dev/shm, and nothing else on the filesystem: no other writes, no devices, no
//    links, no execution.
//
// 2. enter_sandbox(), once start-up is done (libraries loaded, the JIT made, the
//    listening socket bound, the execute lane mapped; threads exist already, so the filter
//    goes on all of them at once, SECCOMP_FILTER_FLAG_TSYNC): a seccomp-BPF allowlist.
//    x86_64 only; any other architecture number, and the x32 ABI, kill the process.
//    Allowed:
//      memory       brk mmap munmap mremap mprotect (the JIT) madvise membarrier
//      threads      clone with CLONE_THREAD and no namespace flag (pthread_create; clone3
//                   answers ENOSYS, so glibc falls back to clone), exit exit_group
//                   set_robust_list rseq futex sched_yield sched_getaffinity
//                   sched_getparam sched_getscheduler gettid getpid getppid,
//                   prctl(PR_SET_NAME / PR_GET_NAME)
//      time         clock_gettime clock_getres gettimeofday nanosleep clock_nanosleep
//      signals      rt_sigaction rt_sigprocmask rt_sigreturn rt_sigtimedwait sigaltstack,
//                   tgkill to this process, kill to this process or with signal 0
//      descriptors  read write readv writev pread64 pwrite64 lseek close fcntl fstat,
//                   newfstatat / statx of a descriptor (AT_EMPTY_PATH), ioctl(FIONREAD,
//                   FIONBIO, TCGETS), fallocate, poll ppoll select pselect6 epoll_create
//                   epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 eventfd2 pipe2
//      sockets      socket(AF_INET or AF_INET6, SOCK_STREAM or SOCK_DGRAM) and
//                   socket(AF_NETLINK, NETLINK_ROUTE), and on them connect bind listen
//                   accept accept4 shutdown getsockname getpeername getsockopt setsockopt
//                   sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg. The collectives need
//                   these at collective time: Gloo listens and connects over TCP, finds
//                   its route with a UDP socket, names its interface through getifaddrs
//                   (a route netlink socket, which an unprivileged process can only read),
//                   and its rendezvous is a gRPC client, as is the registration with a
//                   scheduler. No AF_UNIX, AF_PACKET, other netlink families or raw sockets.
//      files        openat relative to the /dev/shm descriptor opened before, read-write
//                   with O_NOFOLLOW | O_CLOEXEC (and O_CREAT | O_EXCL), and unlinkat there:
//                   the shared-memory collectives' segments.
//      processes    pidfd_open (watching collective peers), getrandom uname sysinfo
//                   getrusage getuid geteuid getgid getegid
//    Refused softly (the call fails, the worker goes on): what libraries do on their own
//    behalf, lazily, where they have a fallback. A read-only open (glibc counts CPUs from
//    /sys/devices/system/cpu/online, else with sched_getaffinity; Abseil reads the TSC's
//    frequency and the time zone from files), stat / access / readlink of a path:
//    EACCES; ioctl(SIOCETHTOOL), Gloo asking for its interface's speed for its logs:
//    EOPNOTSUPP. These reach nothing either, and killing the worker for them would make it
//    crash at random on harmless library code.
//    Everything else kills: an open that would write, create or truncate a file (outside
//    the segments), open, creat, openat2, execve, execveat, fork, vfork, clone without
//    CLONE_THREAD, ptrace, process_vm_readv / writev, mount, bpf, keyctl,
//    perf_event_open, io_uring, chdir, unlink, signals to other processes, ... The
//    calling thread gets SIGSYS (SECCOMP_RET_TRAP), whose handler writes "the sandbox
//    refused system call N (name)" to stderr and dies by SIGSYS: the operator reads which
//    call it was in the worker's log (SECCOMP_RET_KILL_PROCESS would say only the
//    signal), and uopd reports the worker killed by signal 31 (SIGSYS), fails what ran on
//    it with UNAVAILABLE and starts it again. Core dumps are off first: a worker's memory
//    holds its sessions' buffers.
//
// Host names cannot be resolved once sandboxed (resolving reads /etc/hosts and
// /etc/resolv.conf): dial_target() resolves the scheduler's address at start-up, and a
// collective whose rendezvous is a name fails with FAILED_PRECONDITION saying so.
//
// CUDA workers get neither layer: the driver opens device files (/dev/nvidia*) and maps
// memory on demand, at any call. Where --seccomp=off, neither.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace uop {

// Layer 1, with `shm_dir` (a descriptor of /dev/shm) the one directory writes may reach.
// Must run before the process starts a thread. Returns whether Landlock is in force;
// false (with why in `*why`) where the kernel has none, which leaves the second layer.
bool confine_files(int shm_dir, std::string* why);

// Layer 2. `shm_dir` is the descriptor openat may be relative to (-1: none).
// FAILED_PRECONDITION on an architecture it has no allowlist for; INTERNAL if the kernel
// refuses the filter.
absl::Status enter_sandbox(int shm_dir);

// Whether enter_sandbox succeeded in this process.
bool in_sandbox();

// Whether this build has an allowlist for its architecture (x86_64): where it has none, a
// CPU worker runs without the sandbox unless --seccomp=on asks (and then fails to start).
bool sandbox_available();

// What a sandboxed process's gRPC channel to `address` (HOST:PORT) dials: "ipv4:A:P,..."
// or "ipv6:[A]:P,...", resolved now, before the filter, so that gRPC never resolves a
// name (and opens files) under it. UNAVAILABLE when the name does not resolve.
absl::StatusOr<std::string> dial_target(const std::string& address);

// "HOST:PORT", "[V6]:PORT", or a bare host or IPv6 address (port empty).
struct HostPort {
  std::string host, port;
};
HostPort split_host_port(const std::string& host_port);

// The host of `host_port` (as split_host_port reads it) is a numeric address.
bool is_numeric_host(const std::string& host_port);

}  // namespace uop
