// Random loop schedules (compiler/passes/loop_schedule.h) on the kernels of random graphs
// (random_graph.h) and of corpus shapes (odd matmuls, reductions over odd axes): every
// kernel gets a schedule drawn from the steps that fit it (splits by any factor, dividing
// or not, into Loop, Reduce or Upcast; reorders of its output loops; Thread on the
// outermost), is compiled through the whole CPU lowering (the bounds proof included) and
// run, and each output is compared with the reference interpreter under the generator's
// tolerance. Replay one graph with UOPD_RANDOM_SEED=<seed>
// differential_test --gtest_filter='RandomSchedules.*'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compiler/passes/loop_schedule.h"
#include "compiler/passes/optimize.h"
#include "tests/unit/compiler/differential.h"
#include "tests/unit/compiler/random_graph.h"

namespace uop {
namespace {

using namespace difftest;

// A schedule drawn at random from the steps that fit `kernel` under the CPU's limits:
// the generator keeps what each step does to the trip counts, the lanes and the STORE's
// loop order, so every schedule it makes applies (a refusal is a failure).
std::string random_schedule(const UOp* kernel, uint64_t seed) {
  std::vector<const UOp*> axes = schedule_axes(kernel);
  if (axes.empty()) return "";
  randgraph::Rng rng(seed);
  const ScheduleLimits limits = cpu_schedule_limits();
  std::vector<int64_t> trip;
  std::vector<bool> output, upcast, gated;  // gated: read by a gate, split only into upcast by divisors
  std::vector<int64_t> order;  // the STORE's loops, outermost first
  size_t outputs = 0;
  for (const UOp* r : kernel->src(0)->src().subspan(2))
    if (r->op() == Op::RANGE) order.push_back(static_cast<int64_t>(outputs++));
  int64_t lanes = 1;
  bool threaded = false;
  for (size_t i = 0; i < axes.size(); ++i) {
    trip.push_back(const_end(axes[i]));
    output.push_back(i < outputs);
    upcast.push_back(axes[i]->arg_as<RangeArg>().type == AxisType::Upcast);
    gated.push_back(!can_mask(kernel, axes[i]));
    if (upcast.back()) lanes *= trip.back();
  }
  LoopSchedule s;
  const int64_t steps = rng.range(1, 5);
  for (int64_t n = 0; n < steps; ++n) {
    const int64_t what = rng.range(0, 9);
    if (what < 6) {
      std::vector<int64_t> can;
      for (size_t a = 0; a < trip.size(); ++a)  // the Thread loop keeps its iterations
        if (trip[a] >= 2 && !(threaded && static_cast<int64_t>(a) == order[0])) can.push_back(static_cast<int64_t>(a));
      if (can.empty()) continue;
      const int64_t a = rng.pick(can);
      int64_t f = rng.range(2, std::min<int64_t>(trip[a], 12));
      while (gated[a] && trip[a] % f != 0) --f;
      if (f < 2) continue;
      AxisType t = rng.chance(0.5) || gated[a] ? AxisType::Upcast : output[a] ? AxisType::Loop : AxisType::Reduce;
      const int64_t outer = (trip[a] + f - 1) / f;
      int64_t after = upcast[a] ? lanes / trip[a] * outer : lanes;
      if (t == AxisType::Upcast) after *= f;
      if (after > limits.max_lanes) {
        if (gated[a]) continue;
        t = output[a] ? AxisType::Loop : AxisType::Reduce;
        after = upcast[a] ? lanes / trip[a] * outer : lanes;
      }
      lanes = after;
      s.steps.push_back(LoopStep{.kind = LoopStep::Kind::Split, .axis = a, .factor = f, .type = t});
      trip[a] = outer;
      trip.push_back(f);
      output.push_back(output[a]);
      gated.push_back(gated[a]);
      upcast.push_back(t == AxisType::Upcast);
      auto at = std::find(order.begin(), order.end(), a);
      if (at != order.end()) order.insert(at + 1, static_cast<int64_t>(trip.size()) - 1);
    } else if (what < 8) {
      if (order.size() < 2) continue;
      // Shuffled, the Thread loop (if any) kept outermost.
      for (size_t i = order.size() - 1; i > (threaded ? 1u : 0u); --i)
        std::swap(order[i], order[static_cast<size_t>(rng.range(threaded ? 1 : 0, static_cast<int64_t>(i)))]);
      s.steps.push_back(LoopStep{.kind = LoopStep::Kind::Reorder, .order = order});
    } else {
      if (threaded || order.empty() || upcast[order[0]] || (trip[order[0]] >= 0 && trip[order[0]] < 2)) continue;
      threaded = true;
      s.steps.push_back(LoopStep{.kind = LoopStep::Kind::Thread, .axis = order[0]});
    }
  }
  return s.str();
}

// Every kernel `runner` compiles gets its random schedule, drawn from `seed` and the
// kernel's digest (so a kernel seen twice gets the same one), and `log` a line for it.
void schedule_randomly(LocalRunner& runner, uint64_t seed, std::string* log) {
  runner.set_schedules([seed, log](const UOp* kernel) {
    uint64_t h = seed;
    for (uint8_t b : kernel->digest().bytes) h = h * 1099511628211ULL + b;
    std::string s = random_schedule(kernel, h);
    *log += cat("kernel ", kernel->digest().short_hex(), ": \"", s, "\"\n", print_tree(kernel));
    return s;
  });
}

std::optional<uint64_t> env_u64(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::strtoull(v, nullptr, 0);
}

TEST(RandomSchedules, RandomGraphsMatchTheInterpreter) {
  uint64_t base = env_u64("UOPD_RANDOM_BASE").value_or(0x5c4ed000);
  uint64_t count = env_u64("UOPD_RANDOM_COUNT").value_or(300);
  if (auto seed = env_u64("UOPD_RANDOM_SEED")) base = *seed, count = 1;
  RunStats stats;
  int failures = 0;
  for (uint64_t i = 0; i < count && failures < 5; ++i) {
    LocalRunner runner;
    std::string log;
    schedule_randomly(runner, base + i, &log);
    std::string why = check_random_graph(runner, base + i, &stats);
    if (why.empty()) continue;
    ++failures;
    ADD_FAILURE() << "seed " << base + i << " (replay: UOPD_RANDOM_SEED=" << base + i << ")\n" << why << log;
  }
  EXPECT_GT(stats.compiled, static_cast<int>(count)) << "the graphs have kernels to schedule";
  std::printf("[ random   ] %llu graphs with random schedules: %d kernels run, %d compiled\n",
              static_cast<unsigned long long>(count), stats.kernels, stats.compiled);
}

// Shapes of the differential corpus that schedules reshape most: matmuls of odd and
// degenerate sizes, reductions over odd axes (small integers, so any order is exact),
// an elementwise chain over an odd shape; each under several random schedules.
TEST(RandomSchedules, CorpusShapesMatchTheInterpreter) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(cat("schedule seed ", seed));
    Graph g;
    TensorBuilder tb(g);
    Inputs in;
    auto ints = [&](Scalar s, std::vector<int64_t> shape, uint64_t k) {
      const UOp* x = tb.input(s, shape);
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      in[tb.buffer_of(x)] = small_ints(s, {n}, k);
      return x;
    };
    std::vector<const UOp*> outs;
    outs.push_back(tb.matmul(ints(Scalar::Float32, {7, 13}, 1), ints(Scalar::Float32, {13, 9}, 2)));
    outs.push_back(tb.matmul(ints(Scalar::Int32, {1, 5}, 3), ints(Scalar::Int32, {5, 49}, 4)));
    outs.push_back(tb.matmul(ints(Scalar::Float32, {2, 3, 5}, 5), ints(Scalar::Float32, {2, 5, 11}, 6)));
    const UOp* x = ints(Scalar::Float32, {3, 7, 11}, 7);
    outs.push_back(tb.reduce(x, ReduceOp::Add, {1}));
    outs.push_back(tb.reduce(x, ReduceOp::Max, {0, 2}));
    outs.push_back(tb.reduce(ints(Scalar::Int32, {997}, 8), ReduceOp::Min, {0}));
    outs.push_back(tb.alu(Op::MUL, {tb.alu(Op::ADD, {x, x}), x}));
    const UOp* sink = tb.sink(outs);
    LocalRunner runner;
    std::string log;
    schedule_randomly(runner, seed, &log);
    std::string why = check_graph(runner, g, sink, in);
    EXPECT_EQ(why, "") << log;
  }
}

}  // namespace
}  // namespace uop
