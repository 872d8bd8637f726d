// The bounds proof against kernels that try to make wrapping arithmetic hide an
// out-of-bounds index (each must be refused with bounds.unproven), and against the gated
// and variable-length accesses real lowerings make (each must still be accepted). Kernels
// go through the same pipeline a client's kernel-level graph takes: plan_graph (verify,
// normalize), then the CPU backend's schedule (optimize, expand, lower_reduce, symbolic, bounds, linearize).
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/passes/bounds.h"
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/backends/cuda/cuda_backend.h"
#include "compiler/pipeline.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

// The builder's kernels, and what the probes below make of them.
struct Kernel : testing::KernelBuilder {
  // out[r] = data[index(idx[r])] under gate(idx[r]): the shape of the probes (idx is
  // what a client uploads; nothing about its values is known).
  template <typename Index, typename Gate>
  const UOp* gather(Index index, Gate gate, int64_t n = 16) {
    const UOp* out = param(0, dtypes::float32, n);
    const UOp* data = param(1, dtypes::float32, n);
    const UOp* idx = param(2, dtypes::int32, n);
    const UOp* r = range(n);
    const UOp* v = load(idx, r);
    return sink({store(out, r, load(data, index(v), gate(v)), {r})});
  }

  // out[r] = data[at(r)] for r < end.
  template <typename At>
  const UOp* read_each(const UOp* end, int64_t out_size, int64_t data_size, At at) {
    const UOp* out = param(0, dtypes::float32, out_size);
    const UOp* data = param(1, dtypes::float32, data_size);
    const UOp* r = range(end);
    return sink({store(out, r, load(data, at(r)), {r})});
  }

  // What the pipeline does with a client's kernel-level graph, through bounds.
  absl::Status lower(const UOp* k) {
    auto plan = plan_graph(g, k);
    if (!plan.ok()) return plan.status();
    for (const KernelPlan& kp : plan->kernels) {
      auto linear = host_cpu_backend()->lower(g, kp.kernel, {}, kp.name);
      if (!linear.ok()) return linear.status();
    }
    return absl::OkStatus();
  }
};

void expect_refused(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("bounds.unproven"), std::string::npos) << s;
}

// --- refused: the gate holds, or the loop runs, for an index far outside the buffer -----

// idx + INT32_MIN wraps to 0..3 for idx = INT32_MIN..INT32_MIN+3: the gate holds there, and
// data[INT32_MIN] is 8 GiB below the buffer.
TEST(BoundsProbe, GateOnAddOfInt32MinIsRefused) {
  Kernel k;
  expect_refused(k.lower(k.gather([&](const UOp* v) { return k.to_index(v); },
                                  [&](const UOp* v) { return k.between(-1, k.alu(Op::ADD, v, k.i32(INT32_MIN)), 4); })));
}

// idx * INT32_MIN is 0 for every even idx (modulo 2^32): the gate holds for idx = 2, 4, ...
TEST(BoundsProbe, GateOnMulByInt32MinIsRefused) {
  Kernel k;
  expect_refused(k.lower(k.gather([&](const UOp* v) { return k.to_index(v); },
                                  [&](const UOp* v) { return k.between(-1, k.alu(Op::MUL, v, k.i32(INT32_MIN)), 4); })));
}

// -idx < INT32_MIN + 1 holds only for idx = INT32_MIN, whose negation is itself.
TEST(BoundsProbe, GateOnNegationOfInt32MinIsRefused) {
  Kernel k;
  expect_refused(k.lower(k.gather([&](const UOp* v) { return k.to_index(v); },
                                  [&](const UOp* v) {
                                    return k.lt(k.g.make(Op::NEG, dtypes::int32, {v}), k.i32(INT32_MIN + 1));
                                  })));
}

// INT32_MIN - idx is 0..3 for idx = INT32_MIN - 3 .. INT32_MIN modulo 2^32, that is for
// INT32_MAX - 2 .. INT32_MAX and INT32_MIN: idx + 2^31 is then up to 2^32 - 1.
TEST(BoundsProbe, GateOnSubtractionFromInt32MinIsRefused) {
  Kernel k;
  expect_refused(k.lower(k.gather([&](const UOp* v) { return k.alu(Op::ADD, k.to_index(v), k.ix(int64_t{1} << 31)); },
                                  [&](const UOp* v) { return k.between(-1, k.alu(Op::SUB, k.i32(INT32_MIN), v), 4); })));
}

// (int8)idx in 0..3 holds for idx = 256, 257, ...: a cast that may wrap keeps nothing.
TEST(BoundsProbe, GateOnNarrowingCastIsRefused) {
  Kernel k;
  expect_refused(k.lower(k.gather([&](const UOp* v) { return k.to_index(v); },
                                  [&](const UOp* v) { return k.between(-1, k.g.make(Op::CAST, dtypes::int8, {v}), 4); })));
}

// idx << 31 is 0 for every even idx, as the multiplication above.
TEST(BoundsProbe, GateOnShiftLeftIsRefused) {
  Kernel k;
  expect_refused(k.lower(k.gather([&](const UOp* v) { return k.to_index(v); },
                                  [&](const UOp* v) { return k.between(-1, k.alu(Op::SHL, v, k.i32(31)), 4); })));
}

// r * 2^62 over r < 4: the corners r = 0 and r = 3 give 0 and -2^62 (wrapped), yet r = 1
// reads at 2^62. An affine bound from the corners holds only where nothing wraps.
TEST(BoundsProbe, AffineIndexThatWrapsBetweenItsCornersIsRefused) {
  Kernel k;
  expect_refused(k.lower(k.read_each(k.ix(4), 4, 16, [&](const UOp* r) { return k.alu(Op::MUL, r, k.ix(int64_t{1} << 62)); })));
}

// The same with a variable trip count, whose loop end is a corner.
TEST(BoundsProbe, AffineIndexThatWrapsUnderAVariableTripCountIsRefused) {
  Kernel k;
  const UOp* n = k.var("n", 1, 4);
  expect_refused(k.lower(k.read_each(n, 4, 16, [&](const UOp* r) {
    const UOp* flip = k.alu(Op::SUB, k.alu(Op::SUB, n, k.ix(1)), r);  // n - 1 - r, in bounds
    return k.alu(Op::ADD, flip, k.alu(Op::MUL, r, k.ix(int64_t{1} << 62)));
  })));
}

// A sum over a loop that never runs is 0, yet the read after it runs: its index depends on
// that loop only through the loop's END, which does not put the read inside the loop.
TEST(BoundsProbe, ReadAfterAnEmptyLoopIsChecked) {
  Kernel k;
  const UOp* out = k.param(0, dtypes::float32, 16);
  const UOp* data = k.param(1, dtypes::float32, 16);
  const UOp* idx = k.param(2, dtypes::int32, 16);
  const UOp* r = k.range(16);
  const UOp* e = k.range(int64_t{0});
  const UOp* zero = k.g.make(Op::REDUCE, dtypes::index, {e, e}, ReduceOpArg{ReduceOp::Add});
  const UOp* at = k.alu(Op::ADD, k.to_index(k.load(idx, r)), zero);
  expect_refused(k.lower(k.sink({k.store(out, r, k.load(data, at), {r})})));
}

// A DEFINE_VAR whose bounds leave its dtype would be truncated by one backend and not by
// another: refused before anything is proven about it.
TEST(BoundsProbe, VariableBoundsOutsideItsDtypeAreRefused) {
  Kernel k;
  const UOp* n = k.g.make(Op::DEFINE_VAR, dtypes::int8, {}, DefineVarArg{"n", 0, 1000});
  const UOp* out = k.param(0, dtypes::float32, 128);
  const UOp* data = k.param(1, dtypes::float32, 128);
  const UOp* r = k.range(1);
  const UOp* at = k.to_index(n);
  absl::Status s = k.lower(k.sink({k.store(out, r, k.load(data, at, k.lt(k.g.cnst_int(dtypes::int8, -1), n)), {r})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("define_var.range"), std::string::npos) << s;
}

// --- accepted: what gates and loop bounds really guarantee --------------------------------

// The classic gather: the loaded index itself is gated to the buffer.
TEST(BoundsAccepts, GatherGatedToTheBuffer) {
  Kernel k;
  EXPECT_TRUE(k.lower(k.gather([&](const UOp* v) { return k.to_index(v); },
                               [&](const UOp* v) { return k.between(-1, v, 16); })).ok());
}

// Modulo 2^32, idx + INT32_MIN in 0..3 means idx in INT32_MIN..INT32_MIN+3 exactly, so
// idx + 2^31 (in index arithmetic, which does not wrap here) is in 0..3.
TEST(BoundsAccepts, GateReasonedModuloTheWidth) {
  Kernel k;
  auto plus = [&](const UOp* v) { return k.alu(Op::ADD, k.to_index(v), k.ix(int64_t{1} << 31)); };
  EXPECT_TRUE(k.lower(k.gather(plus, [&](const UOp* v) { return k.between(-1, k.alu(Op::ADD, v, k.i32(INT32_MIN)), 4); })).ok());
  // And one further is outside a buffer of 4.
  Kernel k2;
  auto plus2 = [&](const UOp* v) { return k2.alu(Op::ADD, k2.to_index(v), k2.ix((int64_t{1} << 31) + 13)); };
  expect_refused(k2.lower(k2.gather(plus2, [&](const UOp* v) { return k2.between(-1, k2.alu(Op::ADD, v, k2.i32(INT32_MIN)), 4); })));
}

// A gate on a scaled index: 3*idx < 48 bounds idx by 15 because 3*idx cannot wrap once
// idx is known to be small (the other half of the gate).
TEST(BoundsAccepts, GateOnAProductThatCannotWrap) {
  Kernel k;
  EXPECT_TRUE(k.lower(k.gather([&](const UOp* v) { return k.to_index(v); }, [&](const UOp* v) {
                 return k.all(k.between(-1, v, 1000), k.lt(k.alu(Op::MUL, v, k.i32(3)), k.i32(48)));
               })).ok());
}

// What bidirectional recurrent layers lower to: a direction's half of a concat, gated on
// r2 < 1 and 0 < r0 + 2*r2, reads at 48*r0 + 96*r2 + 24*r1 - 48. The gate bounds r0 only
// once r2 is known, which takes a step forwards (2*r2 = 0) and one back (r0 = 1).
TEST(BoundsAccepts, GateThatNarrowsThroughASum) {
  Kernel k;
  const UOp* out = k.param(0, dtypes::float32, 48);
  const UOp* data = k.param(1, dtypes::float32, 240);
  const UOp *r0 = k.range(2), *r1 = k.range(2), *r2 = k.range(5);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::ADD, k.alu(Op::ADD, k.alu(Op::MUL, r0, k.ix(48)), k.alu(Op::MUL, r2, k.ix(96))),
                                       k.alu(Op::MUL, r1, k.ix(24))), k.ix(-48));
  const UOp* gate = k.all(k.lt(r2, k.ix(1)), k.lt(k.ix(0), k.alu(Op::ADD, r0, k.alu(Op::MUL, r2, k.ix(2)))));
  const UOp* o = k.alu(Op::ADD, k.alu(Op::ADD, k.alu(Op::MUL, r0, k.ix(24)), k.alu(Op::MUL, r1, k.ix(12))), k.alu(Op::MUL, r2, k.ix(2)));
  const UOp* st = k.store(out, k.alu(Op::MOD, o, k.ix(48)), k.load(data, at, gate), {r0, r1, r2});
  EXPECT_TRUE(k.lower(k.sink({st})).ok()) << k.lower(k.sink({st}));
}

// Flipping a variable-length row: n - 1 - r is >= 0 because r < n, and n >= 1 wherever
// the loop runs (so a variable that may be 0 is fine).
TEST(BoundsAccepts, FlipWithAVariableTripCount) {
  for (int64_t lo : {0, 1}) {
    Kernel k;
    const UOp* n = k.var("n", lo, 16);
    auto flip = [&](const UOp* r) { return k.alu(Op::SUB, k.alu(Op::SUB, n, k.ix(1)), r); };
    EXPECT_TRUE(k.lower(k.read_each(n, 16, 16, flip)).ok()) << "n >= " << lo;
  }
}

// A triangular nest, r1 < r0 + 1 < n: r0 - r1 and r1 both stay in 0..n-1.
TEST(BoundsAccepts, TriangularLoops) {
  Kernel k;
  const UOp* n = k.var("n", 1, 8);
  const UOp* out = k.param(0, dtypes::float32, 64);
  const UOp* data = k.param(1, dtypes::float32, 8);
  const UOp* r0 = k.range(n);
  const UOp* r1 = k.range(k.alu(Op::ADD, r0, k.ix(1)));
  const UOp* v = k.alu(Op::ADD, k.load(data, k.alu(Op::SUB, r0, r1)), k.load(data, r1));
  absl::Status s = k.lower(k.sink({k.store(out, k.alu(Op::ADD, k.alu(Op::MUL, r0, k.ix(8)), r1), v, {r0, r1})}));
  EXPECT_TRUE(s.ok()) << s;
}

// A loop that never runs may index anything: nothing is read. (An index that does not
// read the loop's index is no longer inside it once linearized, and is checked: below.)
TEST(BoundsAccepts, AccessInsideAnEmptyLoop) {
  Kernel k;
  const UOp* out = k.param(0, dtypes::float32, 16);
  const UOp* data = k.param(1, dtypes::float32, 16);
  const UOp* idx = k.param(2, dtypes::int32, 16);
  const UOp* e = k.range(int64_t{0});
  const UOp* at = k.alu(Op::ADD, k.to_index(k.load(idx, e)), k.alu(Op::MUL, e, k.ix(1000)));
  absl::Status s = k.lower(k.sink({k.store(out, e, k.load(data, at), {e})}));
  EXPECT_TRUE(s.ok()) << s;
}

// e + 1000 over a loop of no iterations folds to 1000 (e can only be 0), and a read at a
// constant index is linearized outside the loop, where it runs: refused.
TEST(BoundsProbe, ReadHoistedOutOfAnEmptyLoopIsChecked) {
  Kernel k;
  expect_refused(k.lower(k.read_each(k.ix(0), 16, 16, [&](const UOp* e) { return k.alu(Op::ADD, e, k.ix(1000)); })));
}

// PAD, SHRINK, FLIP and RESHAPE as rangeify lowers them, with the gates of the padding,
// checked against the interpreter by the lowering tests; here: they are accepted.
TEST(BoundsAccepts, MovementOpsThroughTheTensorPipeline) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {3, 4, 5});
  const UOp* y = tb.pad(tb.flip(x, {true, false, true}), {2, 0, 1}, {1, 3, 0});  // 6, 7, 6
  y = tb.reshape(tb.shrink(y, {1, 1, 0}, {6, 7, 6}), {5, 36});
  y = tb.flip(tb.pad(y, {0, 4}, {3, 0}), {false, true});
  auto plan = plan_graph(g, tb.sink({y}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const KernelPlan& kp : plan->kernels) EXPECT_TRUE(host_cpu_backend()->lower(g, kp.kernel, {}, kp.name).ok()) << kp.name;
}

// --- the proof checks the IR that is rendered -----------------------------------------

// On the GPU, gpu_dims turns loops into launch indices after the loops were proven; the
// proof runs again on what gpu_dims made (the IR that is linearized and rendered).
TEST(BoundsPipeline, CudaLoweringProvesTheIrAfterGpuDims) {
  Kernel k;
  const UOp* n = k.var("n", 1, 1000);
  auto flip = [&](const UOp* r) { return k.alu(Op::SUB, k.alu(Op::SUB, n, k.ix(1)), r); };
  auto plan = plan_graph(k.g, k.read_each(n, 1000, 1000, flip));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> stages;
  PipelineOptions o;
  o.trace = [&](std::string_view stage, std::string_view, const UOp*) { stages.emplace_back(stage); };
  auto linear = CudaBackend(CudaTarget{}).lower(k.g, plan->kernels[0].kernel, o, "k");
  ASSERT_TRUE(linear.ok()) << linear.status();
  auto pos = [&](const char* s) { return std::find(stages.begin(), stages.end(), s) - stages.begin(); };
  EXPECT_LT(pos("gpu_dims"), pos("bounds"));
  EXPECT_LT(pos("bounds"), pos("linearize"));
  EXPECT_LT(pos("linearize"), static_cast<ptrdiff_t>(stages.size()));
}

// --- masked vector accesses: lane k is element idx + k under lane k of the gate ------------

// An 8-lane read of data[8 r - 1 + k] for r < 2, lane k gated on 8 r + k >= 1 (a row
// shifted into its padding): no lane that runs is outside 16 elements, though lane 0 of
// the first vector would be. Without the gate, or with a gate that lets lane 0 run, it is
// refused.
TEST(BoundsAccepts, AMaskedVectorReadIsProvenLaneByLane) {
  auto index = [](Kernel& k, bool gated, int64_t first_lane_from) {
    const UOp* data = k.param(1, dtypes::float32, 16);
    const UOp* r = k.range(2);
    const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(8)), k.ix(-1));
    std::vector<const UOp*> lanes;
    for (int64_t l = 0; l < 8; ++l)
      lanes.push_back(k.lt(k.ix(l == 0 ? first_lane_from : 0), k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(8)), k.ix(l))));
    DType vt = dtypes::float32.vec(8);
    if (!gated) return k.g.make(Op::INDEX, vt, {data, at});
    return k.g.make(Op::INDEX, vt, {data, at, k.g.make(Op::VECTORIZE, dtypes::bool_.vec(8), lanes)});
  };
  {
    Kernel k;
    EXPECT_TRUE(check_index(k.g, index(k, true, 0)).ok()) << check_index(k.g, index(k, true, 0));
  }
  {
    Kernel k;
    expect_refused(check_index(k.g, index(k, false, 0)));
  }
  {
    Kernel k;
    expect_refused(check_index(k.g, index(k, true, -1)));  // lane 0 runs at r = 0: data[-1]
  }
}

// A padded 3x3 window's lane as expand makes it (an AVX-512 conv tile's last lane): the
// row gate bounds the flat index from below (1 <= r3 + 2 r0), the column gate from above
// (8 r1 + r4 < 50), and neither alone proves it; through both, it lies in 64 x 56 x 56.
TEST(BoundsAccepts, APaddedWindowIsBoundedThroughItsRowAndColumnGates) {
  Kernel k;
  const UOp* data = k.param(1, dtypes::float32, 64 * 56 * 56);
  const UOp *r0 = k.range(28), *r1 = k.range(7), *r3 = k.range(3), *r4 = k.range(3), *r5 = k.range(64);
  auto mul = [&](const UOp* x, int64_t c) { return k.alu(Op::MUL, x, k.ix(c)); };
  auto add = [&](const UOp* x, const UOp* y) { return k.alu(Op::ADD, x, y); };
  const UOp* at = add(add(add(add(add(mul(r3, 56), mul(r0, 112)), r4), mul(r1, 8)), mul(r5, 3136)), k.ix(-50));
  const UOp* row = k.g.make(Op::CMPNE, dtypes::bool_, {k.lt(add(r3, mul(r0, 2)), k.ix(1)), k.g.cnst_bool(true)});
  const UOp* gate = k.all(k.lt(add(mul(r1, 8), r4), k.ix(50)), row);
  EXPECT_TRUE(check_index(k.g, k.g.make(Op::INDEX, dtypes::float32, {data, at, gate})).ok());
  // One element further is outside it.
  const UOp* past = k.g.make(Op::INDEX, dtypes::float32, {data, add(at, k.ix(1)), gate});
  expect_refused(check_index(k.g, past));
}

}  // namespace
}  // namespace uop
