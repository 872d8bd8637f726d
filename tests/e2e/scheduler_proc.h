// A uopd started by an e2e test (client::EmbeddedServer) with a client connected to it,
// and the small things the tests of schedulers and their workers share: a scratch
// directory, a command's exit status and output, a device's line in Stats.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/support/strings.h"

namespace uop::testing {

// A fresh directory under the system's temporary one.
inline std::string scratch_dir(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             cat("uopd-", tag, "-", static_cast<int64_t>(getpid()), "-", std::rand());
  std::filesystem::create_directories(dir);
  return dir.string();
}

// `binary args...` through the shell: its exit status and what it printed (both streams).
inline std::pair<int, std::string> run_command(const std::string& binary, const std::string& args) {
  FILE* f = popen(cat(binary, " ", args, " 2>&1").c_str(), "r");
  if (!f) return {-1, ""};
  std::string out;
  char buf[256];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Stats' line for `device`; empty when Stats fails (the test fails too) or lists none.
inline client::WorkerStatus worker_status(client::Client& c, const std::string& device) {
  auto st = c.stats();
  EXPECT_TRUE(st.ok()) << st.status();
  if (st.ok())
    for (const auto& w : st->workers)
      if (w.device == device) return w;
  return {};
}

struct SchedulerProc {
  std::unique_ptr<client::EmbeddedServer> proc;
  std::unique_ptr<client::Client> client;

  // `uopd args...` and a client (with `token` as its bearer token, if any); on failure
  // the test fails and `client` stays null.
  static SchedulerProc start(const std::string& uopd, const std::vector<std::string>& args, const std::string& token = "") {
    SchedulerProc s;
    auto p = client::EmbeddedServer::start(uopd, args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return s;
    s.proc = std::move(*p);
    client::ClientOptions o;
    o.address = s.proc->address();
    o.bearer_token = token;
    auto c = client::Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) s.client = std::move(*c);
    return s;
  }
  client::WorkerStatus worker(const std::string& device) { return worker_status(*client, device); }
};

}  // namespace uop::testing
