// Random tensor-level graphs (random_graph.h), each compiled, run and compared with the
// reference interpreter under the tolerance the generator derived for every output.
// Seeds are consecutive from a fixed base, so every run checks the same graphs; a failure
// prints its seed, the graph and a replay line:
//   UOPD_RANDOM_SEED=<seed> differential_test --gtest_filter='RandomGraphs.*'
// UOPD_RANDOM_BASE and UOPD_RANDOM_COUNT (default 300) explore other seeds.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "compiler/ir/printer.h"
#include "tests/unit/compiler/differential.h"
#include "tests/unit/compiler/random_graph.h"

namespace uop {
namespace {

using namespace difftest;

// The graphs every run checks.
constexpr uint64_t kBase = 0x5eed0000;
constexpr uint64_t kCount = 300;

std::optional<uint64_t> env_u64(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::strtoull(v, nullptr, 0);
}

TEST(RandomGraphs, MatchTheInterpreter) {
  uint64_t base = env_u64("UOPD_RANDOM_BASE").value_or(kBase);
  uint64_t count = env_u64("UOPD_RANDOM_COUNT").value_or(kCount);
  if (auto seed = env_u64("UOPD_RANDOM_SEED")) base = *seed, count = 1;
  const uint64_t max_failures = env_u64("UOPD_RANDOM_MAX_FAILURES").value_or(5);
  LocalRunner runner;
  RunStats stats;
  uint64_t failures = 0;
  for (uint64_t i = 0; i < count && failures < max_failures; ++i) {
    std::string why = check_random_graph(runner, base + i, &stats);
    if (!why.empty()) why = cat("seed ", base + i, " (replay: UOPD_RANDOM_SEED=", base + i, ")\n", why);
    if (!why.empty()) {
      ++failures;
      ADD_FAILURE() << why;
    }
  }
  std::printf("[ random   ] %llu graphs from seed %llu: %d kernels run, %d compiled\n",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(base), stats.kernels, stats.compiled);
}

TEST(RandomGraphs, SameSeedSameGraph) {
  for (uint64_t seed : {1u, 2u, 77u}) {
    Graph g1, g2;
    TensorBuilder t1(g1), t2(g2);
    auto a = randgraph::generate(t1, seed), b = randgraph::generate(t2, seed);
    EXPECT_EQ(a.sink->digest(), b.sink->digest()) << "seed " << seed;
    Graph g3;
    TensorBuilder t3(g3);
    EXPECT_NE(randgraph::generate(t3, seed + 1000).sink->digest(), a.sink->digest());
  }
}

// What the generator promises, counted over the seeds the main test runs: every movement
// op, reductions of every kind, reductions feeding element-wise ops reduced again, casts,
// bitcasts, several outputs, shared subexpressions, every dtype, zero-size dims.
TEST(RandomGraphs, CoverWhatTheyPromise) {
  std::map<std::string, int> seen;
  for (uint64_t seed = kBase; seed < kBase + kCount; ++seed) {
    Graph g;
    TensorBuilder tb(g);
    auto rg = randgraph::generate(tb, seed);
    if (rg.sink->num_src() > 1) ++seen["several outputs"];
    absl::flat_hash_map<const UOp*, int> users;
    absl::flat_hash_set<const UOp*> below_reduce_alu;  // ALU nodes with a REDUCE_AXIS below
    for (const UOp* u : toposort(rg.sink)) {
      for (const UOp* s : u->src()) ++users[s];
      if (is_movement(u->op()) || u->op() == Op::REDUCE_AXIS || u->op() == Op::CAST || u->op() == Op::BITCAST ||
          u->op() == Op::WHERE || u->op() == Op::MULACC || u->op() == Op::CONTIGUOUS)
        ++seen[std::string(op_name(u->op()))];
      if (u->op() == Op::REDUCE_AXIS) ++seen[cat("reduce ", reduce_op_name(u->arg_as<ReduceAxisArg>().op))];
      if (u->op() == Op::BUFFER) {
        ++seen[cat("dtype ", scalar_name(u->dtype().scalar))];
        if (u->arg_as<BufferArg>().size == 0) ++seen["zero-size input"];
      }
      bool over_reduce = false;
      for (const UOp* s : u->src()) over_reduce |= s->op() == Op::REDUCE_AXIS || below_reduce_alu.contains(s);
      if (over_reduce && (is_alu(u->op()) || is_movement(u->op()))) below_reduce_alu.insert(u);
      if (u->op() == Op::REDUCE_AXIS && below_reduce_alu.contains(u->src(0))) ++seen["reduce of elementwise of reduce"];
    }
    for (auto& [u, n] : users)
      if (n > 1 && (is_alu(u->op()) || u->op() == Op::REDUCE_AXIS)) {
        ++seen["shared subexpression"];
        break;
      }
  }
  for (const char* want : {"RESHAPE", "PERMUTE", "EXPAND", "PAD", "SHRINK", "FLIP", "CAST", "BITCAST", "WHERE",
                           "MULACC", "CONTIGUOUS", "reduce Add", "reduce Mul", "reduce Max", "reduce Min",
                           "reduce of elementwise of reduce", "several outputs", "shared subexpression",
                           "zero-size input"})
    EXPECT_GE(seen[want], 3) << want;
  for (Scalar s : all_dtypes()) EXPECT_GE((seen[cat("dtype ", scalar_name(s))]), 3) << scalar_name(s);
}

}  // namespace
}  // namespace uop
