// The bounds proof end to end: a real uopd with one embedded CPU worker, two sessions on
// it. Session B sends kernel-level graphs whose gates hold, through wrapping arithmetic,
// for indices far outside B's buffers (idx + INT32_MIN, idx * INT32_MIN), to read and then
// to overwrite the worker's memory around them. Each is refused with INVALID_ARGUMENT
// naming bounds.unproven before anything runs; session A's buffer on the same worker stays
// what it was, byte for byte; the worker is the same process, never restarted; both
// sessions are still served, with results equal to the reference interpreter.
#include <climits>
#include <cstring>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/uop.h"

namespace uop {
namespace {

constexpr int64_t kN = 16;

// out[r] = data[idx[r]] (a read) or data[idx[r]] = out[r] (a write), for r < 16, under
// gate(idx[r]).
struct Gathered {
  Graph g;
  const UOp *out, *data, *idx, *root;
  Names names;

  template <typename Gate>
  Gathered(bool write, Gate gate) {
    DType f = dtypes::float32, i = dtypes::int32;
    out = g.make(Op::PARAM, f.ptr_to(AddrSpace::Global, kN), {}, ParamArg{0, kN});
    data = g.make(Op::PARAM, f.ptr_to(AddrSpace::Global, kN), {}, ParamArg{1, kN});
    idx = g.make(Op::PARAM, i.ptr_to(AddrSpace::Global, kN), {}, ParamArg{2, kN});
    const UOp* r = g.make(Op::RANGE, dtypes::index, {g.idx(kN)}, RangeArg{0, AxisType::Loop, false});
    const UOp* v = g.make(Op::LOAD, i, {idx, g.make(Op::INDEX, i, {idx, r})});
    const UOp* wild = g.make(Op::INDEX, f, {data, g.make(Op::CAST, dtypes::index, {v}), gate(g, v)});
    const UOp* mine = g.make(Op::INDEX, f, {out, r});
    const UOp* st = write ? g.make(Op::STORE, dtypes::void_, {wild, g.make(Op::LOAD, f, {out, mine}), r})
                          : g.make(Op::STORE, dtypes::void_, {mine, g.make(Op::LOAD, f, {data, wild, g.cnst(f, 0.0)}), r});
    root = g.make(Op::SINK, dtypes::void_, {st}, KernelInfoArg{true, write ? "overwrite" : "read"});
    names = {{"out", out}, {"data", data}, {"idx", idx}};
  }
};

// lo < x < hi, in x's dtype.
const UOp* between(Graph& g, int64_t lo, const UOp* x, int64_t hi) {
  return g.alu(Op::AND, {g.alu(Op::CMPLT, {g.cnst_int(x->dtype(), lo), x}), g.alu(Op::CMPLT, {x, g.cnst_int(x->dtype(), hi)})});
}

HostTensor indices(std::initializer_list<int64_t> v) {
  std::vector<ConstValue> c;
  for (int64_t x : v) c.push_back(ConstValue::Int(x));
  while (c.size() < kN) c.push_back(ConstValue::Int(0));
  return HostTensor::of(Scalar::Int32, {kN}, c);
}

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
  auto add_gate = [](Graph& g, const UOp* v) {
    return between(g, -1, g.alu(Op::ADD, {v, g.cnst_int(dtypes::int32, INT32_MIN)}), 4);
  };
  auto mul_gate = [](Graph& g, const UOp* v) {
    return between(g, -1, g.alu(Op::MUL, {v, g.cnst_int(dtypes::int32, INT32_MIN)}), 4);
  };
  HostTensor near_min = indices({INT32_MIN, INT32_MIN + 1, INT32_MIN + 2, INT32_MIN + 3});
  HostTensor even = indices({2000000000, -2000000000, 1 << 30, 65536, 2});
  for (bool write : {false, true}) {
    for (int which = 0; which < 2; ++which) {
      Gathered k(write, which ? +mul_gate : +add_gate);
      std::vector<client::Input> in = {{"out", HostTensor::zeros(Scalar::Float32, {kN})},
                                       {"data", HostTensor::random(Scalar::Float32, {kN}, 3)},
                                       {"idx", which ? even : near_min}};
      auto r = b->run(k.root, k.names, in);
      ASSERT_FALSE(r.ok()) << (write ? "the overwrite" : "the read") << " ran";
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
      EXPECT_NE(r.status().message().find("bounds.unproven"), std::string::npos) << r.status();
    }
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
  Gathered honest(false, [](Graph& g, const UOp* v) { return between(g, -1, v, kN); });
  HostTensor data = HostTensor::random(Scalar::Float32, {kN}, 5);
  HostTensor idx = indices({3, -1, 15, 16, INT32_MIN, INT32_MAX, 0, 7});
  auto got = b->run(honest.root, honest.names, {{"out", HostTensor::zeros(Scalar::Float32, {kN})}, {"data", data}, {"idx", idx}});
  ASSERT_TRUE(got.ok()) << got.status();
  HostTensor want_out = HostTensor::zeros(Scalar::Float32, {kN}), want_data = data, want_idx = idx;
  std::vector<HostTensor*> params{&want_out, &want_data, &want_idx};
  ASSERT_TRUE(interpret_kernel(honest.root, params, {}).ok());
  ASSERT_EQ(got->outputs.size(), 3u);
  CompareResult cmp = compare(want_out, got->outputs[0].tensor);
  EXPECT_TRUE(cmp.ok) << cmp.message;
  EXPECT_TRUE(a->close().ok());
  EXPECT_TRUE(b->close().ok());
}

}  // namespace
}  // namespace uop
