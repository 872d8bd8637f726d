// Tenants (server/auth.h) end to end: a real uopd started with --tokens-file, driven by
// clients holding each tenant's bearer token. What the server promises: no token, no
// service (UNAUTHENTICATED, the token never echoed); a tenant finds only its own sessions
// and buffers (another's session id is NOT_FOUND, worded like one that never existed, and
// nothing of it changes); quotas refused with RESOURCE_EXHAUSTED naming the limit; the
// compile cache shared by digest, except for a tenant that asked for a namespace of its own.
// The tokens file parser and the rate / compile limits are checked without a server first.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/ir/digest.h"
#include "compiler/ir/tensor_builder.h"
#include "grpcpp/grpcpp.h"
#include "proto/uopd.grpc.pb.h"
#include "server/auth.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using server::Tenant;
using server::Tenants;

std::string scratch(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("uopd-tenants-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool contains(const absl::Status& s, std::string_view what) {
  return std::string_view(s.message().data(), s.message().size()).find(what) != std::string_view::npos;
}

// ---- The tokens file and the limits, without a server ----

TEST(Tenants, ParsesTheTokensFile) {
  auto t = Tenants::parse(
      "# tenants\n"
      "alice  alice-token-0123456789  bytes=4096 sessions=2 compiles=1 rps=2.5 burst=5\n"
      "\n"
      "bob sha256:" + sha256("bob-token").hex() + " cache=private   # hashed token\n",
      "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->enabled());
  auto alice = (*t)->authenticate({"Bearer alice-token-0123456789"});
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ((*alice)->name(), "alice");
  EXPECT_EQ((*alice)->quota().max_bytes, 4096u);
  EXPECT_EQ((*alice)->quota().max_sessions, 2u);
  EXPECT_EQ((*alice)->quota().max_compiles, 1u);
  EXPECT_DOUBLE_EQ((*alice)->quota().requests_per_second, 2.5);
  EXPECT_DOUBLE_EQ((*alice)->quota().burst, 5);
  EXPECT_EQ((*alice)->cache_namespace(), "");
  auto bob = (*t)->authenticate({"Bearer bob-token"});
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ((*bob)->name(), "bob");
  EXPECT_NE((*bob)->cache_namespace(), "");

  for (std::vector<std::string_view> bad : {std::vector<std::string_view>{}, {"Bearer nope"}, {"alice-token-0123456789"},
                                            {"Basic alice-token-0123456789"}}) {
    auto r = (*t)->authenticate(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_FALSE(contains(r.status(), "alice-token")) << "the token is never echoed";
  }
  EXPECT_EQ((*t)->auth_failures(), 4u);
}

TEST(Tenants, RefusesBadTokensFiles) {
  struct Case {
    std::string text, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"alice\n", "tokens:1"},
           {"alice t1\nalice t2\n", "listed twice"},
           {"alice t1\nbob t1\n", "token of another tenant"},
           {"al/ce t1\n", "tenant name"},
           {"alice t1 bytes=lots\n", "bad value for bytes"},
           {"alice t1 colour=red\n", "unknown setting"},
           {"alice sha256:abc\n", "64 lowercase hex"},
           {"# nobody\n", "no tenants"},
       }) {
    auto t = Tenants::parse(c.text, "tokens");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(t.status(), c.expect)) << t.status() << " wants " << c.expect;
  }
  EXPECT_EQ(Tenants::load("/nonexistent/tokens").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Tenants::anonymous()->enabled());
}

TEST(Tenants, RateAndCompileLimitsSayWhichLimit) {
  // One request per 1000 s with a burst of 2: the third one now is refused, whatever the
  // speed of the machine.
  Tenant t("carol", {.max_compiles = 1, .requests_per_second = 0.001, .burst = 2}, false);
  absl::Time now = absl::Now();
  EXPECT_TRUE(t.admit_request(now).ok());
  EXPECT_TRUE(t.admit_request(now).ok());
  absl::Status third = t.admit_request(now);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(third, "request rate")) << third;
  EXPECT_TRUE(t.admit_request(now + absl::Seconds(1001)).ok()) << "the bucket refills";

  auto first = t.begin_compile();
  ASSERT_TRUE(first.ok());
  auto second = t.begin_compile();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(second.status(), "concurrent compile")) << second.status();
  { auto done = std::move(*first); }  // released
  EXPECT_TRUE(t.begin_compile().ok());
  EXPECT_EQ(t.rejections()["rps"], 1u);
  EXPECT_EQ(t.rejections()["compiles"], 1u);
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

}  // namespace
}  // namespace uop
