// The LLVM CPU backend's two paths: a cold compile (LINEAR -> ELF object, what a cache
// miss costs) and a cache hit on a worker (load the cached object with ORC, run it once).
// ratio_vs_cold_compile on BM_LoadAndRun is how many load+runs fit in one cold compile.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "compiler/codegen/llvm_cpu.h"
#include "compiler/ir/uop.h"
#include "worker/cpu/cpu_program.h"

namespace uop {
namespace {

// A LINEAR built by hand: each op made once and listed in the order it is made.
struct Linear {
  Graph g;
  std::vector<const UOp*> ops;
  const UOp* add(const UOp* u) {
    if (std::find(ops.begin(), ops.end(), u) == ops.end()) ops.push_back(u);
    return u;
  }
  const UOp* param(int64_t slot, int64_t size) {
    return add(g.make(Op::PARAM, dtypes::float32.ptr_to(AddrSpace::Global, size), {}, ParamArg{slot, size}));
  }
  const UOp* range(const UOp* end, int64_t axis, AxisType t) {
    return add(g.make(Op::RANGE, dtypes::index, {end}, RangeArg{axis, t, true}));
  }
  const UOp* index(const UOp* buf, const UOp* i) { return add(g.make(Op::INDEX, dtypes::float32, {buf, i})); }
  const UOp* load(const UOp* buf, const UOp* idx) { return add(g.make(Op::LOAD, dtypes::float32, {buf, idx})); }
  const UOp* store(const UOp* idx, const UOp* v) { return add(g.make(Op::STORE, dtypes::void_, {idx, v})); }
  const UOp* end(const UOp* x, const UOp* r) { return add(g.make(Op::END, dtypes::void_, {x, r})); }
  const UOp* alu(Op op, std::initializer_list<const UOp*> s) { return add(g.alu(op, s)); }
  const UOp* linear() { return g.make(Op::LINEAR, dtypes::void_, ops); }
};

constexpr int64_t kRows = 256, kCols = 256;

// out[i] = a[i] * b[i] + a[i] over kRows * kCols elements, rows split over tasks.
const UOp* elementwise(Linear& l) {
  const UOp* out = l.param(0, kRows * kCols);
  const UOp* a = l.param(1, kRows * kCols);
  const UOp* b = l.param(2, kRows * kCols);
  const UOp* r = l.range(l.add(l.g.idx(kRows * kCols)), 0, AxisType::Thread);
  const UOp* x = l.load(a, l.index(a, r));
  const UOp* y = l.load(b, l.index(b, r));
  l.end(l.store(l.index(out, r), l.alu(Op::ADD, {l.alu(Op::MUL, {x, y}), x})), r);
  return l.linear();
}

// out[i] = sum_j a[i * kCols + j], the accumulator a DEFINE_REG ordered with AFTER.
const UOp* reduction(Linear& l) {
  const UOp* out = l.param(0, kRows);
  const UOp* a = l.param(1, kRows * kCols);
  const UOp* acc = l.add(l.g.make(Op::DEFINE_REG, dtypes::float32.ptr_to(AddrSpace::Reg, 1), {}, DefineRegArg{1, 0}));
  const UOp* zero = l.add(l.g.idx(0));
  const UOp* row = l.range(l.add(l.g.idx(kRows)), 0, AxisType::Thread);
  const UOp* init = l.store(l.add(l.g.make(Op::INDEX, dtypes::float32, {acc, zero})), l.add(l.g.cnst(dtypes::float32, 0.0)));
  const UOp* k = l.range(l.add(l.g.idx(kCols)), 1, AxisType::Reduce);
  const UOp* acc_in = l.add(l.g.make(Op::INDEX, dtypes::float32, {l.add(l.g.make(Op::AFTER, acc->dtype(), {acc, init, k})), zero}));
  const UOp* x = l.load(a, l.index(a, l.alu(Op::ADD, {l.alu(Op::MUL, {row, l.add(l.g.idx(kCols))}), k})));
  const UOp* done = l.end(l.store(acc_in, l.alu(Op::ADD, {l.load(acc, acc_in), x})), k);
  const UOp* acc_out = l.add(l.g.make(Op::INDEX, dtypes::float32, {l.add(l.g.make(Op::AFTER, acc->dtype(), {acc, done})), zero}));
  l.end(l.store(l.index(out, row), l.load(acc, acc_out)), row);
  return l.linear();
}

const UOp* kernel(Linear& l, int64_t which) { return which == 0 ? elementwise(l) : reduction(l); }

void BM_ColdCompile(benchmark::State& state) {
  Linear l;
  const UOp* linear = kernel(l, state.range(0));
  const CpuTarget target = CpuTarget::host();
  double render = 0, compile = 0;
  for (auto _ : state) {
    auto art = compile_cpu(linear, target);
    if (!art.ok()) {
      state.SkipWithError(std::string(art.status().message()).c_str());
      return;
    }
    render += art->render_ms;
    compile += art->compile_ms;
    benchmark::DoNotOptimize(art->object.data());
  }
  state.SetLabel(state.range(0) == 0 ? "elementwise" : "reduction");
  state.counters["render_ms"] = benchmark::Counter(render / state.iterations());
  state.counters["optimize_emit_ms"] = benchmark::Counter(compile / state.iterations());
}
BENCHMARK(BM_ColdCompile)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_LoadAndRun(benchmark::State& state) {
  Linear l;
  const UOp* linear = kernel(l, state.range(0));
  auto t0 = std::chrono::steady_clock::now();
  auto art = compile_cpu(linear, CpuTarget::host());
  double cold_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!art.ok()) {
    state.SkipWithError(std::string(art.status().message()).c_str());
    return;
  }
  std::vector<float> out(kRows * kCols), a(kRows * kCols, 1.5f), b(kRows * kCols, 2.0f);
  std::vector<void*> bufs = {out.data(), a.data()};
  if (state.range(0) == 0) bufs.push_back(b.data());
  ThreadPool pool(1);
  auto t1 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    auto prog = CpuProgram::load(art->object, art->abi);
    if (!prog.ok() || !(*prog)->run(bufs, {}, &pool).ok()) {
      state.SkipWithError("load or run failed");
      return;
    }
    benchmark::ClobberMemory();
  }
  double hit_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count() / state.iterations();
  state.SetLabel(state.range(0) == 0 ? "elementwise" : "reduction");
  state.counters["cold_compile_ms"] = benchmark::Counter(cold_ms);
  state.counters["ratio_vs_cold_compile"] = benchmark::Counter(cold_ms / hit_ms);
}
BENCHMARK(BM_LoadAndRun)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace uop

BENCHMARK_MAIN();
