// expand (compiler/passes/expand.h) on kernels built by hand with an Upcast range: no
// UNROLL, CONTRACT or Upcast RANGE is left; an access contiguous in the upcast range
// becomes one vector access, a strided one an access per lane; a REDUCE over an upcast
// range keeps a vector accumulator; a read clamped by a split's masked tail is one masked
// vector load per contiguous run of lanes; and each expanded kernel, taken on to LINEAR and run
// by the CPU backend, computes what the interpreter computes on the kernel before expand.
// Kernels without Upcast ranges come back as they are; an Upcast range expand cannot
// unroll is refused with expand.upcast. affine_coeff, which decides contiguity, on its own.
#include "compiler/passes/expand.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/passes/linearize.h"
#include "compiler/passes/lower_reduce.h"
#include "tests/unit/compiler/passes/kernel_builder.h"
#include "tests/unit/compiler/passes/run_on_cpu.h"

namespace uop {
namespace {

using testing::KernelBuilder;

bool is_upcast_range(const UOp* u) { return u->op() == Op::RANGE && u->arg_as<RangeArg>().type == AxisType::Upcast; }

// What expand must leave behind: no lanes still to unroll.
void expect_expanded(const UOp* k) {
  EXPECT_EQ(testing::count_of(k, [](const UOp* u) { return u->op() == Op::UNROLL || u->op() == Op::CONTRACT; }), 0);
  EXPECT_EQ(testing::count_of(k, is_upcast_range), 0);
}

// LOADs of PARAM `slot` and how many lanes each reads.
std::vector<uint32_t> load_widths(const UOp* k, int64_t slot) {
  std::vector<uint32_t> w;
  for (const UOp* u : toposort(k)) {
    if (u->op() != Op::LOAD) continue;
    const UOp* buf = u->src(0);
    if (buf->op() == Op::PARAM && buf->arg_as<ParamArg>().slot == slot) w.push_back(u->dtype().count);
  }
  return w;
}

// The kernel before expand, by the interpreter, and after it (lowered, linearized,
// compiled), on the same inputs.
void expect_same_values(Graph& g, const UOp* before, const UOp* after, const std::vector<std::pair<Scalar, int64_t>>& slots) {
  auto lowered = lower_reduce(g, after);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  auto linear = linearize(g, *lowered);
  ASSERT_TRUE(linear.ok()) << linear.status();
  testing::expect_cpu_matches_interpreter(before, *linear, slots);
}

TEST(AffineCoeff, OfSumsProductsAndWhatIsNotAffine) {
  KernelBuilder k;
  const UOp* r = k.range(8);
  const UOp* s = k.range(8);
  const UOp* v = k.var("n", 1, 100);
  EXPECT_EQ(affine_coeff(r, r), 1);
  EXPECT_EQ(affine_coeff(s, r), 0) << "another range does not move with r";
  EXPECT_EQ(affine_coeff(k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(4)), s), r), 4);
  EXPECT_EQ(affine_coeff(k.alu(Op::MUL, k.ix(3), k.alu(Op::SUB, v, r)), r), -3);
  EXPECT_EQ(affine_coeff(k.alu(Op::ADD, r, r), r), 2);
  EXPECT_EQ(affine_coeff(k.alu(Op::MUL, r, v), r), std::nullopt) << "a coefficient that is no constant";
  EXPECT_EQ(affine_coeff(k.alu(Op::MUL, r, r), r), std::nullopt);
  EXPECT_EQ(affine_coeff(k.alu(Op::IDIV, r, k.ix(2)), r), std::nullopt);
  EXPECT_EQ(affine_coeff(k.alu(Op::MOD, r, k.ix(2)), r), std::nullopt);
  EXPECT_EQ(affine_coeff(k.alu(Op::MUL, r, k.ix(INT64_MAX)), r), INT64_MAX);
  EXPECT_EQ(affine_coeff(k.alu(Op::MUL, k.alu(Op::MUL, r, k.ix(INT64_MAX)), k.ix(2)), r), std::nullopt)
      << "a coefficient that overflows is not one";
}

// out[4 i + u] = in[4 i + u] * 2 with u upcast by 4: one 4-lane load and one 4-lane
// store per i.
TEST(Expand, AContiguousAccessBecomesOneVectorAccess) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 32);
  const UOp* in = k.param(1, dtypes::float32, 32);
  const UOp* i = k.range(8);
  const UOp* u = k.range(4, AxisType::Upcast);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(4)), u);
  const UOp* before = k.sink({k.store(out, at, k.alu(Op::MUL, k.load(in, at), k.f32(2)), {i, u})});
  auto after = expand_upcasts(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  expect_expanded(*after);
  EXPECT_EQ(load_widths(*after, 1), std::vector<uint32_t>{4});
  int vector_stores = testing::count_of(*after, [](const UOp* x) { return x->op() == Op::STORE && x->src(1)->dtype().count == 4; });
  EXPECT_EQ(vector_stores, 1);
  expect_same_values(k.g, before, *after, {{Scalar::Float32, 32}, {Scalar::Float32, 32}});
}

// out[4 i + u] = in[8 u + i]: the load moves by 8 per lane, a gather of 4 scalar loads.
TEST(Expand, AStridedAccessIsOneAccessPerLane) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 32);
  const UOp* in = k.param(1, dtypes::int32, 32);
  const UOp* i = k.range(8);
  const UOp* u = k.range(4, AxisType::Upcast);
  const UOp* dst = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(4)), u);
  const UOp* src = k.alu(Op::ADD, k.alu(Op::MUL, u, k.ix(8)), i);
  const UOp* before = k.sink({k.store(out, dst, k.alu(Op::ADD, k.load(in, src), k.i32(5)), {i, u})});
  auto after = expand_upcasts(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  expect_expanded(*after);
  EXPECT_EQ(load_widths(*after, 1), (std::vector<uint32_t>{1, 1, 1, 1}));
  expect_same_values(k.g, before, *after, {{Scalar::Int32, 32}, {Scalar::Int32, 32}});
}

// out[i] = sum over r of in[4 i + r] with r an upcast Reduce: the reduction's lanes are
// folded after its loop; the sums agree with the interpreter's.
TEST(Expand, AReduceOverAnUpcastRangeFoldsItsLanes) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 6);
  const UOp* in = k.param(1, dtypes::float32, 24);
  const UOp* i = k.range(6);
  const UOp* r = k.range(4, AxisType::Upcast);
  const UOp* sum = k.reduce(ReduceOp::Add, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(4)), r)), {r});
  const UOp* before = k.sink({k.store(out, i, sum, {i})});
  auto after = expand_upcasts(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  expect_expanded(*after);
  EXPECT_EQ(load_widths(*after, 1), std::vector<uint32_t>{4});
  expect_same_values(k.g, before, *after, {{Scalar::Float32, 6}, {Scalar::Float32, 24}});
}

// Nothing to expand: the kernel itself comes back.
TEST(Expand, AKernelWithoutUpcastRangesIsLeftAlone) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 4);
  const UOp* r = k.range(4);
  const UOp* before = k.sink({k.store(out, r, k.f32(3), {r})});
  auto after = expand_upcasts(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, before);
}

// Lanes must be known: an Upcast range of a variable trip count, or of more than 1024, or
// two Upcast ranges of one axis id, are refused naming the rule.
TEST(Expand, UpcastRangesItCannotUnrollAreRefused) {
  auto refused = [](KernelBuilder& k, const UOp* end, bool twice) {
    const UOp* out = k.param(0, dtypes::float32, 4096);
    const UOp* u = k.g.make(Op::RANGE, dtypes::index, {end}, RangeArg{7, AxisType::Upcast, false});
    std::vector<const UOp*> stores{k.store(out, u, k.f32(1), {u})};
    if (twice) {
      const UOp* w = k.g.make(Op::RANGE, dtypes::index, {k.ix(3)}, RangeArg{7, AxisType::Upcast, false});
      stores.push_back(k.store(out, k.alu(Op::ADD, w, k.ix(8)), k.f32(2), {w}));
    }
    const UOp* kernel = k.g.make(Op::SINK, dtypes::void_, stores, KernelInfoArg{true, "probe"});
    return expand_upcasts(k.g, kernel).status();
  };
  {
    KernelBuilder k;
    absl::Status s = refused(k, k.var("n", 1, 4), false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("[expand.upcast]"), std::string::npos) << s;
  }
  {
    KernelBuilder k;
    absl::Status s = refused(k, k.ix(2048), false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("[expand.upcast]"), std::string::npos) << s;
  }
  {
    KernelBuilder k;
    absl::Status s = refused(k, k.ix(4), true);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("share an axis id"), std::string::npos) << s;
  }
}

// Loads of PARAM `slot` whose INDEX carries a gate of `lanes` lanes (1: one for the access).
int gated_loads(const UOp* k, int64_t slot, uint32_t lanes) {
  return testing::count_of(k, [&](const UOp* u) {
    if (u->op() != Op::LOAD || u->src(1)->num_src() < 3) return false;
    const UOp* buf = u->src(0);
    return buf->op() == Op::PARAM && buf->arg_as<ParamArg>().slot == slot && u->src(1)->src(2)->dtype().count == lanes;
  });
}

// out[8 i + u] = in[8 i + u - 1] where 8 i + u >= 1, else 0 (a row shifted into its
// padding), u upcast by 8: one masked 8-lane load per i, its gate a vector, proven lane by
// lane; and the same read with its index clamped into the buffer (how the tinygrad bridge
// sends a gated read) looks through the clamp to the same masked load.
TEST(Expand, AGatedContiguousReadIsOneMaskedVectorLoad) {
  for (bool clamped : {false, true}) {
    SCOPED_TRACE(clamped ? "clamped" : "plain");
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::float32, 64);
    const UOp* in = k.param(1, dtypes::float32, 64);
    const UOp* i = k.range(8);
    const UOp* u = k.range(8, AxisType::Upcast);
    const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(8)), u);
    const UOp* from = k.alu(Op::ADD, at, k.ix(-1));
    if (clamped) from = k.alu(Op::MIN, k.alu(Op::MAX, from, k.ix(0)), k.ix(63));
    const UOp* before = k.sink({k.store(out, at, k.load(in, from, k.lt(k.ix(0), at)), {i, u})});
    auto after = expand_upcasts(k.g, before);
    ASSERT_TRUE(after.ok()) << after.status();
    expect_expanded(*after);
    EXPECT_EQ(load_widths(*after, 1), std::vector<uint32_t>{8});
    EXPECT_EQ(gated_loads(*after, 1, 8), 1);
    expect_same_values(k.g, before, *after, {{Scalar::Float32, 64}, {Scalar::Float32, 64}});
  }
}

// A gated read whose unclamped index would leave the buffer where its gate is on (the
// clamp matters: in[max(8 i + u - 1, 0)], the first element repeated, under a gate that
// always holds) stays lane by lane; each lane's clamped index is proven without the gate,
// so each is an ungated load selected by the gate (branch-free), none a gated load.
TEST(Expand, AGatedReadWhoseClampMattersIsLaneByLaneAndBranchFree) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 64);
  const UOp* in = k.param(1, dtypes::int32, 64);
  const UOp* i = k.range(8);
  const UOp* u = k.range(8, AxisType::Upcast);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(8)), u);
  const UOp* from = k.alu(Op::MAX, k.alu(Op::ADD, at, k.ix(-1)), k.ix(0));
  const UOp* before = k.sink({k.store(out, at, k.load(in, from, k.lt(at, k.ix(100))), {i, u})});
  auto after = expand_upcasts(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  expect_expanded(*after);
  EXPECT_EQ(load_widths(*after, 1), std::vector<uint32_t>(8, 1));
  EXPECT_EQ(gated_loads(*after, 1, 1) + gated_loads(*after, 1, 8), 0);
  expect_same_values(k.g, before, *after, {{Scalar::Int32, 64}, {Scalar::Int32, 64}});
}

// out[12 i + u] = i + 1 where 4 <= u < 9, u upcast by 12 (a pad's row: its border and a
// tail off): one masked 12-lane store per i, its gate a vector; and a gated store whose
// lanes are not contiguous (a column, out[12 u + i]) stays lane by lane.
TEST(Expand, AGatedContiguousStoreIsOneMaskedVectorStore) {
  for (bool contiguous : {true, false}) {
    SCOPED_TRACE(contiguous ? "a row" : "a column");
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::int32, 144);
    const UOp* i = k.range(12);
    const UOp* u = k.range(12, AxisType::Upcast);
    const UOp* at = contiguous ? k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(12)), u) : k.alu(Op::ADD, k.alu(Op::MUL, u, k.ix(12)), i);
    const UOp* gate = k.alu(Op::AND, k.lt(k.ix(3), u), k.lt(u, k.ix(9)));
    const UOp* value = k.g.make(Op::CAST, dtypes::int32, {k.alu(Op::ADD, i, k.ix(1))});
    const UOp* index = k.g.make(Op::INDEX, dtypes::int32, {out, at, gate});
    const UOp* before = k.sink({k.g.make(Op::STORE, dtypes::void_, {index, value, i, u})});
    auto after = expand_upcasts(k.g, before);
    ASSERT_TRUE(after.ok()) << after.status();
    expect_expanded(*after);
    std::vector<uint32_t> widths;
    for (const UOp* st : toposort(*after))
      if (st->op() == Op::STORE) {
        ASSERT_EQ(st->src(0)->num_src(), 3u) << "every store keeps its gate";
        widths.push_back(st->src(0)->src(2)->dtype().count);
      }
    EXPECT_EQ(widths, contiguous ? std::vector<uint32_t>{12} : std::vector<uint32_t>(12, 1));
    expect_same_values(k.g, before, *after, {{Scalar::Int32, 144}});
  }
}


// out[y][x] = in[y + 1][x + 2] + in[y][x] over a 7 x 7 map in a 9 x 9 one, each side split
// into 2 x 4 upcast lanes with a masked tail, as split_range leaves it (every use of y
// clamped, min(4 y0 + yl, 6), the STORE gated by 4 y0 + yl < 7; x likewise): the clamps
// make each lane's element a separate address, but a tail lane stores nothing, so each
// read is one masked 4-lane load per row of lanes. Where the STORE is not gated by the
// tail (the clamp is the graph's own: an edge repeated into an 8 x 8 output), every lane
// is stored and the clamped reads stay lane by lane.
TEST(Expand, ADeadTailsClampedReadIsOneMaskedVectorLoadPerRow) {
  for (bool tail : {true, false}) {
    SCOPED_TRACE(tail ? "a split's tail" : "the graph's own clamp");
    KernelBuilder k;
    const int64_t side = tail ? 7 : 8;
    const UOp* out = k.param(0, dtypes::float32, side * side);
    const UOp* in = k.param(1, dtypes::float32, 81);
    const UOp* y0 = k.range(2);
    const UOp* x0 = k.range(2);
    const UOp* yl = k.range(4, AxisType::Upcast);
    const UOp* xl = k.range(4, AxisType::Upcast);
    const UOp* fy = k.alu(Op::ADD, k.alu(Op::MUL, y0, k.ix(4)), yl);
    const UOp* fx = k.alu(Op::ADD, k.alu(Op::MUL, x0, k.ix(4)), xl);
    const UOp* y = k.alu(Op::MIN, fy, k.ix(6));
    const UOp* x = k.alu(Op::MIN, fx, k.ix(6));
    auto at = [&](const UOp* r, const UOp* c, int64_t dr, int64_t dc) {
      return k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::ADD, r, k.ix(dr)), k.ix(9)), k.alu(Op::ADD, c, k.ix(dc)));
    };
    const UOp* value = k.alu(Op::ADD, k.load(in, at(y, x, 1, 2)), k.load(in, at(y, x, 0, 0)));
    const UOp* where = tail ? k.alu(Op::ADD, k.alu(Op::MUL, y, k.ix(7)), x) : k.alu(Op::ADD, k.alu(Op::MUL, fy, k.ix(8)), fx);
    std::vector<const UOp*> index_src{out, where};
    if (tail) index_src.push_back(k.all(k.lt(fy, k.ix(7)), k.lt(fx, k.ix(7))));
    const UOp* index = k.g.make(Op::INDEX, dtypes::float32, index_src);
    const UOp* before = k.sink({k.g.make(Op::STORE, dtypes::void_, {index, value, y0, x0, yl, xl})});
    auto after = expand_upcasts(k.g, before);
    ASSERT_TRUE(after.ok()) << after.status();
    expect_expanded(*after);
    std::vector<uint32_t> widths = load_widths(*after, 1);
    if (tail) EXPECT_EQ(widths, std::vector<uint32_t>(8, 4));
    else EXPECT_TRUE(!widths.empty() && std::all_of(widths.begin(), widths.end(), [](uint32_t w) { return w == 1; }));
    EXPECT_EQ(gated_loads(*after, 1, 4), tail ? 8 : 0);
    expect_same_values(k.g, before, *after, {{Scalar::Float32, side * side}, {Scalar::Float32, 81}});
  }
}

}  // namespace
}  // namespace uop
