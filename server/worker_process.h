// Starting and waiting for a child process, the POSIX part of WorkerPool. The child runs
// only async-signal-safe code between fork and exec (the scheduler is multi-threaded), dies
// with the thread that forked it (PR_SET_PDEATHSIG), gets its own process group (a
// terminal's ^C reaches the scheduler, which drains and then stops its workers) and
// default signal handling, and writes its stdout into a pipe we read. What it must know but
// others on the host must not (its secrets) it reads from a pipe, not from its argv.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace uop {

struct ChildProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  // the read end of the child's stdout, non-blocking, close-on-exec
};

// fork + execv(argv[0], argv). FAILED_PRECONDITION naming the binary when exec fails
// (the child is reaped already), INTERNAL when pipe or fork fails. The descriptors in
// `inherit` (close-on-exec here) stay open in the child under the same numbers.
absl::StatusOr<ChildProcess> spawn_child(const std::vector<std::string>& argv, const std::vector<int>& inherit = {});

// A descriptor (close-on-exec) to hand a child in spawn_child's `inherit`, from which it
// reads `bytes` and then end of file: a pipe written here and closed at this end. At
// most a pipe's capacity (64 KiB), so writing never blocks; INTERNAL when pipe fails.
absl::StatusOr<int> readable_pipe(std::string_view bytes);

// waitpid: nullopt while the child runs (never with `block`), else how it ended
// ("killed by signal 9 (SIGKILL)", "exited with status 3").
std::optional<std::string> reap_child(pid_t pid, bool block);

}  // namespace uop
