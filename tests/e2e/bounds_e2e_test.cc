// The bounds proof end to end: a real uopd with one embedded CPU worker, two sessions on
// it. Session B sends kernel-level graphs whose gates hold, through wrapping arithmetic,
// for indices far outside B's buffers (idx + INT32_MIN, idx * INT32_MIN), to read and then
// to overwrite the worker's memory around them, each alone and as the CALL of a
// kernel-level graph, and a CALL binding a buffer smaller than its kernel's slot. Each is
// refused with INVALID_ARGUMENT (bounds.unproven, [plan.call]) before anything runs;
// session A's buffer on the same worker stays what it was, byte for byte; the worker is
// the same process, never restarted; both sessions are still served, with results equal
// to the reference interpreter.
#include <climits>
#include <cstring>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/uop.h"
#include "tests/e2e/hostile_graphs.h"

namespace uop {
namespace {

using testing::Gathered;
constexpr int64_t kN = testing::kGatherSize;

client::WorkerStatus the_worker(client::Client& c) {
  auto s = c.stats();
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok() || s->workers.size() != 1) {
    ADD_FAILURE() << "want one worker";
    return {};
  }
  return s->workers[0];
}

TEST(BoundsE2E, WrappedGatesCannotReachAnotherSessionsBuffer) {
  auto proc = client::EmbeddedServer::start(UOPD_BINARY, {"--cache-dir=", "--workers=1"});
  ASSERT_TRUE(proc.ok()) << proc.status();
  client::ClientOptions o;
  o.address = (*proc)->address();
  auto c = client::Client::connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto a = (*c)->create_session({"CPU:0"});
  auto b = (*c)->create_session({"CPU:0"});
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();

  // A's secret, on the worker B runs on.
  HostTensor secret = HostTensor::random(Scalar::Float32, {4096}, 7);
  auto a_buf = a->upload_tensor(secret);
  ASSERT_TRUE(a_buf.ok()) << a_buf.status();
  auto before = a->download(*a_buf);
  ASSERT_TRUE(before.ok()) << before.status();
  const client::WorkerStatus worker = the_worker(**c);
  ASSERT_EQ(worker.state, "up");

  // The gates hold for these indices (idx + INT32_MIN wraps to 0..3; idx * INT32_MIN is 0
  // for even idx): data[INT32_MIN], data[2 * 10^9], ... are gigabytes away from B's data.
  HostTensor near_min = testing::gather_indices({INT32_MIN, INT32_MIN + 1, INT32_MIN + 2, INT32_MIN + 3});
  HostTensor even = testing::gather_indices({2000000000, -2000000000, 1 << 30, 65536, 2});
  for (bool write : {false, true}) {
    for (int which = 0; which < 2; ++which) {
      Gathered k(write, which ? testing::wrapping_mul_gate : testing::wrapping_add_gate);
      std::vector<client::Input> in = {{"out", HostTensor::zeros(Scalar::Float32, {kN})},
                                       {"data", HostTensor::random(Scalar::Float32, {kN}, 3)},
                                       {"idx", which ? even : near_min}};
      // Sent alone, and as the one CALL of a kernel-level graph.
      testing::Called called(k.g, k.root, k.names);
      for (auto [root, names] : {std::pair{k.root, &k.names}, std::pair{called.root, &called.names}}) {
        auto r = b->run(root, *names, in);
        ASSERT_FALSE(r.ok()) << (write ? "the overwrite" : "the read") << " ran" << (root == called.root ? " as a CALL" : "");
        EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
        EXPECT_NE(r.status().message().find("bounds.unproven"), std::string::npos) << r.status();
      }
    }
  }
  // A CALL binding a 4-value buffer where the kernel's slot holds 16: the kernel's proof
  // is over its own slots, so the binding itself is what is refused.
  {
    Gathered honest(false, testing::sound_gate);
    testing::Called small(honest.g, honest.root, honest.names, {kN, 4, kN});
    auto r = b->run(small.root, small.names,
                    {{"out", HostTensor::zeros(Scalar::Float32, {kN})},
                     {"data", HostTensor::random(Scalar::Float32, {4}, 3)},
                     {"idx", testing::gather_indices({15, 14, 13})}});
    ASSERT_FALSE(r.ok()) << "a kernel read 16 values of a 4-value buffer";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("[plan.call]"), std::string::npos) << r.status();
  }

  // A's buffer is untouched, on the same worker process.
  auto after = a->download(*a_buf);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*after == *before) << "session A's buffer changed";
  const client::WorkerStatus now = the_worker(**c);
  EXPECT_EQ(now.state, "up");
  EXPECT_EQ(now.pid, worker.pid);
  EXPECT_EQ(now.restarts, worker.restarts);

  // Both sessions are still served. B's honest gather (indices outside the buffer are
  // gated off and read 0) matches the interpreter.
  Gathered honest(false, testing::sound_gate);
  HostTensor data = HostTensor::random(Scalar::Float32, {kN}, 5);
  HostTensor idx = testing::gather_indices({3, -1, 15, 16, INT32_MIN, INT32_MAX, 0, 7});
  auto got = b->run(honest.root, honest.names, {{"out", HostTensor::zeros(Scalar::Float32, {kN})}, {"data", data}, {"idx", idx}});
  ASSERT_TRUE(got.ok()) << got.status();
  HostTensor want_out = HostTensor::zeros(Scalar::Float32, {kN}), want_data = data, want_idx = idx;
  std::vector<HostTensor*> params{&want_out, &want_data, &want_idx};
  ASSERT_TRUE(interpret_kernel(honest.root, params, {}).ok());
  ASSERT_EQ(got->outputs.size(), 3u);
  CompareResult cmp = compare(want_out, got->outputs[0].tensor);
  EXPECT_TRUE(cmp.ok) << cmp.message;
  // The same kernel as a CALL computes the same.
  testing::Called called(honest.g, honest.root, honest.names);
  auto via_call = b->run(called.root, called.names,
                         {{"out", HostTensor::zeros(Scalar::Float32, {kN})}, {"data", data}, {"idx", idx}});
  ASSERT_TRUE(via_call.ok()) << via_call.status();
  ASSERT_EQ(via_call->outputs.size(), 3u);
  cmp = compare(want_out, via_call->outputs[0].tensor);
  EXPECT_TRUE(cmp.ok) << cmp.message;
  EXPECT_TRUE(a->close().ok());
  EXPECT_TRUE(b->close().ok());
}

}  // namespace
}  // namespace uop
