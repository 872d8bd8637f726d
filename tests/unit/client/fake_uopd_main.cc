// fake_uopd: FakeUopd as a process that keeps uopd's launch contract (--listen=HOST:PORT,
// one `LISTENING host:port` line on stdout when ready, a clean exit on SIGTERM), so the
// `uop --embedded` path is tested without the real server. Extra flags:
//   --exit-before-listening   exit 3 at once, writing a line to stderr (a broken uopd)
//   --ignore-sigterm          keep running on SIGTERM (uop must escalate to SIGKILL)
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "tests/unit/client/fake_uopd.h"

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  bool ignore_term = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--listen=", 0) == 0) listen = a.substr(9);
    else if (a == "--ignore-sigterm") ignore_term = true;
    else if (a == "--exit-before-listening") {
      std::fprintf(stderr, "fake_uopd: told to fail\n");
      return 3;
    }
  }
  // SIGTERM is taken synchronously by sigwait below, so it must be blocked before any
  // gRPC thread starts (threads inherit the mask).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  uop::testing::FakeUopd service;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "fake_uopd: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::string host = listen.substr(0, listen.rfind(':'));
  std::cout << "LISTENING " << host << ":" << port << std::endl;
  std::fprintf(stderr, "fake_uopd: serving on %s:%d\n", host.c_str(), port);
  for (;;) {
    int sig = 0;
    sigwait(&set, &sig);
    if (!ignore_term) break;
  }
  server->Shutdown();
  return 0;
}
