// transport/cluster_auth: secret files (modes, sizes, what is not a regular file, messages
// that never carry the secret), and a Gate and a Dialer on a real gRPC server on an
// ephemeral port: calls without the secret or with another are refused UNAUTHENTICATED
// before any handler runs, the open method needs none, and the right secret gets through.
#include "transport/cluster_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include "compiler/support/strings.h"
#include "proto/worker.grpc.pb.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;

class Dir {
 public:
  Dir() : path_(std::filesystem::temp_directory_path() / cat("uopd-cluster-auth-", getpid(), "-", std::rand())) {
    std::filesystem::create_directories(path_);
  }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& text, mode_t mode) const {
    std::string p = (path_ / name).string();
    std::ofstream(p) << text;
    chmod(p.c_str(), mode);
    return p;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

constexpr const char* kSecret = "7f3a9c0e5b2d4f6a8c1e3b5d7f9a0c2e";

TEST(SecretFile, ReadsTheSecretOfAPrivateFile) {
  Dir d;
  auto s = cluster_auth::read_secret_file(d.file("s", cat(kSecret, "\n"), 0600));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, kSecret);  // the trailing newline is not part of it
  auto ro = cluster_auth::read_secret_file(d.file("ro", kSecret, 0400));
  ASSERT_TRUE(ro.ok()) << ro.status();
  EXPECT_EQ(*ro, kSecret);
}

TEST(SecretFile, RefusesFilesOthersCanReadOrChange) {
  Dir d;
  for (mode_t mode : {0644, 0604, 0602, 0660, 0620}) {
    std::string p = d.file(cat("m", mode), kSecret, mode);
    auto s = cluster_auth::read_secret_file(p);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << std::oct << mode << " " << s.status();
    EXPECT_NE(s.status().message().find(p), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("chmod 600"), std::string::npos) << s.status();
    EXPECT_EQ(s.status().message().find(kSecret), std::string::npos) << "the message shows the secret";
  }
  // Group-readable: a secret mounted by root for a group (Kubernetes, Docker) is fine; a
  // user's own file readable by a group is not.
  std::string mounted = d.file("mounted", kSecret, 0640);
  if (getuid() == 0) {
    EXPECT_TRUE(cluster_auth::read_secret_file(mounted).ok());
    std::string mine = d.file("mine", kSecret, 0640);
    ASSERT_EQ(chown(mine.c_str(), 65534, 65534), 0);
    EXPECT_EQ(cluster_auth::read_secret_file(mine).status().code(), absl::StatusCode::kFailedPrecondition);
  } else {
    EXPECT_EQ(cluster_auth::read_secret_file(mounted).status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(SecretFile, RefusesWhatIsNoSecret) {
  Dir d;
  EXPECT_EQ(cluster_auth::read_secret_file(d.path("missing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_auth::read_secret_file(d.file("short", "password\n", 0600)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cluster_auth::read_secret_file(d.file("empty", "", 0600)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cluster_auth::read_secret_file(d.file("huge", std::string(8192, 'x'), 0600)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::filesystem::create_directory(d.path("dir"));
  chmod(d.path("dir").c_str(), 0700);
  EXPECT_EQ(cluster_auth::read_secret_file(d.path("dir")).status().code(), absl::StatusCode::kFailedPrecondition);
  // A FIFO where the file should be: refused at once, not read forever.
  ASSERT_EQ(mkfifo(d.path("fifo").c_str(), 0600), 0);
  EXPECT_EQ(cluster_auth::read_secret_file(d.path("fifo")).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RandomSecret, IsFreshEachTime) {
  std::string a = cluster_auth::random_secret(), b = cluster_auth::random_secret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(cluster_auth::random_hex(16).size(), 32u);
}

// The Worker service answering Info, behind a Gate.
class InfoService final : public wv1::Worker::Service {
 public:
  grpc::Status Info(grpc::ServerContext* ctx, const wv1::InfoRequest*, wv1::InfoResponse* resp) override {
    ++calls;
    // The secret is consumed before the handler: service code never sees it.
    saw_secret = ctx->client_metadata().count(std::string(cluster_auth::kSecretHeader)) > 0;
    resp->set_device("CPU:0");
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
  std::atomic<bool> saw_secret{false};
};

grpc::Status info(const cluster_auth::Dialer& d, const std::string& address) {
  auto stub = wv1::Worker::NewStub(d.channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  wv1::InfoResponse resp;
  return stub->Info(&ctx, wv1::InfoRequest(), &resp);
}

TEST(Gate, RefusesCallsWithoutTheSecretBeforeTheHandler) {
  grpc::EnableDefaultHealthCheckService(true);
  InfoService service;
  cluster_auth::Gate gate;
  gate.secret = kSecret;
  gate.open_methods = {"/grpc.health.v1.Health/Check"};
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", gate.credentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  ASSERT_TRUE(server && port > 0);
  const std::string address = cat("127.0.0.1:", port);

  cluster_auth::Dialer none, wrong, right;
  wrong.secret = "another-secret-of-the-same-size";
  right.secret = kSecret;
  for (const cluster_auth::Dialer* d : {&none, &wrong}) {
    grpc::Status st = info(*d, address);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_NE(st.error_message().find("/uopd.worker.v1.Worker/Info"), std::string::npos) << st.error_message();
    EXPECT_EQ(st.error_message().find(kSecret), std::string::npos);
  }
  EXPECT_EQ(service.calls.load(), 0) << "a refused call reached the handler";
  grpc::Status ok = info(right, address);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(service.calls.load(), 1);
  EXPECT_FALSE(service.saw_secret.load());

  // The health check is open: a probe has no secret to give.
  grpc::GenericStub generic(none.channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");
  grpc::ByteBuffer req(&empty, 1), resp;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status health;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
    std::lock_guard<std::mutex> l(mu);
    health = std::move(s);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done; });
  EXPECT_TRUE(health.ok()) << health.error_message();
  server->Shutdown();
}

}  // namespace
}  // namespace uop
