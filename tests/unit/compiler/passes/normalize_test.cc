// normalize (compiler/passes/normalize.h) on kernel bodies built by hand over BUFFERs, as
// split_kernels leaves them: BUFFERs become PARAM slots in the order of first use (slot 0
// the buffer the first STORE writes), RANGEs are renumbered 0, 1, ... in toposort order,
// so one computation on other buffers and other axis ids is one node (one digest), while
// another computation is not; what is normalized already is left as it is; and the
// normalized kernel, run by the interpreter on the slots as numbered, computes what the
// tensor-level interpreter computes for the same expression.
#include "compiler/passes/normalize.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

// out[r] = x[r] + y[r] * 2 over n elements, its range numbered `axis`: `out`, `x`, `y`
// are BUFFERs.
const UOp* body(testing::KernelBuilder& k, const UOp* out, const UOp* x, const UOp* y, int64_t n, int axis) {
  k.next_axis = axis;
  const UOp* r = k.range(n);
  const UOp* v = k.alu(Op::ADD, k.load(x, r), k.alu(Op::MUL, k.load(y, r), k.f32(2)));
  return k.sink({k.store(out, r, v, {r})});
}

TEST(Normalize, BuffersBecomeSlotsInOrderOfFirstUseAndRangesAreRenumbered) {
  testing::KernelBuilder k;
  TensorBuilder tb(k.g);
  const UOp* out = tb.buffer_of(tb.input(Scalar::Float32, {6}));
  const UOp* x = tb.buffer_of(tb.input(Scalar::Float32, {6}));
  const UOp* y = tb.buffer_of(tb.input(Scalar::Float32, {6}));
  auto n = normalize(k.g, body(k, out, x, y, 6, /*axis=*/41));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(testing::nodes_of(*n, Op::BUFFER).empty()) << "a BUFFER left in the kernel";
  std::vector<const UOp*> params = testing::nodes_of(*n, Op::PARAM);
  ASSERT_EQ(params.size(), 3u);
  // The STORE writes slot 0, whatever the buffers were.
  const UOp* store = (*n)->src(0);
  ASSERT_EQ(store->op(), Op::STORE);
  EXPECT_EQ(store->src(0)->src(0)->arg_as<ParamArg>().slot, 0);
  EXPECT_EQ(store->src(0)->src(0)->arg_as<ParamArg>().size, 6);
  std::vector<const UOp*> ranges = testing::nodes_of(*n, Op::RANGE);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0]->arg_as<RangeArg>().axis_id, 0);
  EXPECT_TRUE(ranges[0]->arg_as<RangeArg>().renumbered);
}

// The same computation over other buffers, with other axis ids, is the same node; with
// the inputs swapped or another constant it is another.
TEST(Normalize, OneComputationIsOneKernelWhateverItsBuffers) {
  testing::KernelBuilder k;
  TensorBuilder tb(k.g);
  std::vector<const UOp*> b;
  for (int i = 0; i < 6; ++i) b.push_back(tb.buffer_of(tb.input(Scalar::Float32, {8})));
  auto first = normalize(k.g, body(k, b[0], b[1], b[2], 8, 0));
  auto second = normalize(k.g, body(k, b[3], b[4], b[5], 8, 9));
  auto reused = normalize(k.g, body(k, b[5], b[0], b[3], 8, 3));
  ASSERT_TRUE(first.ok() && second.ok() && reused.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(*first, *reused);
  EXPECT_EQ((*first)->digest(), (*second)->digest());

  // x + 2x (one buffer read twice) is another kernel, and so is one over another length.
  auto same_buffer = normalize(k.g, body(k, b[0], b[1], b[1], 8, 0));
  ASSERT_TRUE(same_buffer.ok());
  EXPECT_NE(*same_buffer, *first);
  EXPECT_EQ(testing::nodes_of(*same_buffer, Op::PARAM).size(), 2u);
  testing::KernelBuilder other;
  TensorBuilder otb(other.g);
  const UOp* o = otb.buffer_of(otb.input(Scalar::Float32, {4}));
  const UOp* ox = otb.buffer_of(otb.input(Scalar::Float32, {4}));
  const UOp* oy = otb.buffer_of(otb.input(Scalar::Float32, {4}));
  auto shorter = normalize(other.g, body(other, o, ox, oy, 4, 0));
  ASSERT_TRUE(shorter.ok());
  EXPECT_NE((*shorter)->digest(), (*first)->digest());
}

// A kernel that is normalized already (PARAMs, ranges numbered from 0) comes back as it is.
TEST(Normalize, WhatIsNormalizedAlreadyIsLeftAlone) {
  testing::KernelBuilder k;
  TensorBuilder tb(k.g);
  auto once = normalize(k.g, body(k, tb.buffer_of(tb.input(Scalar::Float32, {5})),
                                  tb.buffer_of(tb.input(Scalar::Float32, {5})),
                                  tb.buffer_of(tb.input(Scalar::Float32, {5})), 5, 17));
  ASSERT_TRUE(once.ok());
  auto twice = normalize(k.g, *once);
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(*twice, *once);
}

// The normalized kernel on its slots computes x + 2y as the tensor-level interpreter does:
// the slots are bound to the buffers they were made from (read off the kernel's loads).
TEST(Normalize, TheNormalizedKernelComputesTheSameValues) {
  testing::KernelBuilder k;
  TensorBuilder tb(k.g);
  const UOp* xt = tb.input(Scalar::Float32, {7});
  const UOp* yt = tb.input(Scalar::Float32, {7});
  const UOp* out = tb.buffer_of(tb.input(Scalar::Float32, {7}));
  const UOp* x = tb.buffer_of(xt);
  const UOp* y = tb.buffer_of(yt);
  auto n = normalize(k.g, body(k, out, x, y, 7, 3));
  ASSERT_TRUE(n.ok()) << n.status();

  HostTensor xv = HostTensor::random(Scalar::Float32, {7}, 1), yv = HostTensor::random(Scalar::Float32, {7}, 2);
  auto want = interpret(k.g, tb.sink({tb.alu(Op::ADD, {xt, tb.alu(Op::MUL, {yt, tb.full(Scalar::Float32, 2.0, {})})})}),
                        {{x, xv}, {y, yv}});
  ASSERT_TRUE(want.ok()) << want.status();

  // value = ADD(LOAD(PARAM x), MUL(LOAD(PARAM y), 2)), its operands in either order.
  const UOp* value = (*n)->src(0)->src(1);
  ASSERT_EQ(value->op(), Op::ADD);
  int64_t x_slot = -1, y_slot = -1;
  for (const UOp* s : value->src()) {
    if (s->op() == Op::LOAD) x_slot = s->src(0)->arg_as<ParamArg>().slot;
    if (s->op() == Op::MUL)
      for (const UOp* f : s->src())
        if (f->op() == Op::LOAD) y_slot = f->src(0)->arg_as<ParamArg>().slot;
  }
  ASSERT_EQ((std::set<int64_t>{x_slot, y_slot}), (std::set<int64_t>{1, 2}));
  std::vector<HostTensor> slots(3, HostTensor::zeros(Scalar::Float32, {7}));
  slots[x_slot] = xv;
  slots[y_slot] = yv;
  std::vector<HostTensor*> ptrs{&slots[0], &slots[1], &slots[2]};
  absl::Status st = interpret_kernel(*n, ptrs, {});
  ASSERT_TRUE(st.ok()) << st;
  HostTensor got = slots[0];
  got.shape = (*want)[0].shape;
  CompareResult c = compare((*want)[0], got, Tolerance::for_dtype(Scalar::Float32));
  EXPECT_TRUE(c.ok) << c.message;
}

}  // namespace
}  // namespace uop
