// gpu_dims (compiler/passes/gpu_dims.h) on kernels built by hand (Global and Local
// ranges, lowered by lower_reduce, its input stage): the ranges and their ENDs go, and
// SPECIALs blockIdx / threadIdx take their place; over every value of the SPECIALs (the
// whole launch, enumerated) the store's index, where its gate holds, takes each value of
// the range it replaced exactly once and the load reads the element the store writes:
// nothing is skipped or written twice, for a split that divides the extent, one that
// does not (clamped and gated), and a variable extent. Launches it cannot map are
// refused (INTERNAL: the optimizer never makes them).
#include "compiler/passes/gpu_dims.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "compiler/passes/lower_reduce.h"
#include "tests/unit/compiler/passes/expr_eval.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

using testing::KernelBuilder;

// out[r] = in[r] + 1 over a Global range of extent `end`, lowered and mapped.
absl::StatusOr<const UOp*> mapped_copy(KernelBuilder& k, const UOp* end, int64_t size) {
  const UOp* out = k.param(0, dtypes::float32, size);
  const UOp* in = k.param(1, dtypes::float32, size);
  const UOp* r = k.range(end, AxisType::Global);
  const UOp* kernel = k.sink({k.store(out, r, k.alu(Op::ADD, k.load(in, r), k.f32(1)), {r})});
  auto lowered = lower_reduce(k.g, kernel);
  if (!lowered.ok()) return lowered.status();
  return map_gpu_dims(k.g, *lowered);
}

// Runs the launch in the mind: every combination of SPECIAL values (each below its
// extent, evaluated in `env`), the store's index where its gate holds; also checks the
// load reads the same element. How often each index is written.
std::map<int64_t, int> written(const UOp* kernel, testing::Env env) {
  std::vector<const UOp*> specials = testing::nodes_of(kernel, Op::SPECIAL);
  std::vector<const UOp*> stores = testing::nodes_of(kernel, Op::STORE);
  std::vector<const UOp*> loads = testing::nodes_of(kernel, Op::LOAD);
  EXPECT_EQ(stores.size(), 1u);
  EXPECT_EQ(loads.size(), 1u);
  std::map<int64_t, int> times;
  if (stores.size() != 1 || loads.size() != 1) return times;
  const UOp* index = stores[0]->src(0);
  std::vector<int64_t> ext;
  for (const UOp* s : specials) {
    auto e = testing::eval_expr(s->src(0), env);
    EXPECT_TRUE(e.has_value()) << "a SPECIAL's extent that is no expression of the variables";
    ext.push_back(e ? e->to_int() : 0);
  }
  std::vector<int64_t> at(specials.size(), 0);
  for (;;) {
    for (size_t i = 0; i < specials.size(); ++i) env[specials[i]] = ConstValue::Int(at[i]);
    bool gate = true;
    if (index->num_src() > 2) gate = testing::eval_expr(index->src(2), env)->as_bool();
    if (gate) {
      auto i = testing::eval_expr(index->src(1), env);
      auto l = testing::eval_expr(loads[0]->src(1)->src(1), env);
      EXPECT_TRUE(i && l);
      if (i && l) {
        ++times[i->to_int()];
        EXPECT_EQ(l->to_int(), i->to_int()) << "the load reads another element than the store writes";
      }
    }
    size_t d = 0;
    for (; d < at.size(); ++d) {
      if (++at[d] < ext[d]) break;
      at[d] = 0;
    }
    if (d == at.size()) break;
  }
  return times;
}

void expect_each_once(const std::map<int64_t, int>& times, int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(times.size()), n) << "indices written: not each of 0 .. " << n - 1;
  EXPECT_EQ(times.begin()->first, 0);
  EXPECT_EQ(times.rbegin()->first, n - 1);
  for (const auto& [i, t] : times) EXPECT_EQ(t, 1) << "index " << i << " written " << t << " times";
}

std::vector<std::string> names(const UOp* kernel) {
  std::vector<std::string> n;
  for (const UOp* s : testing::nodes_of(kernel, Op::SPECIAL)) n.push_back(s->arg_as<StrArg>().value);
  std::sort(n.begin(), n.end());
  return n;
}

TEST(GpuDims, ASplitThatDividesTheExtent) {
  KernelBuilder k;
  auto mapped = mapped_copy(k, k.ix(1024), 1024);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE(testing::nodes_of(*mapped, Op::RANGE).empty()) << "a parallel range left as a loop";
  EXPECT_TRUE(testing::nodes_of(*mapped, Op::END).empty());
  EXPECT_EQ(names(*mapped), (std::vector<std::string>{"blockIdx.x", "threadIdx.x"}));
  EXPECT_EQ(testing::nodes_of(*mapped, Op::STORE)[0]->src(0)->num_src(), 2u) << "a gate where every thread has an element";
  expect_each_once(written(*mapped, {}), 1024);
}

TEST(GpuDims, ASplitThatDoesNotDivideIsClampedAndGated) {
  KernelBuilder k;
  auto mapped = mapped_copy(k, k.ix(1000), 1000);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(names(*mapped), (std::vector<std::string>{"blockIdx.x", "threadIdx.x"}));
  EXPECT_EQ(testing::nodes_of(*mapped, Op::STORE)[0]->src(0)->num_src(), 3u) << "the tail is not gated";
  expect_each_once(written(*mapped, {}), 1000);
}

TEST(GpuDims, AVariableExtent) {
  KernelBuilder k;
  const UOp* n = k.var("n", 1, 4096);
  auto mapped = mapped_copy(k, n, 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  for (int64_t v : {1, 31, 300, 4096}) {
    SCOPED_TRACE(v);
    expect_each_once(written(*mapped, {{n, ConstValue::Int(v)}}), v);
  }
}

// A Global and a Local range: blocks and threads each take their own.
TEST(GpuDims, GlobalAndLocalRanges) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 8 * 64);
  const UOp* in = k.param(1, dtypes::float32, 8 * 64);
  const UOp* gr = k.range(8, AxisType::Global);
  const UOp* lr = k.range(64, AxisType::Local);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, gr, k.ix(64)), lr);
  auto lowered = lower_reduce(k.g, k.sink({k.store(out, at, k.alu(Op::ADD, k.load(in, at), k.f32(1)), {gr, lr})}));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  auto mapped = map_gpu_dims(k.g, *lowered);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE(testing::nodes_of(*mapped, Op::RANGE).empty());
  std::vector<std::string> got = names(*mapped);
  EXPECT_TRUE(std::find(got.begin(), got.end(), "blockIdx.x") != got.end());
  EXPECT_TRUE(std::find(got.begin(), got.end(), "threadIdx.x") != got.end());
  expect_each_once(written(*mapped, {}), 8 * 64);
}

TEST(GpuDims, LaunchesItCannotMapAreRefused) {
  {
    KernelBuilder k;  // a block of 2048 threads
    const UOp* out = k.param(0, dtypes::float32, 2048);
    const UOp* lr = k.range(2048, AxisType::Local);
    auto lowered = lower_reduce(k.g, k.sink({k.store(out, lr, k.f32(1), {lr})}));
    ASSERT_TRUE(lowered.ok());
    auto mapped = map_gpu_dims(k.g, *lowered);
    EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInternal) << mapped.status();
    EXPECT_NE(mapped.status().message().find("1 .. 1024"), std::string::npos) << mapped.status();
  }
  {
    KernelBuilder k;  // four grid dimensions
    const UOp* out = k.param(0, dtypes::float32, 16);
    std::vector<const UOp*> r;
    for (int i = 0; i < 4; ++i) r.push_back(k.range(2, AxisType::Global));
    const UOp* at = k.alu(Op::ADD, k.alu(Op::ADD, k.alu(Op::MUL, r[0], k.ix(8)), k.alu(Op::MUL, r[1], k.ix(4))),
                          k.alu(Op::ADD, k.alu(Op::MUL, r[2], k.ix(2)), r[3]));
    auto lowered = lower_reduce(k.g, k.sink({k.store(out, at, k.f32(1), r)}));
    ASSERT_TRUE(lowered.ok());
    auto mapped = map_gpu_dims(k.g, *lowered);
    EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInternal) << mapped.status();
    EXPECT_NE(mapped.status().message().find("4 Global"), std::string::npos) << mapped.status();
  }
}

}  // namespace
}  // namespace uop
