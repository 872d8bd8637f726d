// Per-kernel profiles end to end: a real uopd and its uop-worker processes. A profiled Run
// answers, per kernel, the launches its workers timed, named as Compile names the kernel,
// with the flop and byte counts the compiler estimated (checked here against counts the
// test works out from the graph), and feeds uopd_kernel_seconds; a Run that does not ask
// gets no profile and has no launch timed.
#include <chrono>
#include <filesystem>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "tests/e2e/metrics_scrape.h"

namespace uop {
namespace {

using client::Client;
using client::EmbeddedServer;

// One uopd with one CPU worker and its /metrics, and a session on it, for each test.
class Profile : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = std::filesystem::temp_directory_path() / cat("uopd-profile-", ::getpid());
    auto p = EmbeddedServer::start(UOPD_BINARY, {"--workers=1", "--metrics-listen=127.0.0.1:0", "--cache-dir=" + dir.string()});
    ASSERT_TRUE(p.ok()) << p.status();
    proc = std::move(*p);
    client::ClientOptions o;
    o.address = proc->address();
    auto c = Client::connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client = std::move(*c);
    metrics = testing::metrics_address(*proc);
    ASSERT_FALSE(metrics.empty()) << proc->log_tail();
    auto s = client->create_session();
    ASSERT_TRUE(s.ok()) << s.status();
    session.emplace(std::move(*s));
  }
  double kernel_seconds_count() const {
    return testing::gauge(testing::scrape(metrics), "uopd_kernel_seconds_count{kind=\"cpu\"}");
  }

  std::unique_ptr<EmbeddedServer> proc;
  std::unique_ptr<Client> client;
  std::string metrics;
  std::optional<client::Session> session;
};

// C = A @ B for N x N float matrices (one kernel: 2 N^3 flops), and D = X + Y over M
// floats (one kernel: M flops, 3 M * 4 bytes loaded and stored, whatever its schedule).
struct Graphs {
  static constexpr int64_t N = 64, M = 4096;
  Graph g;
  const UOp *a, *b, *x, *y, *matmul_root, *add_root;
  Graphs() {
    TensorBuilder tb(g);
    const UOp* ta = tb.input(Scalar::Float32, {N, N});
    const UOp* tb_ = tb.input(Scalar::Float32, {N, N});
    a = tb.buffer_of(ta);
    b = tb.buffer_of(tb_);
    matmul_root = tb.sink({tb.matmul(ta, tb_)});
    const UOp* tx = tb.input(Scalar::Float32, {M});
    const UOp* ty = tb.input(Scalar::Float32, {M});
    x = tb.buffer_of(tx);
    y = tb.buffer_of(ty);
    add_root = tb.sink({tb.alu(Op::ADD, {tx, ty})});
  }
};

TEST_F(Profile, TimingsAddUpNamesMatchCompileAndCountsMatchTheGraph) {
  Graphs gr;
  HostTensor a = HostTensor::random(Scalar::Float32, {Graphs::N * Graphs::N}, 1);
  HostTensor b = HostTensor::random(Scalar::Float32, {Graphs::N * Graphs::N}, 2);
  HostTensor x = HostTensor::random(Scalar::Float32, {Graphs::M}, 3);
  HostTensor y = HostTensor::random(Scalar::Float32, {Graphs::M}, 4);

  struct Case {
    const UOp* root;
    std::vector<client::Input> inputs;
    absl::flat_hash_map<const UOp*, HostTensor> interp_inputs;
    double flops, bytes;  // of the one kernel, as the graph says
  };
  const double n = Graphs::N, m = Graphs::M;
  std::vector<Case> cases = {
      {gr.matmul_root, {{gr.a, a}, {gr.b, b}}, {{gr.a, a}, {gr.b, b}}, 2 * n * n * n, -1},
      {gr.add_root, {{gr.x, x}, {gr.y, y}}, {{gr.x, x}, {gr.y, y}}, m, 3 * m * 4},
  };
  uint64_t timed = 0;
  for (Case& c : cases) {
    auto compiled = client->compile(c.root, {});
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    std::set<std::string> compile_names;
    for (const client::Kernel& k : compiled->kernels) compile_names.insert(k.name);

    const auto t0 = std::chrono::steady_clock::now();
    auto run = session->run(c.root, {}, c.inputs, /*keep_outputs=*/false, /*profile=*/true);
    const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(run.ok()) << run.status();
    auto want = interpret(gr.g, c.root, c.interp_inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(run->outputs.size(), 1u);
    // The kernel sums a dot product of 64 in another order than the interpreter does.
    CompareResult cmp = compare((*want)[0], run->outputs[0].tensor, Tolerance{1e-4, 1e-5});
    EXPECT_TRUE(cmp.ok) << cmp.message;

    ASSERT_EQ(run->profile.size(), 1u) << "one kernel, one profile row";
    const client::KernelProfile& p = run->profile[0];
    double sum_ms = 0;
    std::set<std::string> profile_names;
    for (const client::KernelProfile& k : run->profile) {
      sum_ms += k.total_ms;
      profile_names.insert(k.name);
      EXPECT_EQ(k.device, "CPU:0");
      timed += k.launches;
    }
    // A bound on a sum, measured around the call: the launches ran inside it.
    EXPECT_LE(sum_ms, wall_ms);
    EXPECT_EQ(profile_names, compile_names);
    EXPECT_EQ(p.digest, compiled->kernels[0].digest);
    EXPECT_EQ(p.launches, 1u);
    EXPECT_DOUBLE_EQ(p.per_launch_ms, p.total_ms / p.launches);
    EXPECT_EQ(p.flops, c.flops) << p.name << " (" << p.schedule << ")";
    if (c.bytes >= 0) {
      EXPECT_EQ(p.bytes, c.bytes) << p.name << " (" << p.schedule << ")";
    }
    EXPECT_GT(p.bytes, 0);
    EXPECT_FALSE(p.schedule.empty());
    if (p.total_ms > 0) {
      EXPECT_DOUBLE_EQ(p.gflops, p.flops / (p.total_ms * 1e6));
    }
  }
  auto stats = client->stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->launches_timed, timed);
  // Every timed launch went into the histogram, by its device's kind.
  EXPECT_EQ(kernel_seconds_count(), static_cast<double>(timed));
}

// Without `profile` the workers are not asked to time anything: no profile comes back,
// the launches ran (kernels_run grows) and none was timed (launches_timed and the
// histogram stay where they were).
TEST_F(Profile, ARunWithoutProfileTimesNothing) {
  Graphs gr;
  HostTensor x = HostTensor::random(Scalar::Float32, {Graphs::M}, 3);
  HostTensor y = HostTensor::random(Scalar::Float32, {Graphs::M}, 4);
  auto profiled = session->run(gr.add_root, {}, {{gr.x, x}, {gr.y, y}}, false, /*profile=*/true);
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  ASSERT_EQ(profiled->profile.size(), 1u);
  auto before = client->stats();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->launches_timed, 1u);
  for (int i = 0; i < 3; ++i) {
    auto plain = session->run(gr.add_root, {}, {{gr.x, x}, {gr.y, y}});
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_TRUE(plain->profile.empty());
  }
  auto after = client->stats();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->kernels_run, before->kernels_run + 3);
  EXPECT_EQ(after->launches_timed, before->launches_timed);
  EXPECT_EQ(kernel_seconds_count(), 1.0);
}

}  // namespace
}  // namespace uop
