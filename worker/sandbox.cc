// The filter is one linear BPF program: the architecture check, then for each allowed
// system call a compare and an ALLOW (or a small block that checks its arguments), and
// TRAP at the end. Arguments are 64-bit; the ones checked here are C ints (descriptors,
// flags, domains), of which the kernel reads the low 32 bits, so only those are compared.
#include "worker/sandbox.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "compiler/support/strings.h"

#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif

namespace uop {
namespace {

std::atomic<bool> sandboxed{false};

// ---- the SIGSYS handler: async-signal-safe, so it formats by hand ----

struct SyscallName {
  int nr;
  const char* name;
};
// The refusals an operator is likely to meet, by name; others by number.
#if defined(__x86_64__)
constexpr SyscallName kNames[] = {
    {SYS_open, "open"},         {SYS_openat, "openat"},       {SYS_creat, "creat"},
    {SYS_openat2, "openat2"},   {SYS_execve, "execve"},       {SYS_execveat, "execveat"},
    {SYS_fork, "fork"},         {SYS_vfork, "vfork"},         {SYS_clone, "clone"},
    {SYS_socket, "socket"},     {SYS_ptrace, "ptrace"},       {SYS_process_vm_readv, "process_vm_readv"},
    {SYS_process_vm_writev, "process_vm_writev"},             {SYS_mount, "mount"},
    {SYS_bpf, "bpf"},           {SYS_keyctl, "keyctl"},       {SYS_unlinkat, "unlinkat"},
    {SYS_unlink, "unlink"},     {SYS_mkdir, "mkdir"},         {SYS_rename, "rename"},
    {SYS_ioctl, "ioctl"},       {SYS_prctl, "prctl"},         {SYS_stat, "stat"},
    {SYS_newfstatat, "newfstatat"},                           {SYS_kill, "kill"},
    {SYS_perf_event_open, "perf_event_open"},                 {SYS_io_uring_setup, "io_uring_setup"},
};
#endif

void put(char*& at, const char* s) {
  while (*s) *at++ = *s++;
}
void put_number(char*& at, long v) {
  char digits[24];
  int n = 0;
  unsigned long u = v < 0 ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
  do digits[n++] = static_cast<char>('0' + u % 10);
  while ((u /= 10) && n < 23);
  if (v < 0) *at++ = '-';
  while (n) *at++ = digits[--n];
}

void on_sigsys(int, siginfo_t* info, void*) {
  char line[256];
  char* at = line;
  put(at, "uop-worker[");
  put_number(at, syscall(SYS_getpid));
  put(at, "] the sandbox refused system call ");
  put_number(at, info->si_syscall);
#if defined(__x86_64__)
  for (const SyscallName& s : kNames)
    if (s.nr == info->si_syscall) {
      put(at, " (");
      put(at, s.name);
      put(at, ")");
    }
#endif
  put(at, ": a kernel or a library tried what a kernel runner must not do; dying by SIGSYS\n");
  ssize_t ignored = write(STDERR_FILENO, line, static_cast<size_t>(at - line));
  (void)ignored;
  // The handler was installed with SA_RESETHAND | SA_NODEFER: SIGSYS is back to its
  // default action, and not blocked here.
  syscall(SYS_tgkill, syscall(SYS_getpid), syscall(SYS_gettid), SIGSYS);
  for (;;) syscall(SYS_exit_group, 128 + SIGSYS);
}

// ---- the BPF program ----

class Filter {
 public:
  std::vector<sock_filter> code;

  void stmt(uint16_t op, uint32_t k) { code.push_back(BPF_STMT(op, k)); }
  void jump(uint16_t op, uint32_t k, uint8_t jt, uint8_t jf) { code.push_back(BPF_JUMP(op, k, jt, jf)); }
  void load_nr() { stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)); }
  void load_arg(int i) { stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args) + 8 * i); }  // the low word
  void allow() { stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW); }
  void trap() { stmt(BPF_RET | BPF_K, SECCOMP_RET_TRAP); }
  void deny(int err) { stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<uint32_t>(err)); }

  // nr: ALLOW.
  void allow_call(long nr) {
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1);
    allow();
  }
  // nr: fails with `err`.
  void deny_call(long nr, int err) {
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1);
    deny(err);
  }
  // nr: ALLOW when argument `arg` is one of `values`, else TRAP.
  void allow_when(long nr, int arg, std::initializer_list<uint32_t> values) {
    const uint8_t n = static_cast<uint8_t>(values.size());
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, static_cast<uint8_t>(n + 3));
    load_arg(arg);
    uint8_t left = n;
    for (uint32_t v : values) jump(BPF_JMP | BPF_JEQ | BPF_K, v, left--, 0);  // to the ALLOW after the TRAP
    trap();
    allow();
    // The accumulator now holds an argument: reload the number for the next checks.
    load_nr();
  }
  // A block of its own: `body` must end in RET and leave nothing to fall through.
  template <typename Body>
  void when(long nr, Body&& body) {
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 0);
    const size_t at = code.size() - 1;
    body();
    code[at].jf = static_cast<uint8_t>(code.size() - at - 1);
    load_nr();
  }
};

#if defined(__x86_64__)
std::vector<sock_filter> build_filter(int shm_dir) {
  Filter f;
  // Another architecture's numbers mean other calls: kill, whatever they are.
  f.stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch));
  f.jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
  f.stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  f.load_nr();
  f.jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u /* __X32_SYSCALL_BIT */, 0, 1);
  f.stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);

  for (long nr : {
           // memory (the JIT makes its code executable)
           SYS_brk, SYS_mmap, SYS_munmap, SYS_mremap, SYS_mprotect, SYS_madvise, SYS_membarrier,
           // threads and their synchronization
           SYS_exit, SYS_exit_group, SYS_set_robust_list, SYS_rseq, SYS_futex, SYS_sched_yield,
           SYS_sched_getaffinity, SYS_sched_getparam, SYS_sched_getscheduler, SYS_gettid, SYS_getpid, SYS_getppid,
           // time
           SYS_clock_gettime, SYS_clock_getres, SYS_gettimeofday, SYS_nanosleep, SYS_clock_nanosleep,
           SYS_restart_syscall,
           // signals
           SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigtimedwait, SYS_sigaltstack,
           // open descriptors
           SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_pwrite64, SYS_lseek, SYS_close, SYS_fcntl,
           SYS_fstat, SYS_fallocate, SYS_poll, SYS_ppoll, SYS_select, SYS_pselect6, SYS_epoll_create,
           SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_wait, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_eventfd2,
           SYS_pipe2,
           // sockets (made by socket() below)
           SYS_connect, SYS_bind, SYS_listen, SYS_accept, SYS_accept4, SYS_shutdown, SYS_getsockname,
           SYS_getpeername, SYS_getsockopt, SYS_setsockopt, SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg,
           SYS_sendmmsg, SYS_recvmmsg,
           // the process
           SYS_pidfd_open, SYS_getrandom, SYS_uname, SYS_sysinfo, SYS_getrusage, SYS_getuid, SYS_geteuid,
           SYS_getgid, SYS_getegid})
    f.allow_call(nr);
  // clone3 cannot be checked (its flags are in memory): ENOSYS, and glibc uses clone.
  f.deny_call(SYS_clone3, ENOSYS);
  // clone: threads only.
  f.when(SYS_clone, [&] {
    f.load_arg(0);
    f.jump(BPF_JMP | BPF_JSET | BPF_K, CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                                           CLONE_NEWPID | CLONE_NEWNET, 2, 0);
    f.jump(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1);
    f.allow();
    f.trap();
  });
  f.allow_when(SYS_prctl, 0, {PR_SET_NAME, PR_GET_NAME});
  // TCGETS: stdio asks whether stdout is a terminal. SIOCETHTOOL: Gloo asks for its
  // interface's speed, for its logs only: refused softly.
  f.when(SYS_ioctl, [&] {
    f.load_arg(1);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, FIONREAD, 3, 0);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, FIONBIO, 2, 0);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, TCGETS, 1, 0);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, SIOCETHTOOL, 1, 2);
    f.allow();
    f.deny(EOPNOTSUPP);
    f.trap();
  });
  // IPv4 / IPv6 sockets of a stream or datagram type (its low bits; the rest are
  // SOCK_CLOEXEC / SOCK_NONBLOCK).
  // And NETLINK_ROUTE sockets: getifaddrs (Gloo names the interface it listens on) and
  // getaddrinfo's AI_ADDRCONFIG read the interfaces through one. Reading is all an
  // unprivileged process can do with it.
  f.when(SYS_socket, [&] {
    f.load_arg(0);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, AF_NETLINK, 0, 4);
    f.load_arg(2);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, NETLINK_ROUTE, 0, 1);
    f.allow();
    f.trap();
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 1, 0);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 0, 5);
    f.load_arg(1);
    f.stmt(BPF_ALU | BPF_AND | BPF_K, 0xf);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, SOCK_STREAM, 1, 0);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, SOCK_DGRAM, 0, 1);
    f.allow();
    f.trap();
  });
  // Signals to this process only, or probes (signal 0) of any.
  const uint32_t self = static_cast<uint32_t>(getpid());
  f.allow_when(SYS_tgkill, 0, {self});
  f.when(SYS_kill, [&] {
    f.load_arg(0);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, self, 2, 0);
    f.load_arg(1);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1);
    f.allow();
    f.trap();
  });
  // Metadata: of an open descriptor (fstat is fstatat(fd, "", AT_EMPTY_PATH)); of a path,
  // which libraries probe on their own (glibc's resolver and time zone code), EACCES.
  f.when(SYS_newfstatat, [&] {
    f.load_arg(3);
    f.jump(BPF_JMP | BPF_JSET | BPF_K, AT_EMPTY_PATH, 0, 1);
    f.allow();
    f.deny(EACCES);
  });
  f.when(SYS_statx, [&] {
    f.load_arg(2);
    f.jump(BPF_JMP | BPF_JSET | BPF_K, AT_EMPTY_PATH, 0, 1);
    f.allow();
    f.deny(EACCES);
  });
  for (long nr : {SYS_stat, SYS_lstat, SYS_access, SYS_faccessat, SYS_faccessat2, SYS_readlink, SYS_readlinkat})
    f.deny_call(nr, EACCES);
  // openat: the collectives' segments, read-write, relative to the shm directory. A
  // read-only open is what libraries make on their own behalf, lazily, at any call
  // (glibc reads /sys/devices/system/cpu/online for its CPU count, Abseil
  // /sys/devices/system/cpu/cpu0/tsc_freq_khz, the resolver /etc files): EACCES, and
  // they fall back; such an open reaches nothing either way. An open that would write,
  // create or truncate anything else: SIGSYS.
  auto read_only_or_trap = [&](int flags_arg) {
    f.load_arg(flags_arg);
    f.stmt(BPF_ALU | BPF_AND | BPF_K, O_ACCMODE | O_CREAT | O_TRUNC);
    f.jump(BPF_JMP | BPF_JEQ | BPF_K, O_RDONLY, 0, 1);
    f.deny(EACCES);
    f.trap();
  };
  f.when(SYS_openat, [&] {
    if (shm_dir >= 0) {
      const uint32_t flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC;
      f.load_arg(0);
      f.jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(shm_dir), 0, 5);
      f.load_arg(2);
      f.jump(BPF_JMP | BPF_JEQ | BPF_K, flags, 2, 0);
      f.jump(BPF_JMP | BPF_JEQ | BPF_K, flags | O_CREAT | O_EXCL, 1, 0);
      f.trap();
      f.allow();
    }
    read_only_or_trap(2);
  });
  f.when(SYS_open, [&] { read_only_or_trap(1); });
  if (shm_dir >= 0) {
    f.when(SYS_unlinkat, [&] {
      f.load_arg(0);
      f.jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(shm_dir), 0, 3);
      f.load_arg(2);
      f.jump(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1);
      f.allow();
      f.trap();
    });
  }
  f.trap();
  return f.code;
}
#endif

}  // namespace

bool confine_files(int shm_dir, std::string* why) {
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) {
    *why = cat("Landlock is not available (", std::strerror(errno), ")");
    return false;
  }
  uint64_t handled = (1ULL << 13) - 1;  // ABI 1: execute .. make_sym
  if (abi >= 2) handled |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) handled |= LANDLOCK_ACCESS_FS_TRUNCATE;
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = handled;
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (ruleset < 0) {
    *why = cat("landlock_create_ruleset: ", std::strerror(errno));
    return false;
  }
  auto fail = [&](const char* what) {
    *why = cat(what, ": ", std::strerror(errno));
    close(ruleset);
    return false;
  };
  // Everything may be read (start-up reads certificates, /proc and /sys); only the
  // collectives' directory may be written.
  const int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return fail("open /");
  landlock_path_beneath_attr read_all{LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR, root};
  const long added = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &read_all, 0);
  close(root);
  if (added != 0) return fail("landlock_add_rule /");
  if (shm_dir >= 0) {
    uint64_t shm = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_MAKE_REG |
                   LANDLOCK_ACCESS_FS_REMOVE_FILE;
    if (abi >= 3) shm |= LANDLOCK_ACCESS_FS_TRUNCATE;
    landlock_path_beneath_attr segments{shm, shm_dir};
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &segments, 0) != 0)
      return fail("landlock_add_rule /dev/shm");
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("PR_SET_NO_NEW_PRIVS");
  if (syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) return fail("landlock_restrict_self");
  close(ruleset);
  return true;
}

absl::Status enter_sandbox(int shm_dir) {
#if defined(__x86_64__)
  // A dying worker's core would hold its sessions' buffers; and no other process of this
  // user may attach to it.
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  struct sigaction sa {};
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSYS, &sa, nullptr) != 0) return absl::InternalError(cat("sigaction(SIGSYS): ", std::strerror(errno)));
  // A thread that blocks SIGSYS still gets it: the kernel forces a seccomp trap through.
  std::vector<sock_filter> code = build_filter(shm_dir);
  if (code.size() > BPF_MAXINSNS) return absl::InternalError(cat("the sandbox's filter has ", code.size(), " instructions"));
  sock_fprog prog{static_cast<unsigned short>(code.size()), code.data()};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return absl::InternalError(cat("PR_SET_NO_NEW_PRIVS: ", std::strerror(errno)));
  const long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
  if (r != 0)
    return absl::InternalError(r > 0 ? cat("thread ", r, " could not take the sandbox's filter")
                                     : cat("seccomp: ", std::strerror(errno)));
  sandboxed.store(true);
  return absl::OkStatus();
#else
  (void)shm_dir;
  return absl::FailedPreconditionError("the sandbox has an allowlist for x86_64 only: run with --seccomp=off");
#endif
}

bool in_sandbox() { return sandboxed.load(); }

bool sandbox_available() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

HostPort split_host_port(const std::string& host_port) {
  if (!host_port.empty() && host_port.front() == '[') {
    const size_t close = host_port.find(']');
    if (close == std::string::npos) return {host_port.substr(1), ""};
    const bool port = close + 2 <= host_port.size() && host_port[close + 1] == ':';
    return {host_port.substr(1, close - 1), port ? host_port.substr(close + 2) : ""};
  }
  if (std::count(host_port.begin(), host_port.end(), ':') == 1) {
    const size_t colon = host_port.find(':');
    return {host_port.substr(0, colon), host_port.substr(colon + 1)};
  }
  return {host_port, ""};
}

bool is_numeric_host(const std::string& host_port) {
  const std::string host = split_host_port(host_port).host;
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

absl::StatusOr<std::string> dial_target(const std::string& address) {
  if (is_numeric_host(address)) return address;  // gRPC resolves nothing for it
  const auto [host, port] = split_host_port(address);
  if (host.empty() || port.empty()) return absl::InvalidArgumentError(cat("'", address, "' is not HOST:PORT"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return absl::UnavailableError(cat("cannot resolve ", address, ": ", gai_strerror(rc)));
  std::vector<std::string> v4, v6;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, text, sizeof text);
      v4.push_back(cat(text, ":", port));
    } else if (ai->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, text, sizeof text);
      v6.push_back(cat("[", text, "]:", port));
    }
  }
  freeaddrinfo(res);
  // One scheme per target: IPv4 first, as most clusters route it.
  if (!v4.empty()) return cat("ipv4:", join(v4, ","));
  if (!v6.empty()) return cat("ipv6:", join(v6, ","));
  return absl::UnavailableError(cat("cannot resolve ", address, ": no IPv4 or IPv6 address"));
}

}  // namespace uop
