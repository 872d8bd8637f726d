// Benchmarks of the rewrite engine: how fast the graph hash-conses nodes, and how fast
// graph_rewrite runs the symbolic rules over large index expressions. Items are nodes.
#include <benchmark/benchmark.h>

#include <vector>

#include "compiler/ir/uop.h"
#include "compiler/passes/symbolic.h"
#include "compiler/ir/value_range.h"
#include "compiler/rewrite/graph_rewrite.h"

namespace uop {
namespace {

std::vector<const UOp*> make_vars(Graph& g, int n) {
  std::vector<const UOp*> vars;
  for (int i = 0; i < n; ++i)
    vars.push_back(g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"v" + std::to_string(i), 0, 64 + i}));
  return vars;
}

// make() calls per second on a stream where most nodes already exist: 3 calls per step,
// over 16 variables and 64 constants, so roughly one call in a hundred makes a new node.
void BM_HashConsing(benchmark::State& state) {
  const int64_t n = state.range(0);
  size_t unique = 0;
  for (auto _ : state) {
    Graph g;
    auto vars = make_vars(g, 16);
    for (int64_t i = 0; i < n; ++i) {
      const UOp* k = g.idx(i % 64);
      const UOp* m = g.alu(Op::MUL, {vars[i % 16], k});
      benchmark::DoNotOptimize(g.alu(Op::ADD, {m, vars[(i * 7) % 16]}));
    }
    unique = g.size();
  }
  state.SetItemsProcessed(state.iterations() * n * 3);
  state.counters["unique_nodes"] = static_cast<double>(unique);
}
BENCHMARK(BM_HashConsing)->Arg(1 << 16)->Arg(1 << 20);

// Index expressions as rangeify leaves them: a flattened index over four ranges, unflattened
// again by div and mod, plus constant offsets. `count` of them, each with its own constants
// so that they do not all hash-cons into one, under a SINK.
const UOp* index_soup(Graph& g, int count) {
  std::vector<const UOp*> outs;
  for (int i = 0; i < count; ++i) {
    int64_t d1 = 2 + i % 5, d2 = 3 + i % 4, d3 = 4 + i % 3;
    auto rng = [&](int64_t axis, int64_t end) {
      return g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{axis, AxisType::Loop});
    };
    const UOp *r0 = rng(0, 8 + i), *r1 = rng(1, d1), *r2 = rng(2, d2), *r3 = rng(3, d3);
    auto mul = [&](const UOp* a, int64_t k) { return g.alu(Op::MUL, {a, g.idx(k)}); };
    auto add = [&](const UOp* a, const UOp* b) { return g.alu(Op::ADD, {a, b}); };
    // ((r0*d1 + r1)*d2 + r2)*d3 + r3 + 0*i
    const UOp* flat = add(mul(add(mul(add(mul(r0, d1), r1), d2), r2), d3), add(r3, mul(g.idx(i), 0)));
    const UOp* inner = g.alu(Op::MOD, {g.alu(Op::IDIV, {flat, g.idx(d3)}), g.idx(d2)});  // = r2
    const UOp* outer = g.alu(Op::IDIV, {flat, g.idx(d2 * d3)});                          // = r0*d1 + r1
    const UOp* back = add(mul(g.alu(Op::IDIV, {flat, g.idx(d3)}), d3), g.alu(Op::MOD, {flat, g.idx(d3)}));  // = flat
    outs.push_back(add(add(inner, mul(outer, 1)), g.alu(Op::SUB, {back, g.idx(i % 11)})));
  }
  return g.make(Op::SINK, dtypes::void_, outs);
}

void BM_SymbolicIndexSoup(benchmark::State& state) {
  const int count = static_cast<int>(state.range(0));
  size_t nodes = 0, after = 0;
  for (auto _ : state) {
    state.PauseTiming();
    Graph g;
    const UOp* root = index_soup(g, count);
    nodes = toposort(root).size();
    state.ResumeTiming();
    auto r = simplify(g, root);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
    benchmark::DoNotOptimize(*r);
    state.PauseTiming();
    after = toposort(*r).size();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * nodes));
  state.counters["nodes_in"] = static_cast<double>(nodes);
  state.counters["nodes_out"] = static_cast<double>(after);
}
BENCHMARK(BM_SymbolicIndexSoup)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond);

// One deep chain: ((x + 1) * 1 + 1) * 1 ... folds to x + depth.
void BM_SymbolicDeepChain(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(0));
  for (auto _ : state) {
    state.PauseTiming();
    Graph g;
    const UOp* e = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"x", 0, 100});
    for (int i = 0; i < depth; ++i) e = g.alu(Op::MUL, {g.alu(Op::ADD, {e, g.idx(1)}), g.idx(1)});
    state.ResumeTiming();
    auto r = simplify(g, e);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
    benchmark::DoNotOptimize(*r);
  }
  state.SetItemsProcessed(state.iterations() * int64_t{depth} * 2);
}
BENCHMARK(BM_SymbolicDeepChain)->Arg(100'000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace uop

BENCHMARK_MAIN();
