// group_reduce (compiler/passes/group_reduce.h) on kernels built by hand with a
// GroupReduce range: the REDUCE becomes a shared-memory tree (one DEFINE_LOCAL of L
// elements, a barrier after the first store and after every step, none under a
// condition), each thread's other ranges reduced into its partial first; a STORE of the
// result to an address that does not move with the thread is gated to thread 0. The tree
// is run here the way a block runs it (each step: every thread reads, then every thread
// writes, then the barrier) for L a power of two and not, and must give the sum or max the
// interpreter gives on the kernel before the pass. The kernel it makes needs a GPU to run
// (tests/gpu). Kernels without GroupReduce ranges come back as they are; a REDUCE over two
// GroupReduce ranges, or over one of variable extent, is refused (INTERNAL: optimize_gpu
// never makes them).
#include "compiler/passes/group_reduce.h"

#include <gtest/gtest.h>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/eval.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

using testing::KernelBuilder;

// The block's run of the tree that ends in `result` (the BARRIER over the read of
// smem[0]), for threads 0..L-1 of GroupReduce range `t`: `in` is what LOADs of PARAMs read.
// What each thread reads at the end, or a message saying what could not be run.
struct Block {
  const UOp* t;
  int64_t L;
  std::vector<ConstValue> in;
  std::vector<std::optional<ConstValue>> smem;
  std::string error;

  // Values of the serial ranges a REDUCE runs over, while it runs.
  absl::flat_hash_map<const UOp*, int64_t> loops;

  std::optional<ConstValue> eval(const UOp* u, int64_t tid, absl::flat_hash_map<const UOp*, std::optional<ConstValue>>& memo) {
    if (auto it = memo.find(u); it != memo.end()) return it->second;
    std::optional<ConstValue> v;
    if (u == t) {
      v = ConstValue::Int(tid);
    } else if (auto it = loops.find(u); it != loops.end()) {
      v = ConstValue::Int(it->second);
    } else if (u->op() == Op::REDUCE && u->num_src() == 2 && u->src(1)->src(0)->const_value()) {
      // A thread's partial: its own loop, run here.
      const UOp* r = u->src(1);
      ReduceOp rop = u->arg_as<ReduceOpArg>().op;
      v = reduce_identity(rop, u->dtype().scalar);
      for (int64_t i = 0; i < r->src(0)->const_value()->to_int() && v; ++i) {
        loops[r] = i;
        absl::flat_hash_map<const UOp*, std::optional<ConstValue>> inner;
        auto x = eval(u->src(0), tid, inner);
        std::vector<ConstValue> args{*v};
        if (x) args.push_back(*x);
        v = x ? eval_alu(reduce_combine_op(rop), u->dtype().scalar, args) : std::nullopt;
      }
      loops.erase(r);
    } else if (u->op() == Op::CONST) {
      v = *u->const_value();
    } else if (is_alu(u->op())) {
      std::vector<ConstValue> args;
      for (const UOp* s : u->src()) {
        auto a = eval(s, tid, memo);
        if (!a) return std::nullopt;
        args.push_back(*a);
      }
      v = eval_alu(u->op(), u->src(u->op() == Op::WHERE ? 1 : 0)->dtype().scalar, args);
    } else if (u->op() == Op::LOAD && u->src(1)->op() == Op::INDEX) {
      const UOp* index = u->src(1);
      bool open = true;
      if (index->num_src() > 2) {
        auto gate = eval(index->src(2), tid, memo);
        if (!gate) return std::nullopt;
        open = gate->as_bool();
      }
      if (!open) {
        v = u->num_src() > 2 ? eval(u->src(2), tid, memo) : std::nullopt;
      } else if (auto i = eval(index->src(1), tid, memo); i) {
        const UOp* buf = index->src(0);
        while (buf->op() == Op::AFTER) buf = buf->src(0);
        int64_t at = i->to_int();
        if (buf->op() == Op::PARAM && at >= 0 && at < static_cast<int64_t>(in.size())) v = in[at];
        if (buf->op() == Op::DEFINE_LOCAL) {
          if (at < 0 || at >= L) error = "smem read out of bounds";
          else if (!smem[at]) error = "smem read before it was written";
          else v = smem[at];
        }
      }
    }
    if (!v && error.empty()) error = "cannot run " + std::string(op_name(u->op()));
    memo[u] = v;
    return v;
  }

  // Runs the chain of barriers before `result` and returns what each thread reads.
  std::vector<std::optional<ConstValue>> run(const UOp* result) {
    std::deque<const UOp*> stores;
    const UOp* read = result->src(0);
    const UOp* buf = read->src(1)->src(0);
    while (buf->op() == Op::AFTER) {
      const UOp* bar = buf->src(1);
      stores.push_front(bar->src(0));
      buf = bar->src(0)->src(0)->src(0);
    }
    smem.assign(L, std::nullopt);
    for (const UOp* st : stores) {
      // Every thread computes what it writes from the memory as the barrier left it.
      std::vector<std::pair<int64_t, std::optional<ConstValue>>> writes;
      for (int64_t tid = 0; tid < L; ++tid) {
        absl::flat_hash_map<const UOp*, std::optional<ConstValue>> memo;
        const UOp* index = st->src(0);
        if (index->num_src() > 2) {
          auto gate = eval(index->src(2), tid, memo);
          if (!gate || !gate->as_bool()) continue;
        }
        auto i = eval(index->src(1), tid, memo);
        if (!i) continue;
        writes.push_back({i->to_int(), eval(st->src(1), tid, memo)});
      }
      for (auto& [i, v] : writes) {
        if (i < 0 || i >= L) error = "smem write out of bounds";
        else smem[i] = v;
      }
    }
    std::vector<std::optional<ConstValue>> out;
    for (int64_t tid = 0; tid < L; ++tid) {
      absl::flat_hash_map<const UOp*, std::optional<ConstValue>> memo;
      out.push_back(eval(read, tid, memo));
    }
    return out;
  }
};

// out[0] = reduce(op) over T < L (GroupReduce) of in[T], int32.
struct Folded {
  KernelBuilder k;
  const UOp* out;
  const UOp* in;
  const UOp* t;
  const UOp* before;
};
void build_fold(Folded& f, ReduceOp op, int64_t L) {
  f.out = f.k.param(0, dtypes::int32, 1);
  f.in = f.k.param(1, dtypes::int32, L);
  f.t = f.k.range(L, AxisType::GroupReduce);
  f.before = f.k.sink({f.k.store(f.out, f.k.ix(0), f.k.reduce(op, f.k.load(f.in, f.t), {f.t}), {})});
}

// What the interpreter stores in out[0] for `kernel` on in = `values`.
ConstValue interpreted(const UOp* kernel, const HostTensor& values) {
  HostTensor out = HostTensor::zeros(Scalar::Int32, {1});
  HostTensor in = values;
  std::vector<HostTensor*> params{&out, &in};
  absl::Status st = interpret_kernel(kernel, params, {});
  EXPECT_TRUE(st.ok()) << st;
  return out.get(0);
}

const UOp* folded_result(const UOp* kernel) {
  for (const UOp* s : testing::nodes_of(kernel, Op::STORE))
    if (s->src(0)->src(0)->op() == Op::PARAM) return s->src(1);
  return nullptr;
}

// The tree for L = 8 (a power of two) and 6 (not: the first step's reads past L are gated
// off): one DEFINE_LOCAL of L, barriers 1 + log2(P) + 1, none under a condition, and every
// thread reads the sum (or max) the interpreter computes.
TEST(GroupReduce, TheBlockFoldsItsPartialsInSharedMemory) {
  for (int64_t L : {8, 6}) {
    for (ReduceOp op : {ReduceOp::Add, ReduceOp::Max}) {
      SCOPED_TRACE("L = " + std::to_string(L));
      Folded f;
      build_fold(f, op, L);
      auto after = group_reduce(f.k.g, f.before);
      ASSERT_TRUE(after.ok()) << after.status();
      EXPECT_TRUE(testing::nodes_of(*after, Op::REDUCE).empty());
      auto locals = testing::nodes_of(*after, Op::DEFINE_LOCAL);
      ASSERT_EQ(locals.size(), 1u);
      EXPECT_EQ(locals[0]->dtype().addrspace, AddrSpace::Local);
      EXPECT_EQ(locals[0]->dtype().size, L);
      EXPECT_EQ(testing::nodes_of(*after, Op::BARRIER).size(), 5u) << "first store, steps 4, 2, 1, the read";
      EXPECT_TRUE(testing::nodes_of(*after, Op::IF).empty()) << "a barrier under a condition";

      const UOp* result = folded_result(*after);
      ASSERT_NE(result, nullptr);
      ASSERT_EQ(result->op(), Op::BARRIER);
      HostTensor values = HostTensor::random(Scalar::Int32, {L}, 5 + L);
      Block block{f.t, L, values.values(), {}, {}, {}};
      auto reads = block.run(result);
      ASSERT_TRUE(block.error.empty()) << block.error;
      ConstValue want = interpreted(f.before, values);
      for (int64_t tid = 0; tid < L; ++tid) {
        ASSERT_TRUE(reads[tid].has_value()) << "thread " << tid;
        EXPECT_EQ(reads[tid]->to_int(), want.to_int()) << "thread " << tid;
      }
    }
  }
}

// out[0] is one address for every thread: its STORE is gated to T < 1. out2[T] moves with
// T: every thread writes its own element, no gate.
TEST(GroupReduce, OneThreadWritesAResultWhoseAddressDoesNotMove) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 1);
  const UOp* in = k.param(1, dtypes::int32, 8);
  const UOp* out2 = k.param(2, dtypes::int32, 8);
  const UOp* t = k.range(8, AxisType::GroupReduce);
  const UOp* sum = k.reduce(ReduceOp::Add, k.load(in, t), {t});
  const UOp* kernel = k.sink({k.store(out, k.ix(0), sum, {}), k.store(out2, t, sum, {})});
  auto after = group_reduce(k.g, kernel);
  ASSERT_TRUE(after.ok()) << after.status();
  int gated = 0, free = 0;
  for (const UOp* s : testing::nodes_of(*after, Op::STORE)) {
    const UOp* index = s->src(0);
    if (index->src(0) == out) {
      ASSERT_EQ(index->num_src(), 3u) << "the store to out[0] has no gate";
      const UOp* gate = index->src(2);
      ASSERT_EQ(gate->op(), Op::CMPLT);
      EXPECT_EQ(gate->src(0), t);
      ASSERT_NE(gate->src(1)->const_value(), nullptr);
      EXPECT_EQ(gate->src(1)->const_value()->to_int(), 1);
      ++gated;
    }
    if (index->src(0) == out2) {
      EXPECT_EQ(index->num_src(), 2u) << "out2[T] is gated";
      ++free;
    }
  }
  EXPECT_EQ(gated, 1);
  EXPECT_EQ(free, 1);
}

// REDUCE over a serial range ro and the GroupReduce T: each thread first reduces its own
// ro into a partial (a REDUCE over ro alone), then the block folds the partials.
TEST(GroupReduce, EachThreadReducesItsOtherRangesFirst) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 1);
  const UOp* in = k.param(1, dtypes::int32, 32);
  const UOp* ro = k.range(4, AxisType::Reduce);
  const UOp* t = k.range(8, AxisType::GroupReduce);
  const UOp* before = k.sink({k.store(out, k.ix(0), k.reduce(ReduceOp::Add, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, ro, k.ix(8)), t)), {ro, t}), {})});
  auto after = group_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  auto reduces = testing::nodes_of(*after, Op::REDUCE);
  ASSERT_EQ(reduces.size(), 1u);
  ASSERT_EQ(reduces[0]->num_src(), 2u);
  EXPECT_EQ(reduces[0]->src(1), ro) << "the partial reduces ro only";

  HostTensor values = HostTensor::random(Scalar::Int32, {32}, 9);
  const UOp* result = folded_result(*after);
  ASSERT_NE(result, nullptr);
  Block block{t, 8, values.values(), {}, {}, {}};
  auto reads = block.run(result);
  ASSERT_TRUE(block.error.empty()) << block.error;
  ConstValue want = interpreted(before, values);
  for (int64_t tid = 0; tid < 8; ++tid) {
    ASSERT_TRUE(reads[tid].has_value()) << "thread " << tid;
    EXPECT_EQ(reads[tid]->to_int(), want.to_int()) << "thread " << tid;
  }
}

// Nothing to fold: the kernel itself comes back.
TEST(GroupReduce, AKernelWithoutGroupReduceRangesIsLeftAlone) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 1);
  const UOp* in = k.param(1, dtypes::int32, 8);
  const UOp* r = k.range(8, AxisType::Reduce);
  const UOp* before = k.sink({k.store(out, k.ix(0), k.reduce(ReduceOp::Add, k.load(in, r), {r}), {})});
  auto after = group_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, before);
}

// Two GroupReduce ranges in one REDUCE, or one of a variable extent: INTERNAL, naming the rule.
TEST(GroupReduce, ReducesItCannotFoldAreRefused) {
  {
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::int32, 1);
    const UOp* in = k.param(1, dtypes::int32, 64);
    const UOp* a = k.range(8, AxisType::GroupReduce);
    const UOp* b = k.range(8, AxisType::GroupReduce);
    const UOp* kernel = k.sink({k.store(out, k.ix(0), k.reduce(ReduceOp::Add, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, a, k.ix(8)), b)), {a, b}), {})});
    absl::Status s = group_reduce(k.g, kernel).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(std::string(s.message()).find("one GroupReduce range"), std::string::npos) << s;
  }
  {
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::int32, 1);
    const UOp* in = k.param(1, dtypes::int32, 64);
    const UOp* a = k.range(k.var("n", 1, 64), AxisType::GroupReduce);
    const UOp* kernel = k.sink({k.store(out, k.ix(0), k.reduce(ReduceOp::Add, k.load(in, a), {a}), {})});
    absl::Status s = group_reduce(k.g, kernel).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  }
}

}  // namespace
}  // namespace uop
