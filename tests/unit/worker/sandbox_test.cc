// The worker's sandbox (worker/sandbox.h), each case in a child process of its own that
// enters it: what a kernel runner needs works (threads, memory it can execute, IPv4
// sockets, a segment in /dev/shm), what it must not do dies by SIGSYS with the refused
// call named on stderr (creating a file, exec, fork, a Unix socket, ptrace), and what
// libraries probe on their own fails softly (a read-only open is EACCES).
#include "worker/sandbox.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace uop {
namespace {

struct Outcome {
  bool exited = false;
  int code = -1;    // exit status, if it exited
  int signal = 0;   // the signal that killed it, if one did
  std::string err;  // what it wrote to stderr
};

// Runs `body` in a forked child after it entered the sandbox (Landlock too, as
// uop-worker does), with the /dev/shm descriptor the sandbox allows; the child exits with
// body's return value.
Outcome in_sandbox_child(const std::function<int(int shm_dir)>& body) {
  int pipefd[2];
  EXPECT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDERR_FILENO);
    int shm = open("/dev/shm", O_PATH | O_DIRECTORY | O_CLOEXEC);
    std::string why;
    confine_files(shm, &why);  // where the kernel has no Landlock, the filter alone
    if (!enter_sandbox(shm).ok()) _exit(90);
    if (!in_sandbox()) _exit(91);
    _exit(body(shm));
  }
  close(pipefd[1]);
  Outcome o;
  char buf[512];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) o.err.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  o.exited = WIFEXITED(status);
  if (o.exited) o.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  return o;
}

void expect_sigsys(const Outcome& o, const std::string& call) {
  EXPECT_EQ(o.signal, SIGSYS) << "exited " << o.exited << " with " << o.code << "; stderr: " << o.err;
  EXPECT_NE(o.err.find("the sandbox refused system call"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("(" + call + ")"), std::string::npos) << o.err;
}

TEST(Sandbox, WhatAKernelRunnerNeedsWorks) {
  Outcome o = in_sandbox_child([](int) {
    // Threads, and memory made executable (the JIT).
    int from_thread = 0;
    std::thread([&] { from_thread = 7; }).join();
    if (from_thread != 7) return 1;
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p, 4096, PROT_READ | PROT_EXEC) != 0) return 2;
    // TCP and UDP over IPv4 and IPv6, and what Gloo does with them.
    for (int family : {AF_INET, AF_INET6})
      for (int type : {SOCK_STREAM, SOCK_DGRAM}) {
        int s = socket(family, type | SOCK_CLOEXEC, 0);
        if (s < 0 && errno != EAFNOSUPPORT) return 3;
        if (s >= 0) close(s);
      }
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listener, 1) != 0) return 4;
    // A shared-memory segment, as the collectives make one, and its removal.
    int shm = open("/dev/shm", O_PATH | O_DIRECTORY | O_CLOEXEC);  // read-only: refused softly
    if (shm >= 0 || errno != EACCES) return 5;
    return 0;
  });
  EXPECT_TRUE(o.exited && o.code == 0) << "code " << o.code << " signal " << o.signal << ": " << o.err;
}

TEST(Sandbox, TheCollectivesSegmentsLiveInDevShmOnly) {
  const std::string name = "uopd-sandbox-test-" + std::to_string(getpid());
  Outcome o = in_sandbox_child([&](int dir) {
    const int flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC;
    int fd = openat(dir, name.c_str(), flags | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return 11;
    if (posix_fallocate(fd, 0, 4096) != 0) return 12;
    close(fd);
    fd = openat(dir, name.c_str(), flags, 0);
    if (fd < 0) return 13;
    close(fd);
    if (unlinkat(dir, name.c_str(), 0) != 0) return 14;
    return 0;
  });
  EXPECT_TRUE(o.exited && o.code == 0) << "code " << o.code << " signal " << o.signal << ": " << o.err;
}

// The filter lets opens through relative to /dev/shm only; Landlock keeps them beneath it
// (../ leads nowhere), where the kernel has it.
TEST(Sandbox, NothingOutsideDevShmIsReachedThroughIt) {
  if (syscall(SYS_landlock_create_ruleset, nullptr, 0, 1 /* LANDLOCK_CREATE_RULESET_VERSION */) < 1)
    GTEST_SKIP() << "this kernel has no Landlock: the seccomp filter alone confines the worker";
  const std::string escape = "uopd-sandbox-escape-" + std::to_string(getpid());
  Outcome o = in_sandbox_child([&](int dir) {
    int fd = openat(dir, ("../../tmp/" + escape).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) return 1;
    return errno == EACCES ? 0 : 2;
  });
  EXPECT_TRUE(o.exited && o.code == 0) << "code " << o.code << " signal " << o.signal << ": " << o.err;
  EXPECT_NE(access(("/tmp/" + escape).c_str(), F_OK), 0) << "/tmp/" << escape << " was created";
}

TEST(Sandbox, CreatingAFileDiesBySigsys) {
  const std::string path = "/tmp/uopd-sandbox-test-" + std::to_string(getpid());
  expect_sigsys(in_sandbox_child([&](int) { return open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) >= 0 ? 0 : 1; }),
                "openat");
  EXPECT_NE(access(path.c_str(), F_OK), 0) << path << " was created";
}

TEST(Sandbox, ReadingAFileIsRefusedSoftly) {
  Outcome o = in_sandbox_child([](int) {
    int fd = open("/etc/hostname", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) return 1;
    return errno == EACCES ? 0 : 2;
  });
  EXPECT_TRUE(o.exited && o.code == 0) << "code " << o.code << " signal " << o.signal << ": " << o.err;
}

TEST(Sandbox, ExecForkPtraceAndUnixSocketsDieBySigsys) {
  expect_sigsys(in_sandbox_child([](int) {
                  char* argv[] = {const_cast<char*>("/bin/true"), nullptr};
                  execv("/bin/true", argv);
                  return 1;
                }),
                "execve");
  expect_sigsys(in_sandbox_child([](int) { return static_cast<int>(syscall(SYS_fork)) >= 0 ? 0 : 1; }), "fork");
  // glibc's fork(): clone without CLONE_THREAD (after clone3 answered ENOSYS).
  expect_sigsys(in_sandbox_child([](int) { return fork() >= 0 ? 0 : 1; }), "clone");
  expect_sigsys(in_sandbox_child([](int) { return socket(AF_UNIX, SOCK_STREAM, 0) >= 0 ? 0 : 1; }), "socket");
  expect_sigsys(in_sandbox_child([](int) { return ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) == 0 ? 0 : 1; }), "ptrace");
  // And a signal to another process.
  expect_sigsys(in_sandbox_child([](int) { return kill(getppid(), SIGTERM) == 0 ? 0 : 1; }), "kill");
}

TEST(Sandbox, NumericHostsAndDialTargets) {
  EXPECT_TRUE(is_numeric_host("127.0.0.1:7070"));
  EXPECT_TRUE(is_numeric_host("[::1]:7070"));
  EXPECT_TRUE(is_numeric_host("10.1.2.3"));
  EXPECT_FALSE(is_numeric_host("localhost:7070"));
  EXPECT_FALSE(is_numeric_host("uopd:7070"));
  auto same = dial_target("127.0.0.1:7070");
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, "127.0.0.1:7070");
  auto resolved = dial_target("localhost:7070");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_TRUE(resolved->rfind("ipv4:", 0) == 0 || resolved->rfind("ipv6:", 0) == 0) << *resolved;
  EXPECT_NE(resolved->find(":7070"), std::string::npos) << *resolved;
  EXPECT_FALSE(dial_target("no port").ok());
}

}  // namespace
}  // namespace uop
