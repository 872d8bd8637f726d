// split_kernels (compiler/passes/split_kernels.h) on tensor graphs built by hand and
// rangeified: one kernel per realized value, SINK[kernel](STORE(INDEX(buf, flat), ...))
// called with its buffers (slot 0 the one it writes); steps in an order where every
// buffer is written before it is read; the graph's outputs are the buffers of its
// outputs; buffers only kernels touch are intermediates; the kernels run by the
// interpreter, one after another on the buffers named, compute what the tensor-level
// interpreter computes for the graph.
#include "compiler/passes/split_kernels.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/passes/normalize.h"
#include "compiler/passes/rangeify.h"

namespace uop {
namespace {

absl::StatusOr<Schedule> schedule(Graph& g, const UOp* sink) {
  ShapeInference shapes(g);
  auto r = rangeify(g, sink, shapes);
  if (!r.ok()) return r.status();
  return split_kernels(g, *r, "CPU:0");
}

// Runs the schedule's kernels in order on buffers by BUFFER node (inputs given, the rest
// zeros), each normalized so that the interpreter can take its slots; the outputs.
std::vector<HostTensor> run(Graph& g, const Schedule& s, const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
  absl::flat_hash_map<const UOp*, HostTensor> mem(inputs.begin(), inputs.end());
  auto buffer = [&](const UOp* b) -> HostTensor& {
    if (!mem.contains(b)) mem.emplace(b, HostTensor::zeros(b->dtype().scalar, {b->arg_as<BufferArg>().size}));
    return mem.at(b);
  };
  for (const KernelCall& k : s.calls) {
    auto body = normalize(g, k.body);
    EXPECT_TRUE(body.ok()) << body.status();
    if (!body.ok()) return {};
    std::vector<HostTensor*> params;
    for (const UOp* b : k.buffers) params.push_back(&buffer(b));
    absl::Status st = interpret_kernel(*body, params, {});
    EXPECT_TRUE(st.ok()) << st;
  }
  std::vector<HostTensor> out;
  for (const UOp* o : s.outputs) out.push_back(buffer(o));
  return out;
}

void expect_values(Graph& g, const UOp* sink, const Schedule& s, const absl::flat_hash_map<const UOp*, HostTensor>& in) {
  auto want = interpret(g, sink, in);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<HostTensor> got = run(g, s, in);
  ASSERT_EQ(got.size(), want->size());
  for (size_t i = 0; i < got.size(); ++i) {
    got[i].shape = (*want)[i].shape;
    CompareResult c = compare((*want)[i], got[i], Tolerance::for_dtype((*want)[i].dtype));
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
}

// The BUFFERs a kernel body reads (LOADs) and the one it writes (its STOREs).
struct Access {
  std::set<const UOp*> reads, writes;
};
Access access(const UOp* body) {
  Access a;
  for (const UOp* u : toposort(body)) {
    if (u->op() == Op::LOAD && u->src(0)->op() == Op::BUFFER) a.reads.insert(u->src(0));
    if (u->op() == Op::STORE && u->src(0)->src(0)->op() == Op::BUFFER) a.writes.insert(u->src(0)->src(0));
  }
  return a;
}

// softmax over rows: the max and the sum are realized (each read by every element of its
// row), so three kernels, in an order where each reads only what is written before it.
TEST(SplitKernels, OneKernelPerRealizedValueInDependencyOrder) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {3, 5});
  const UOp* m = tb.reduce(x, ReduceOp::Max, {1});
  const UOp* e = tb.alu(Op::EXP2, {tb.alu(Op::SUB, {x, m})});
  const UOp* out = tb.alu(Op::FDIV, {e, tb.reduce(e, ReduceOp::Add, {1})});
  const UOp* sink = tb.sink({out});
  auto s = schedule(g, sink);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->calls.size(), 3u);
  ASSERT_EQ(s->steps.size(), 3u);
  EXPECT_TRUE(s->collectives.empty());
  EXPECT_TRUE(s->copies.empty());

  absl::flat_hash_set<const UOp*> written{tb.buffer_of(x)};
  for (size_t i = 0; i < s->steps.size(); ++i) {
    ASSERT_EQ(s->steps[i].kind, ScheduleStep::Kind::Kernel);
    const KernelCall& k = s->calls[s->steps[i].index];
    ASSERT_EQ(k.body->op(), Op::SINK);
    ASSERT_FALSE(k.buffers.empty());
    Access a = access(k.body);
    EXPECT_EQ(a.writes, std::set<const UOp*>{k.buffers[0]}) << "kernel " << i << " writes other than slot 0";
    for (const UOp* r : a.reads) EXPECT_TRUE(written.contains(r)) << "kernel " << i << " reads a buffer not written yet";
    for (const UOp* b : k.buffers) EXPECT_TRUE(a.reads.contains(b) || a.writes.contains(b)) << "a buffer it does not use";
    written.insert(k.buffers[0]);
  }
  ASSERT_EQ(s->outputs.size(), 1u);
  EXPECT_EQ(s->outputs[0], s->calls[s->steps.back().index].buffers[0]) << "the last kernel writes the output";
  EXPECT_EQ(s->intermediates.size(), 2u) << "the max and the sum, which only kernels see";
  for (const UOp* b : s->intermediates) EXPECT_NE(b, s->outputs[0]);

  expect_values(g, sink, *s, {{tb.buffer_of(x), HostTensor::random(Scalar::Float32, {15}, 3)}});
}

// Element-wise work on the inputs fuses into the kernel that stores: one kernel, with
// each input a slot, and two outputs two kernels (one buffer each).
TEST(SplitKernels, FusedWorkIsOneKernelPerOutput) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Int32, {4, 6});
  const UOp* b = tb.input(Scalar::Int32, {6});
  const UOp* sum = tb.alu(Op::ADD, {a, b});
  const UOp* sink = tb.sink({tb.alu(Op::MUL, {sum, sum}), tb.permute(a, {1, 0})});
  auto s = schedule(g, sink);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->calls.size(), 2u);
  EXPECT_TRUE(s->intermediates.empty());
  ASSERT_EQ(s->outputs.size(), 2u);
  EXPECT_NE(s->outputs[0], s->outputs[1]);
  for (const KernelCall& k : s->calls) {
    Access acc = access(k.body);
    EXPECT_FALSE(acc.reads.contains(k.buffers[0])) << "a kernel reads its own output";
  }
  expect_values(g, sink, *s,
                {{tb.buffer_of(a), HostTensor::random(Scalar::Int32, {24}, 1)},
                 {tb.buffer_of(b), HostTensor::random(Scalar::Int32, {6}, 2)}});
}

}  // namespace
}  // namespace uop
