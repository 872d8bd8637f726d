// Tenants (server/auth.h) end to end: a real uopd started with --tokens-file, driven by
// clients holding each tenant's bearer token. What the server promises: no token, no
// service (UNAUTHENTICATED, the token never echoed); a tenant finds only its own sessions
// and buffers (another's session id is NOT_FOUND, worded like one that never existed, and
// nothing of it changes); quotas refused with RESOURCE_EXHAUSTED naming the limit; the
// compile cache shared by digest, except for a tenant that asked for a namespace of its own.
// The tokens file parser, the limits and reloading without a server: tests/unit/server/auth_test.cc.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/ir/tensor_builder.h"
#include "grpcpp/grpcpp.h"
#include "proto/uopd.grpc.pb.h"
#include "tests/e2e/worker_proc.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;

std::string scratch(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("uopd-tenants-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool contains(const absl::Status& s, std::string_view what) {
  return std::string_view(s.message().data(), s.message().size()).find(what) != std::string_view::npos;
}

// ---- A real uopd with a tokens file ----

struct Graphs {
  Graph g;
  const UOp* root;
  const UOp* x;
  explicit Graphs(int64_t n = 64) {
    TensorBuilder tb(g);
    const UOp* in = tb.input(Scalar::Float32, {n});
    x = tb.buffer_of(in);
    root = tb.sink({tb.alu(Op::MUL, {in, in})});
  }
};

class TenantsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch("srv");
    tokens_ = dir_ + "/tokens";
    std::ofstream(tokens_) << "alice alice-secret-1 bytes=4096 sessions=2\n"
                           << "bob   bob-secret-2   cache=private\n"
                           << "carol carol-secret-3\n"
                           << "dave  dave-secret-4  rps=0.001 burst=3\n";
    auto p = EmbeddedServer::start(UOPD_BINARY, {"--cache-dir=" + dir_ + "/cache", "--workers=1", "--tokens-file=" + tokens_});
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
  }
  std::unique_ptr<Client> as(const std::string& token) {
    ClientOptions o;
    o.address = server_->address();
    o.bearer_token = token;
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::string dir_, tokens_;
  std::unique_ptr<EmbeddedServer> server_;
};

TEST_F(TenantsE2E, NoTokenNoService) {
  for (std::string token : {"", "alice-secret-1x", "Bearer alice-secret-1"}) {
    auto c = as(token);
    ASSERT_TRUE(c);
    auto s = c->create_session();
    EXPECT_EQ(s.status().code(), absl::StatusCode::kUnauthenticated) << "token '" << token << "': " << s.status();
    EXPECT_FALSE(contains(s.status(), "secret")) << s.status();
    EXPECT_EQ(c->stats().status().code(), absl::StatusCode::kUnauthenticated);
    Graphs g;
    EXPECT_EQ(c->compile(g.root, {}).status().code(), absl::StatusCode::kUnauthenticated);
  }
  auto alice = as("alice-secret-1");
  ASSERT_TRUE(alice);
  EXPECT_TRUE(alice->stats().ok());
}

TEST_F(TenantsE2E, ATenantSeesOnlyItsOwnSessionsAndBuffers) {
  auto alice = as("alice-secret-1"), bob = as("bob-secret-2");
  ASSERT_TRUE(alice && bob);
  auto mine = alice->create_session();
  ASSERT_TRUE(mine.ok()) << mine.status();
  HostTensor secret = HostTensor::random(Scalar::Float32, {64}, 42);
  auto buf = mine->upload_tensor(secret);
  ASSERT_TRUE(buf.ok()) << buf.status();

  // Bob's session object pointed at Alice's session id: every call is NOT_FOUND, worded
  // exactly as for a session that does not exist.
  auto theirs = bob->create_session();
  ASSERT_TRUE(theirs.ok());
  auto never = bob->create_session();
  ASSERT_TRUE(never.ok());
  std::string never_id = never->id();
  ASSERT_TRUE(never->close().ok());

  // A raw stub speaks for Bob with Alice's ids.
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto stub = ::uopd::v1::Uopd::NewStub(channel);
  auto bob_ctx = [] {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer bob-secret-2");
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  };
  auto same_as_missing = [&](const grpc::Status& got, const grpc::Status& missing, const char* what) {
    EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND) << what << ": " << got.error_message();
    std::string g = got.error_message(), m = missing.error_message();
    // Same words, the ids aside.
    auto strip = [](std::string s, const std::string& id) {
      for (size_t p; (p = s.find(id)) != std::string::npos;) s.erase(p, id.size());
      return s;
    };
    EXPECT_EQ(strip(g, mine->id()), strip(m, never_id)) << what;
  };
  {
    ::uopd::v1::DownloadRequest req;
    req.set_session_id(mine->id());
    req.set_buffer_id(*buf);
    auto ctx = bob_ctx();
    auto reader = stub->Download(ctx.get(), req);
    ::uopd::v1::DownloadChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk)) << "no byte of Alice's buffer reaches Bob";
    grpc::Status got = reader->Finish();
    req.set_session_id(never_id);
    auto ctx2 = bob_ctx();
    auto reader2 = stub->Download(ctx2.get(), req);
    while (reader2->Read(&chunk)) {
    }
    same_as_missing(got, reader2->Finish(), "Download");
  }
  {
    ::uopd::v1::CreateBufferRequest req;
    req.set_session_id(mine->id());
    req.set_dtype(::uop::v1::DType::FLOAT32);
    req.set_elements(4);
    ::uopd::v1::CreateBufferResponse resp;
    auto c1 = bob_ctx();
    grpc::Status got = stub->CreateBuffer(c1.get(), req, &resp);
    req.set_session_id(never_id);
    auto c2 = bob_ctx();
    same_as_missing(got, stub->CreateBuffer(c2.get(), req, &resp), "CreateBuffer");
  }
  {
    ::uopd::v1::UploadChunk chunk;
    chunk.set_session_id(mine->id());
    chunk.set_buffer_id(*buf);
    chunk.set_data(std::string(256, '\0'));  // would zero Alice's data
    ::uopd::v1::UploadResponse resp;
    auto c1 = bob_ctx();
    auto w = stub->Upload(c1.get(), &resp);
    w->Write(chunk);
    w->WritesDone();
    grpc::Status got = w->Finish();
    chunk.set_session_id(never_id);
    auto c2 = bob_ctx();
    auto w2 = stub->Upload(c2.get(), &resp);
    w2->Write(chunk);
    w2->WritesDone();
    same_as_missing(got, w2->Finish(), "Upload");
  }
  for (const char* method : {"FreeBuffer", "CloseSession"}) {
    grpc::Status got, missing;
    for (const std::string& sid : {mine->id(), never_id}) {
      auto ctx = bob_ctx();
      grpc::Status s;
      if (std::string(method) == "FreeBuffer") {
        ::uopd::v1::FreeBufferRequest req;
        req.set_session_id(sid);
        req.set_buffer_id(*buf);
        ::uopd::v1::FreeBufferResponse resp;
        s = stub->FreeBuffer(ctx.get(), req, &resp);
      } else {
        ::uopd::v1::CloseSessionRequest req;
        req.set_session_id(sid);
        ::uopd::v1::CloseSessionResponse resp;
        s = stub->CloseSession(ctx.get(), req, &resp);
      }
      (sid == never_id ? missing : got) = s;
    }
    same_as_missing(got, missing, method);
  }
  {
    Graphs g;
    ::uopd::v1::RunRequest req;
    req.set_session_id(mine->id());
    *req.mutable_graph() = [&] {
      ::uop::v1::Graph wire;
      EXPECT_TRUE(wire.ParseFromString(encode_binary(g.root)));
      return wire;
    }();
    ::uopd::v1::RunResponse resp;
    auto c1 = bob_ctx();
    grpc::Status got = stub->Run(c1.get(), req, &resp);
    req.set_session_id(never_id);
    auto c2 = bob_ctx();
    same_as_missing(got, stub->Run(c2.get(), req, &resp), "Run");
  }

  // Alice's session and data are untouched by all of it.
  auto back = mine->download(*buf);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, secret.data);
  // Each tenant's Stats count its own sessions and buffers only.
  auto as_alice = alice->stats();
  auto as_bob = bob->stats();
  ASSERT_TRUE(as_alice.ok() && as_bob.ok());
  EXPECT_EQ(as_alice->sessions, 1u);
  EXPECT_EQ(as_alice->buffers, 1u);
  EXPECT_EQ(as_alice->buffer_bytes, 256u);
  EXPECT_EQ(as_bob->sessions, 1u);
  EXPECT_EQ(as_bob->buffers, 0u);
}

TEST_F(TenantsE2E, QuotasSayWhichLimit) {
  auto alice = as("alice-secret-1");
  ASSERT_TRUE(alice);
  auto s1 = alice->create_session();
  auto s2 = alice->create_session();
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto s3 = alice->create_session();
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kResourceExhausted) << s3.status();
  EXPECT_TRUE(contains(s3.status(), "session limit")) << s3.status();

  // 4096 bytes across all of Alice's sessions.
  ASSERT_TRUE(s1->create_buffer(Scalar::Float32, 768).ok());
  auto over = s2->create_buffer(Scalar::Float32, 512);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_TRUE(contains(over.status(), "byte quota")) << over.status();
  EXPECT_TRUE(contains(over.status(), "alice")) << over.status();
  auto fits = s2->create_buffer(Scalar::Float32, 256);
  ASSERT_TRUE(fits.ok()) << fits.status();
  // Closing a session gives its bytes and its session slot back.
  ASSERT_TRUE(s1->close().ok());
  EXPECT_TRUE(s2->create_buffer(Scalar::Float32, 512).ok());
  EXPECT_TRUE(alice->create_session().ok());

  // Dave may send 3 requests in 1000 s.
  auto dave = as("dave-secret-4");
  ASSERT_TRUE(dave);
  int refused = 0;
  for (int i = 0; i < 5; ++i) {
    auto st = dave->stats();
    if (st.ok()) continue;
    ++refused;
    EXPECT_EQ(st.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(contains(st.status(), "request rate")) << st.status();
  }
  EXPECT_EQ(refused, 2);
  // Others are not slowed by Dave's limit.
  EXPECT_TRUE(alice->stats().ok());
}

TEST_F(TenantsE2E, TheCompileCacheIsSharedUnlessATenantAsksForItsOwn) {
  auto alice = as("alice-secret-1"), bob = as("bob-secret-2"), carol = as("carol-secret-3");
  ASSERT_TRUE(alice && bob && carol);
  Graphs g(96);
  auto first = alice->compile(g.root, {});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->kernels.empty());
  for (auto& k : first->kernels) EXPECT_EQ(k.status, client::CacheStatus::Miss);
  // Carol shares the cache: the same kernel is a hit, keyed by the same digest.
  auto shared = carol->compile(g.root, {});
  ASSERT_TRUE(shared.ok()) << shared.status();
  for (size_t i = 0; i < shared->kernels.size(); ++i) {
    EXPECT_EQ(shared->kernels[i].status, client::CacheStatus::Hit);
    EXPECT_EQ(shared->kernels[i].cache_key, first->kernels[i].cache_key);
  }
  // Bob asked for a namespace of his own: no hit on what Alice compiled, other keys.
  auto own = bob->compile(g.root, {});
  ASSERT_TRUE(own.ok()) << own.status();
  for (size_t i = 0; i < own->kernels.size(); ++i) {
    EXPECT_EQ(own->kernels[i].status, client::CacheStatus::Miss);
    EXPECT_EQ(own->kernels[i].digest, first->kernels[i].digest);
    EXPECT_NE(own->kernels[i].cache_key, first->kernels[i].cache_key);
  }
  auto again = bob->compile(g.root, {});
  ASSERT_TRUE(again.ok());
  for (auto& k : again->kernels) EXPECT_EQ(k.status, client::CacheStatus::Hit);
  // And the result of Bob's run is right.
  auto session = bob->create_session();
  ASSERT_TRUE(session.ok());
  HostTensor x = HostTensor::random(Scalar::Float32, {96}, 3);
  auto r = session->run(g.root, {}, {{g.x, x}});
  ASSERT_TRUE(r.ok()) << r.status();
  for (int64_t i = 0; i < 96; ++i)
    EXPECT_FLOAT_EQ(static_cast<float>(r->outputs[0].tensor.get(i).as_float()),
                    static_cast<float>(x.get(i).as_float() * x.get(i).as_float()));
}

TEST_F(TenantsE2E, TheUopCommandTakesATokenFromFlagOrEnvironment) {
  auto run = [&](const std::string& env, const std::string& flag) {
    std::string cmd = env + " " UOP_BINARY " stats --server=" + server_->address() + " " + flag + " >/dev/null 2>&1";
    int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  EXPECT_EQ(run("env -u UOPD_TOKEN", ""), 1);
  EXPECT_EQ(run("env -u UOPD_TOKEN", "--token=carol-secret-3"), 0);
  EXPECT_EQ(run("env UOPD_TOKEN=carol-secret-3", ""), 0);
  EXPECT_EQ(run("env UOPD_TOKEN=wrong", ""), 1);
}

// ---- Reloading the tokens file (SIGHUP) ----

// Polls `done` until it holds or `limit` passes: a bound for a server that never gets
// there, not a timing check.
template <typename F>
bool eventually(F done, absl::Duration limit = absl::Seconds(60)) {
  for (absl::Time until = absl::Now() + limit; !done();) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

class TenantsReloadE2E : public TenantsE2E {
 protected:
  // The whole file at once (a reload never reads half of it), then SIGHUP.
  void rewrite_and_hup(const std::string& text) {
    std::ofstream(tokens_ + ".new") << text;
    std::filesystem::rename(tokens_ + ".new", tokens_);
    ASSERT_EQ(::kill(server_->pid(), SIGHUP), 0);
  }
  size_t count_in_log(std::string_view what) const {
    std::string log = server_->log_tail(1 << 20);
    size_t n = 0;
    for (size_t p = log.find(what); p != std::string::npos; p = log.find(what, p + 1)) ++n;
    return n;
  }
};

TEST_F(TenantsReloadE2E, SighupReloadsTokensAndQuotasKeepingUsage) {
  auto alice = as("alice-secret-1"), bob = as("bob-secret-2"), carol = as("carol-secret-3"), erin = as("erin-secret-5");
  ASSERT_TRUE(alice && bob && carol && erin);
  EXPECT_EQ(erin->stats().status().code(), absl::StatusCode::kUnauthenticated);
  auto held = alice->create_session();
  ASSERT_TRUE(held.ok()) << held.status();
  HostTensor data = HostTensor::random(Scalar::Float32, {256}, 7);  // 1024 bytes of alice's 4096
  auto buf = held->upload_tensor(data);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto bobs = bob->create_session();
  ASSERT_TRUE(bobs.ok());

  // Bob goes, Carol's token changes, Erin comes, Alice's limits shrink.
  rewrite_and_hup("alice alice-secret-1 bytes=1536 sessions=1\n"
                  "carol carol-secret-new\n"
                  "dave  dave-secret-4  rps=0.001 burst=3\n"
                  "erin  erin-secret-5  sessions=1\n");
  ASSERT_TRUE(eventually([&] { return erin->stats().ok(); })) << server_->log_tail();
  EXPECT_EQ(count_in_log("reloaded tokens file"), 1u) << server_->log_tail();

  for (auto* gone : {bob.get(), carol.get()}) {
    auto st = gone->stats();
    EXPECT_EQ(st.status().code(), absl::StatusCode::kUnauthenticated) << st.status();
    EXPECT_EQ(gone->create_session().status().code(), absl::StatusCode::kUnauthenticated);
  }
  // Bob's session is out of reach of every token left.
  EXPECT_EQ(bobs->create_buffer(Scalar::Float32, 4).status().code(), absl::StatusCode::kUnauthenticated);
  auto carol2 = as("carol-secret-new");
  ASSERT_TRUE(carol2);
  EXPECT_TRUE(carol2->stats().ok());

  // Alice keeps her session and her 1024 bytes; the new limits count them.
  auto back = held->download(*buf);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data.data);
  auto over = held->create_buffer(Scalar::Float32, 256);  // 1024 + 1024 > 1536
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_TRUE(contains(over.status(), "byte quota")) << over.status();
  EXPECT_TRUE(held->create_buffer(Scalar::Float32, 128).ok()) << "1024 + 512 fits";
  auto second = alice->create_session();  // one open, limit 1
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_TRUE(contains(second.status(), "session limit")) << second.status();
  auto erins = erin->create_session();
  ASSERT_TRUE(erins.ok()) << erins.status();
  EXPECT_EQ(erin->create_session().status().code(), absl::StatusCode::kResourceExhausted);

  // A file that does not parse: logged with its file and line, and nothing changes.
  rewrite_and_hup("alice alice-secret-1\n"
                  "frank frank-secret-6 colour=red\n");
  ASSERT_TRUE(eventually([&] { return count_in_log("not reloaded") == 1; })) << server_->log_tail();
  EXPECT_EQ(count_in_log(tokens_ + ":2:"), 1u) << server_->log_tail();
  EXPECT_TRUE(erin->stats().ok());
  EXPECT_TRUE(carol2->stats().ok());
  EXPECT_EQ(as("frank-secret-6")->stats().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(alice->create_session().status().code(), absl::StatusCode::kResourceExhausted) << "the limits in force stay";

  // The next good file takes effect as usual.
  rewrite_and_hup("alice alice-secret-1 sessions=2\nfrank frank-secret-6\n");
  auto frank = as("frank-secret-6");
  ASSERT_TRUE(eventually([&] { return frank->stats().ok(); })) << server_->log_tail();
  EXPECT_EQ(erin->stats().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(alice->create_session().ok()) << "limit raised to 2";
  EXPECT_TRUE(server_->stop().ok()) << server_->log_tail();
}

TEST(TenantsReload, SighupWithoutATokensFileIsHarmless) {
  std::string dir = scratch("nohup");
  auto p = EmbeddedServer::start(UOPD_BINARY, {"--cache-dir=" + dir + "/cache", "--workers=1"});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(::kill((*p)->pid(), SIGHUP), 0);
  ASSERT_TRUE(eventually([&] { return (*p)->log_tail().find("nothing to reload") != std::string::npos; }))
      << (*p)->log_tail();
  ClientOptions o;
  o.address = (*p)->address();
  auto c = Client::connect(o);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->stats().ok());
  EXPECT_TRUE((*p)->stop().ok()) << (*p)->log_tail();
}

// ---- The plan cache and private namespaces ----

TEST_F(TenantsE2E, APrivateTenantNeitherSeesNorWarmsOthersPlans) {
  auto alice = as("alice-secret-1"), bob = as("bob-secret-2"), carol = as("carol-secret-3");
  ASSERT_TRUE(alice && bob && carol);
  Graphs g(80);
  auto first = alice->compile(g.root, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->plan_cached);
  // Two shared tenants share plans as they share kernels.
  auto shared = carol->compile(g.root, {});
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_TRUE(shared->plan_cached);
  // Bob (cache=private) learns nothing from Alice's compile: plan and kernels are his own.
  auto own = bob->compile(g.root, {});
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_FALSE(own->plan_cached);
  EXPECT_EQ(own->graph_digest, first->graph_digest);
  ASSERT_EQ(own->kernels.size(), first->kernels.size());
  for (size_t i = 0; i < own->kernels.size(); ++i) {
    EXPECT_EQ(own->kernels[i].status, client::CacheStatus::Miss);
    EXPECT_NE(own->kernels[i].cache_key, first->kernels[i].cache_key);
  }
  auto again = bob->compile(g.root, {});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->plan_cached);

  // The other way round: what Bob plans first warms nothing for the shared tenants.
  Graphs h(48);
  auto bobs = bob->compile(h.root, {});
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_FALSE(bobs->plan_cached);
  auto alices = alice->compile(h.root, {});
  ASSERT_TRUE(alices.ok()) << alices.status();
  EXPECT_FALSE(alices->plan_cached);
  for (auto& k : alices->kernels) EXPECT_EQ(k.status, client::CacheStatus::Miss);

  // Run plans in the tenant's namespace too: Bob running a graph Carol planned is a plan
  // cache miss (the server's counters, one request at a time here).
  Graphs r(112);
  auto carols = carol->compile(r.root, {});
  ASSERT_TRUE(carols.ok());
  auto before = carol->stats();
  ASSERT_TRUE(before.ok());
  auto session = bob->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  HostTensor x = HostTensor::random(Scalar::Float32, {112}, 5);
  auto out = session->run(r.root, {}, {{r.x, x}});
  ASSERT_TRUE(out.ok()) << out.status();
  for (auto& k : out->kernels) EXPECT_EQ(k.status, client::CacheStatus::Miss);
  auto after = carol->stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->plan_cache_hits, before->plan_cache_hits);
  EXPECT_EQ(after->plan_cache_misses, before->plan_cache_misses + 1);
}

// ---- Tenant isolation: each tenant's buffers and kernels in worker processes of its own ----

// The uop-worker processes `parent` started, by pid.
std::vector<pid_t> worker_children(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read from the last ')'.
    auto close = line.rfind(')');
    auto open = line.find('(');
    if (close == std::string::npos || open == std::string::npos) continue;
    std::string comm = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && comm == "uop-worker" && state != "Z") out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

class TenantIsolationE2E : public TenantsE2E {
 protected:
  void SetUp() override {
    dir_ = scratch("iso");
    tokens_ = dir_ + "/tokens";
    std::ofstream(tokens_) << "alice alice-secret-1\nbob bob-secret-2\ncarol carol-secret-3\n";
    // Two tenant processes at most; one unused with no session left goes at once.
    auto p = EmbeddedServer::start(UOPD_BINARY, {"--cache-dir=" + dir_ + "/cache", "--workers=1", "--tokens-file=" + tokens_,
                                                 "--max-tenant-workers=2", "--tenant-worker-idle-s=0"});
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
  }
  size_t workers() const { return worker_children(server_->pid()).size(); }
};

TEST_F(TenantIsolationE2E, EachTenantRunsInWorkerProcessesOfItsOwn) {
  const size_t shared = workers();  // the embedded slot's own process
  ASSERT_EQ(shared, 1u);
  auto alice = as("alice-secret-1"), bob = as("bob-secret-2"), carol = as("carol-secret-3");
  ASSERT_TRUE(alice && bob && carol);
  Graphs g(64);
  auto sa = alice->create_session(), sb = bob->create_session();
  ASSERT_TRUE(sa.ok() && sb.ok()) << sa.status() << " " << sb.status();
  EXPECT_EQ(workers(), shared + 2) << "one process for Alice's CPU:0, one for Bob's";
  HostTensor x = HostTensor::random(Scalar::Float32, {64}, 7);
  auto in_a = sa->upload_tensor(x);
  ASSERT_TRUE(in_a.ok()) << in_a.status();
  for (auto* s : {&*sa, &*sb}) {
    auto r = s->run(g.root, {}, {{g.x, x}});
    ASSERT_TRUE(r.ok()) << r.status();
    for (int64_t i = 0; i < 64; ++i)
      EXPECT_FLOAT_EQ(static_cast<float>(r->outputs[0].tensor.get(i).as_float()),
                      static_cast<float>(x.get(i).as_float() * x.get(i).as_float()));
  }
  // Each sees its own process, never the other's.
  auto st_a = alice->stats(), st_b = bob->stats();
  ASSERT_TRUE(st_a.ok() && st_b.ok());
  auto own = [](const client::Stats& s) {
    std::vector<std::string> ids;
    for (const auto& w : s.workers)
      if (w.id.find("tenant") != std::string::npos) ids.push_back(w.id);
    return ids;
  };
  ASSERT_EQ(own(*st_a).size(), 1u);
  ASSERT_EQ(own(*st_b).size(), 1u);
  EXPECT_NE(own(*st_a)[0], own(*st_b)[0]);

  // Both processes are taken (each tenant holds a session on the device): a third tenant
  // is refused, naming the limit, and nothing of the others is touched.
  auto sc = carol->create_session();
  EXPECT_EQ(sc.status().code(), absl::StatusCode::kResourceExhausted) << sc.status();
  EXPECT_TRUE(contains(sc.status(), "--max-tenant-workers")) << sc.status();
  auto back = sa->download(*in_a);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, x.data);

  // Alice leaves: her process makes room for Carol's, and goes.
  ASSERT_TRUE(sa->close().ok());
  const std::vector<pid_t> before = worker_children(server_->pid());
  auto sc2 = carol->create_session();
  ASSERT_TRUE(sc2.ok()) << sc2.status();
  auto rc = sc2->run(g.root, {}, {{g.x, x}});
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_TRUE(testing::wait_until([&] { return workers() == shared + 2; })) << workers() << " workers";
  std::vector<pid_t> after = worker_children(server_->pid());
  size_t kept = 0;
  for (pid_t p : after) kept += std::find(before.begin(), before.end(), p) != before.end();
  EXPECT_EQ(kept, shared + 1) << "the shared process and Bob's stay; Alice's was replaced by Carol's";

  // Closing the last sessions: their processes are retired once unused (idle time 0 here).
  ASSERT_TRUE(sb->close().ok());
  ASSERT_TRUE(sc2->close().ok());
  EXPECT_TRUE(testing::wait_until([&] { return workers() == shared; })) << workers() << " workers";
}

}  // namespace
}  // namespace uop
