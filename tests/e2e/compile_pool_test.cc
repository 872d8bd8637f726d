// Compiles against a real uopd (its compile pool, server/task_queue.h; the bounds and
// checks of server/planner.h): a compile bomb from two clients no longer holds up a third
// client's small Run; a client that gives up leaves no compile running; Explain counts
// against a tenant's compiles= limit; kernels and planning over their bounds are refused
// naming the limit, and the server keeps serving.
//
// The bombs are graphs of many distinct kernels, each far under --max-kernel-ops but
// each costing LLVM real work: legal graphs, just a lot of them. What the tests observe
// is order and counts (Stats: the compile pool's queue and running tasks, the kernels
// compiled), never how long anything took.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "grpcpp/grpcpp.h"
#include "proto/uopd.grpc.pb.h"
#include "tests/e2e/background_call.h"
#include "tests/e2e/worker_proc.h"
#include "tests/unit/compiler/bomb_graphs.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using testing::BackgroundCall;
using testing::wait_until;
namespace pb = ::uopd::v1;

std::string scratch(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("uopd-pool-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool contains(absl::string_view text, absl::string_view what) { return text.find(what) != absl::string_view::npos; }

// A compile bomb: many distinct kernels of ~4 x leaves ops each (bomb_graphs.h).
struct Bomb {
  Graph g;
  const UOp* root = nullptr;
  Bomb(int kernels, int leaves, double salt) {
    TensorBuilder tb(g);
    root = testing::sums_of_leaves(tb, kernels, leaves, salt);
  }
};
constexpr int kBombKernels = 48;
constexpr int kBombLeaves = 600;  // ~2400 ops a kernel: well under the 16384 bound

pb::CompileRequest compile_request(const UOp* root) {
  pb::CompileRequest req;
  encode_proto(root, {}, req.mutable_graph());
  return req;
}
pb::ExplainRequest explain_request(const UOp* root) {
  pb::ExplainRequest req;
  encode_proto(root, {}, req.mutable_graph());
  return req;
}

std::unique_ptr<Client> connect(const std::string& address, const std::string& token = "") {
  ClientOptions o;
  o.address = address;
  o.bearer_token = token;
  auto c = Client::connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

client::Stats stats_of(Client& c) {
  auto s = c.stats();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : client::Stats{};
}

class CompilePool : public ::testing::Test {
 protected:
  void start(std::vector<std::string> args) {
    dir_ = scratch("srv");
    args.push_back("--cache-dir=" + dir_ + "/cache");
    args.push_back("--workers=1");
    auto p = EmbeddedServer::start(UOPD_BINARY, args);
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
  }
  void TearDown() override {
    if (server_) EXPECT_TRUE(server_->stop().ok()) << server_->log_tail();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
  std::unique_ptr<EmbeddedServer> server_;
};

TEST_F(CompilePool, ASmallRunIsServedWhileTwoClientsBombTheCompilePool) {
  start({"--compile-threads=2"});
  Bomb a(kBombKernels, kBombLeaves, 1.0), b(kBombKernels, kBombLeaves, 1000.0);
  BackgroundCall bomb_a(server_->address(), "", compile_request(a.root), &pb::Uopd::Stub::Compile);
  BackgroundCall bomb_b(server_->address(), "", compile_request(b.root), &pb::Uopd::Stub::Compile);
  auto observer = connect(server_->address());
  ASSERT_TRUE(observer);
  // Both bombs planned and queued: nearly all of their kernels wait for a thread.
  ASSERT_TRUE(wait_until([&] { return stats_of(*observer).compile_queue_depth >= 2 * kBombKernels - 8; },
                         absl::Seconds(120)))
      << "queue depth " << stats_of(*observer).compile_queue_depth;

  // A third client's Run of a graph nobody compiled yet.
  auto small = connect(server_->address());
  ASSERT_TRUE(small);
  auto session = small->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {16});
  const UOp* root = tb.sink({tb.alu(Op::ADD, {tb.alu(Op::MUL, {x, x}), tb.full(Scalar::Float32, 0.5, {16})})});
  HostTensor in = HostTensor::random(Scalar::Float32, {16}, 7);
  auto r = session->run(root, {}, {{tb.buffer_of(x), in}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 1u);
  ASSERT_EQ(r->kernels.size(), 1u);
  EXPECT_EQ(r->kernels[0].status, client::CacheStatus::Miss) << "it was compiled, not found";
  const float* xs = reinterpret_cast<const float*>(in.data.data());
  const float* ys = reinterpret_cast<const float*>(r->outputs[0].tensor.data.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(ys[i], xs[i] * xs[i] + 0.5f) << i;

  // It got its turns while the bombs were still queued: with one FIFO it would have
  // waited for every kernel queued before it.
  client::Stats during = stats_of(*observer);
  EXPECT_FALSE(bomb_a.done() || bomb_b.done()) << "the bombs had finished first";
  EXPECT_GT(during.compile_queue_depth, uint64_t{kBombKernels}) << "most of the bombs still wait";
  EXPECT_LT(during.compiles, uint64_t{kBombKernels}) << "kernels compiled before the small Run was served";

  // The bombers give up: their queued kernels are dropped and nothing is left running.
  bomb_a.cancel();
  bomb_b.cancel();
  EXPECT_EQ(bomb_a.finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(bomb_b.finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(wait_until([&] {
    client::Stats s = stats_of(*observer);
    return s.compile_queue_depth == 0 && s.compile_tasks_running == 0 && s.compiles_in_progress == 0;
  }, absl::Seconds(120)));
  EXPECT_LT(stats_of(*observer).compiles, uint64_t{2 * kBombKernels} - 8) << "the bombs' queued kernels were compiled anyway";
}

TEST_F(CompilePool, AClientPastItsDeadlineLeavesNoCompileRunning) {
  start({"--compile-threads=1"});
  Bomb bomb(kBombKernels, kBombLeaves, 3.0);
  ClientOptions o;
  o.address = server_->address();
  o.deadline = absl::Seconds(1);  // far less than the bomb's 48 compiles on one thread
  auto impatient = Client::connect(o);
  ASSERT_TRUE(impatient.ok()) << impatient.status();
  auto r = (*impatient)->compile(bomb.root, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  auto observer = connect(server_->address());
  ASSERT_TRUE(observer);
  ASSERT_TRUE(wait_until([&] {
    client::Stats s = stats_of(*observer);
    return s.compile_queue_depth == 0 && s.compile_tasks_running == 0 && s.compiles_in_progress == 0;
  }, absl::Seconds(120)));
  client::Stats after = stats_of(*observer);
  EXPECT_LT(after.compiles, uint64_t{kBombKernels} / 2) << "most of the compiles nobody waited for were still done";

  // Still serving, and the bomb's kernels were not half-stored: a patient client compiles
  // it all (one kernel each, none found broken).
  Bomb small(2, 8, 5.0);
  auto ok = observer->compile(small.root, {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->kernels.size(), 2u);
}

TEST_F(CompilePool, ExplainCountsAgainstTheTenantsCompileLimit) {
  const std::string tokens = scratch("tokens") + "/tokens";
  std::ofstream(tokens) << "erin erin-token-5 compiles=1\n";
  start({"--compile-threads=1", "--tokens-file=" + tokens});
  auto erin = connect(server_->address(), "erin-token-5");
  ASSERT_TRUE(erin);
  // The first Explain holds erin's one compile slot for as long as its bomb takes.
  Bomb bomb(kBombKernels, kBombLeaves, 7.0);
  BackgroundCall first(server_->address(), "erin-token-5", explain_request(bomb.root), &pb::Uopd::Stub::Explain);
  ASSERT_TRUE(wait_until([&] { return stats_of(*erin).compiles_in_progress == 1; }, absl::Seconds(60)));

  Bomb small(1, 4, 2.0);
  for (int i = 0; i < 3; ++i) {
    auto r = erin->explain(small.root, {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_TRUE(contains(r.status().message(), "concurrent compile limit of 1")) << r.status();
  }
  EXPECT_FALSE(first.done());
  first.cancel();
  EXPECT_EQ(first.finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(wait_until([&] {
    client::Stats s = stats_of(*erin);
    return s.compiles_in_progress == 0 && s.compile_queue_depth == 0 && s.compile_tasks_running == 0;
  }, absl::Seconds(120)));
  auto after = erin->explain(small.root, {});
  ASSERT_TRUE(after.ok()) << after.status();
  bool rendered = false;
  for (const client::ExplainStage& st : *after) rendered |= st.name == "render" && contains(st.text, "define");
  EXPECT_TRUE(rendered) << "the Explain went through lowering and LLVM";
}

TEST_F(CompilePool, KernelsAndPlansOverTheirBoundsAreRefusedNamingTheLimit) {
  start({});
  auto c = connect(server_->address());
  ASSERT_TRUE(c);
  // One kernel of 5000 leaves: some 25000 ops, over --max-kernel-ops (16384).
  Bomb huge(1, 5000, 1.0);
  for (bool explain : {false, true}) {
    absl::Status s = explain ? c->explain(huge.root, {}).status() : c->compile(huge.root, {}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_TRUE(contains(s.message(), "--max-kernel-ops")) << s;
    EXPECT_TRUE(contains(s.message(), "kernel ")) << s;
  }
  // A graph of a hundred nodes whose rangeify makes 2^20 index expressions.
  {
    Graph g;
    TensorBuilder tb(g);
    auto r = c->compile(testing::shifted_sums(tb, 20, int64_t{1} << 21), {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_TRUE(contains(r.status().message(), "--max-plan-nodes")) << r.status();
  }
  // And everyone else is still served.
  Bomb fine(2, 16, 9.0);
  auto ok = c->compile(fine.root, {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->kernels.size(), 2u);
}

}  // namespace
}  // namespace uop
