// End-to-end CPU benchmarks: tensor graphs built with TensorBuilder, planned by the
// pipeline, compiled once by one LocalRunner, then timed on the kernel launches alone
// (CpuProgram::run on preallocated buffers, on the runner's thread pool), against a peer
// measured in the same process: OpenBLAS sgemm for matmul, memcpy for the memory-bound
// kernels. Plus the compile side: a cold in-process compile (lower + LLVM + load) over a
// corpus of small kernels vs a cache hit (load an already compiled object + one run).
// And what the kernels' stop checks cost: each kernel compiled with and without them,
// timed in turns in the same process (BM_StopChecks).
//
// Each peer is measured once per process by a helper and cached in a static, so every
// ratio_vs_<peer> compares two figures from the same run on the same (noisy) machine.
//
// OpenBLAS picks its kernels by CPU model at load time, and an OpenBLAS older than the
// CPU falls back to an older core (the label names the one in use); to compare with its
// best kernels, set OPENBLAS_CORETYPE (e.g. SkylakeX for AVX-512) in the environment.
// UOPD_BENCH_KERNELS=1 prints the cold compile's per-kernel timings to stderr.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/codegen/llvm_cpu.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "local/local_runner.h"
#include "tests/bench/kernel_corpus.h"
#include "worker/cpu/cpu_program.h"

namespace uop {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One runner for the whole process: its pool is what every kernel launch runs on, and
// its program cache is what makes "compiled once, outside the timed loop" true.
LocalRunner& runner() {
  static LocalRunner r;
  return r;
}

// Page-aligned, zeroed host memory. Zeroing touches every page, so no page fault lands
// in a timed launch.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_(bytes) {
    size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    p_ = static_cast<std::byte*>(std::aligned_alloc(4096, rounded));
    if (!p_) std::abort();
    std::memset(p_, 0, rounded);
  }
  ~Buffer() { std::free(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return p_; }
  float* f32() const { return reinterpret_cast<float*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  std::byte* p_;
  size_t bytes_;
};

// Deterministic values in [-1, 1): identical inputs for us and for the peer.
void fill_random(float* p, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
}

// A tensor graph planned and compiled, with every buffer it binds allocated: launch()
// is exactly the kernel launches, in plan order.
class Compiled {
 public:
  // `build` returns the SINK and appends the tensors it made with TensorBuilder::input to
  // `inputs`; those are filled with fill_random, everything else starts zeroed.
  using Build = std::function<const UOp*(TensorBuilder& tb, std::vector<const UOp*>& inputs)>;

  // `options` given: each kernel compiled with them here, not taken from the runner.
  // `other` given: each kernel compiled a second time with those options, on the same
  // buffers (launch(true) runs them): two codes compared on the same memory.
  static absl::StatusOr<std::unique_ptr<Compiled>> make(const Build& build, const CpuCompileOptions* options = nullptr,
                                                        const CpuCompileOptions* other = nullptr) {
    auto c = std::unique_ptr<Compiled>(new Compiled);
    TensorBuilder tb(*c->g_);
    std::vector<const UOp*> inputs;
    const UOp* sink = build(tb, inputs);
    for (const UOp* x : inputs) c->inputs_.push_back(tb.buffer_of(x));
    auto plan = plan_graph(*c->g_, sink);
    if (!plan.ok()) return plan.status();
    c->plan_ = std::move(*plan);
    if (!c->plan_.var_values.empty()) return absl::UnimplementedError("graphs with variables");
    for (const KernelPlan& k : c->plan_.kernels) {
      KernelReport rep;
      auto prog = options ? c->compile(k, *options) : runner().program(*c->g_, k, &rep);
      if (!prog.ok()) return prog.status();
      std::vector<void*> ptrs((*prog)->abi().num_buffers(), nullptr);
      for (const KernelParam& p : (*prog)->abi().params) {
        const UOp* b = k.buffers.at(p.slot);
        auto& buf = c->mem_[b];
        if (!buf) buf = std::make_unique<Buffer>(static_cast<size_t>(p.size) * p.dtype.bytes());
        ptrs[p.slot] = buf->data();
      }
      if (other) {
        auto second = c->compile(k, *other);
        if (!second.ok()) return second.status();
        c->other_launches_.push_back({*second, ptrs});
      }
      c->launches_.push_back({*prog, std::move(ptrs)});
    }
    for (size_t i = 0; i < c->inputs_.size(); ++i) {
      auto it = c->mem_.find(c->inputs_[i]);
      if (it == c->mem_.end()) return absl::InternalError("an input is bound by no kernel");
      if (c->inputs_[i]->dtype() != dtypes::float32) return absl::UnimplementedError("inputs other than float32");
      fill_random(it->second->f32(), it->second->bytes() / sizeof(float), static_cast<uint32_t>(i + 1));
    }
    return c;
  }

  absl::Status launch(bool other = false) const {
    for (const Launch& l : other ? other_launches_ : launches_)
      if (absl::Status s = l.program->run(l.buffers, {}, &runner().pool()); !s.ok()) return s;
    return absl::OkStatus();
  }

  // "k kernel(s), t tasks": how many tasks each launch splits into on the pool (1: the
  // kernel has no Thread range and runs on the calling thread alone).
  std::string shape() const {
    std::string tasks;
    for (const Launch& l : launches_)
      tasks += cat(tasks.empty() ? "" : "+", std::min<int64_t>(l.program->abi().eval_tasks({}), runner().pool().size()));
    return cat(launches_.size(), " kernel(s), ", tasks, " task(s) of ", runner().pool().size(), " threads");
  }
  const float* input(size_t i) const { return mem_.at(inputs_.at(i))->f32(); }
  const float* output(size_t i) const { return mem_.at(plan_.outputs.at(i))->f32(); }

 private:
  Compiled() : g_(std::make_unique<Graph>()) {}
  // As LocalRunner::program compiles, with other options.
  absl::StatusOr<const CpuProgram*> compile(const KernelPlan& k, const CpuCompileOptions& options) {
    auto linear = runner().backend().lower(*g_, k.kernel, {}, k.name);
    if (!linear.ok()) return linear.status();
    auto art = compile_cpu(*linear, runner().target(), options);
    if (!art.ok()) return art.status();
    auto prog = CpuProgram::load(art->object, art->abi);
    if (!prog.ok()) return prog.status();
    owned_.push_back(*std::move(prog));
    return owned_.back().get();
  }
  struct Launch {
    const CpuProgram* program;
    std::vector<void*> buffers;
  };
  std::unique_ptr<Graph> g_;
  GraphPlan plan_;
  std::vector<const UOp*> inputs_;  // their BUFFERs
  absl::flat_hash_map<const UOp*, std::unique_ptr<Buffer>> mem_;
  std::vector<Launch> launches_;
  std::vector<Launch> other_launches_;  // make()'s `other` programs
  std::vector<std::unique_ptr<CpuProgram>> owned_;  // compile()'s
};

// Every rate and ratio below is computed from the best (shortest) call on each side, not
// the mean: on a shared machine other work only ever adds time, so the best call is the
// figure that repeats from run to run, and a neighbour's compile landing in one side's
// window does not skew the ratio. The Time column stays Google Benchmark's mean.

// Seconds of the best call of `fn` after one warm-up call, over at least `min_reps` calls
// and `min_seconds`: the peer side of every ratio.
double time_peer(const std::function<void()>& fn, double min_seconds = 0.5, int min_reps = 5) {
  fn();
  int reps = 0;
  double best = 1e300;
  auto start = Clock::now();
  while (reps < min_reps || seconds_since(start) < min_seconds) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
    ++reps;
  }
  return best;
}

// Peers are measured once per process and key, then reused by every benchmark that
// compares with them.
double cached_peer(const std::string& key, const std::function<double()>& measure) {
  static std::map<std::string, double> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, measure()).first;
  return it->second;
}

// Runs `launch` as the benchmark loop (which holds nothing else) and returns the best
// iteration's seconds, 0 after an error.
template <typename F>
double timed_loop(benchmark::State& state, F&& launch) {
  double best = 1e300;
  for (auto _ : state) {
    auto t0 = Clock::now();
    if (absl::Status s = launch(); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return 0;
    }
    best = std::min(best, seconds_since(t0));
    benchmark::ClobberMemory();
  }
  return best;
}

// ---------------------------------------------------------------------------------------
// Matmul vs OpenBLAS sgemm, both on the pool's thread count.

void skip(benchmark::State& state, const absl::Status& s) { state.SkipWithError(std::string(s.message()).c_str()); }

void BM_Matmul(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto c = Compiled::make([&](TensorBuilder& tb, std::vector<const UOp*>& in) {
    in.push_back(tb.input(Scalar::Float32, {n, n}));
    in.push_back(tb.input(Scalar::Float32, {n, n}));
    return tb.sink({tb.matmul(in[0], in[1])});
  });
  if (!c.ok()) return skip(state, c.status());
  const Compiled& m = **c;
  const int threads = runner().pool().size();
  openblas_set_num_threads(threads);
  Buffer want(sizeof(float) * n * n);
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, m.input(0), n, m.input(1), n, 0.0f,
                want.f32(), n);
  };
  // Ours first: OpenBLAS's threads spin for a while after each call, and would steal a
  // core from our launches if sgemm ran just before them.
  if (absl::Status s = m.launch(); !s.ok()) return skip(state, s);  // warm-up
  const double ours_s = timed_loop(state, [&] { return m.launch(); });
  if (ours_s <= 0) return;
  const double peer_s = cached_peer(cat("sgemm/", n, "/", threads), [&] { return time_peer(sgemm); });
  // A check that we timed a correct matmul: inputs are in [-1, 1), so fp32 rounding
  // differences from summation order stay far below 1e-5 * n.
  sgemm();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let OpenBLAS's threads idle
  for (int64_t i = 0; i < int64_t{n} * n; ++i)
    if (std::fabs(m.output(0)[i] - want.f32()[i]) > 1e-5f * n)
      return skip(state, absl::InternalError(cat("matmul differs from sgemm at ", i, ": ", m.output(0)[i], " vs ", want.f32()[i])));
  const double gflop = 2.0 * n * n * n * 1e-9;
  state.counters["GFLOPS"] = gflop / ours_s;
  state.counters["openblas_GFLOPS"] = gflop / peer_s;
  state.counters["ratio_vs_openblas"] = peer_s / ours_s;
  state.counters["threads"] = threads;
  state.SetLabel(cat(m.shape(), "; openblas core ", openblas_get_corename()));
}
BENCHMARK(BM_Matmul)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---------------------------------------------------------------------------------------
// Memory-bound kernels vs memcpy. The peer copies with the same number of threads as our
// pool (one contiguous chunk per thread), so both sides get the same cores.

constexpr int64_t kStreamElems = int64_t{64} << 20;  // 64 Mi float32 = 256 MiB per tensor

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  ThreadPool& pool = runner().pool();
  const int64_t parts = pool.size();
  const size_t chunk = (bytes / parts + 63) / 64 * 64;
  pool.parallel_for(parts, [&](int64_t t) {
    size_t lo = std::min(bytes, chunk * t), hi = std::min(bytes, lo + chunk);
    std::memcpy(static_cast<std::byte*>(dst) + lo, static_cast<const std::byte*>(src) + lo, hi - lo);
  });
}

// Best seconds of a memcpy of `bytes` (a fresh source and destination, both touched first).
double memcpy_seconds(size_t bytes) {
  return cached_peer(cat("memcpy/", bytes), [&] {
    Buffer src(bytes), dst(bytes);
    std::memset(src.data(), 1, bytes);
    return time_peer([&] { parallel_memcpy(dst.data(), src.data(), bytes); });
  });
}

// c = a + 1.5 * b: reads 2 x 4 bytes and writes 4 bytes per element, 12 bytes in all.
// The peer moves the same 12 bytes per element: a memcpy of 6 bytes per element (768 MiB
// of reads + writes in all, like ours), so ratio_vs_memcpy is our share of the bandwidth
// a copy gets. glibc's memcpy uses non-temporal stores at this size, which skip the read
// for ownership that ordinary stores pay; our kernel's stores are ordinary.
void BM_Elementwise(benchmark::State& state) {
  auto c = Compiled::make([&](TensorBuilder& tb, std::vector<const UOp*>& in) {
    in.push_back(tb.input(Scalar::Float32, {kStreamElems}));
    in.push_back(tb.input(Scalar::Float32, {kStreamElems}));
    return tb.sink({tb.alu(Op::ADD, {in[0], tb.alu(Op::MUL, {tb.full(Scalar::Float32, 1.5, {}), in[1]})})});
  });
  if (!c.ok()) return skip(state, c.status());
  const Compiled& m = **c;
  if (absl::Status s = m.launch(); !s.ok()) return skip(state, s);
  for (int64_t i = 0; i < kStreamElems; i += 4093) {
    float want = m.input(0)[i] + 1.5f * m.input(1)[i];
    if (std::fabs(m.output(0)[i] - want) > 1e-6f)
      return skip(state, absl::InternalError(cat("c[", i, "] = ", m.output(0)[i], ", want ", want)));
  }
  const double bytes = 12.0 * kStreamElems;
  const double peer_s = memcpy_seconds(static_cast<size_t>(bytes / 2));
  const double ours_s = timed_loop(state, [&] { return m.launch(); });
  if (ours_s <= 0) return;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["GB_per_s"] = bytes / ours_s * 1e-9;
  state.counters["memcpy_GB_per_s"] = bytes / peer_s * 1e-9;
  state.counters["ratio_vs_memcpy"] = peer_s / ours_s;
  state.SetLabel(m.shape());
}
BENCHMARK(BM_Elementwise)->Unit(benchmark::kMillisecond)->UseRealTime();

// sum(x) over 64 Mi float32: 256 MiB read. The peer's figure is memcpy's read bandwidth,
// the 256 MiB source of a memcpy of the same size / its time (memcpy also writes, so
// this is a peer a pure read can beat: a ratio above 1 is possible).
void BM_SumReduction(benchmark::State& state) {
  auto c = Compiled::make([&](TensorBuilder& tb, std::vector<const UOp*>& in) {
    in.push_back(tb.input(Scalar::Float32, {kStreamElems}));
    return tb.sink({tb.reduce(in[0], ReduceOp::Add, {0})});
  });
  if (!c.ok()) return skip(state, c.status());
  const Compiled& m = **c;
  if (absl::Status s = m.launch(); !s.ok()) return skip(state, s);
  double want = 0, magnitude = 0;
  for (int64_t i = 0; i < kStreamElems; ++i) {
    want += m.input(0)[i];
    magnitude += std::fabs(m.input(0)[i]);
  }
  // fp32 summation in any order stays well inside 1e-5 of the sum of magnitudes here;
  // a kernel that skipped part of the input would not.
  if (std::fabs(m.output(0)[0] - want) > 1e-5 * magnitude)
    return skip(state, absl::InternalError(cat("sum = ", m.output(0)[0], ", want ", want)));
  const double bytes = 4.0 * kStreamElems;
  const double peer_s = memcpy_seconds(static_cast<size_t>(bytes));
  const double ours_s = timed_loop(state, [&] { return m.launch(); });
  if (ours_s <= 0) return;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["GB_per_s"] = bytes / ours_s * 1e-9;
  state.counters["memcpy_read_GB_per_s"] = bytes / peer_s * 1e-9;
  state.counters["ratio_vs_memcpy"] = peer_s / ours_s;
  state.SetLabel(m.shape());
}
BENCHMARK(BM_SumReduction)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---------------------------------------------------------------------------------------
// The stop checks' cost (compiler/codegen/stop_checks.h): matmul 512, the elementwise
// and the sum kernels above, each compiled with checks (as always) and without, launched
// in turns, best call of each. ratio_checked_vs_unchecked below 1 is what the checks
// cost; at or above 1 they cost nothing measurable.

void BM_StopChecks(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  Compiled::Build build = [which](TensorBuilder& tb, std::vector<const UOp*>& in) {
    if (which == 0) {
      in.push_back(tb.input(Scalar::Float32, {512, 512}));
      in.push_back(tb.input(Scalar::Float32, {512, 512}));
      return tb.sink({tb.matmul(in[0], in[1])});
    }
    if (which == 1) {
      in.push_back(tb.input(Scalar::Float32, {kStreamElems}));
      in.push_back(tb.input(Scalar::Float32, {kStreamElems}));
      return tb.sink({tb.alu(Op::ADD, {in[0], tb.alu(Op::MUL, {tb.full(Scalar::Float32, 1.5, {}), in[1]})})});
    }
    in.push_back(tb.input(Scalar::Float32, {kStreamElems}));
    return tb.sink({tb.reduce(in[0], ReduceOp::Add, {0})});
  };
  // One memory for both: buffer placement (huge pages, cache sets) is not what is measured.
  const CpuCompileOptions checked_opts, unchecked_opts{.stop_checks = false};
  auto both = Compiled::make(build, &checked_opts, &unchecked_opts);
  if (!both.ok()) return skip(state, both.status());
  const Compiled& c = **both;
  for (bool unchecked : {false, true})  // warm-up
    if (absl::Status s = c.launch(unchecked); !s.ok()) return skip(state, s);
  double best_checked = 1e300, best_unchecked = 1e300;
  auto timed = [&](bool unchecked, double* best) -> absl::Status {
    auto t0 = Clock::now();
    absl::Status s = c.launch(unchecked);
    *best = std::min(*best, seconds_since(t0));
    return s;
  };
  bool checked_first = true;  // alternated: neither side always runs on the other's warm caches
  for (auto _ : state) {
    absl::Status s = timed(!checked_first, checked_first ? &best_checked : &best_unchecked);
    if (s.ok()) s = timed(checked_first, checked_first ? &best_unchecked : &best_checked);
    if (!s.ok()) return skip(state, s);
    checked_first = !checked_first;
    state.SetIterationTime(best_checked);
  }
  // The two agree: checks change when a kernel may stop, not what it computes.
  const size_t n = which == 1 ? static_cast<size_t>(kStreamElems) : which == 0 ? 512 * 512 : 1;
  if (absl::Status s = c.launch(false); !s.ok()) return skip(state, s);
  std::vector<float> checked_out(c.output(0), c.output(0) + n);
  if (absl::Status s = c.launch(true); !s.ok()) return skip(state, s);
  for (size_t i = 0; i < n; i += 997)
    if (checked_out[i] != c.output(0)[i])
      return skip(state, absl::InternalError(cat("output ", i, " differs with and without stop checks")));
  state.counters["checked_ms"] = best_checked * 1e3;
  state.counters["unchecked_ms"] = best_unchecked * 1e3;
  state.counters["ratio_checked_vs_unchecked"] = best_unchecked / best_checked;
  state.SetLabel(cat(which == 0 ? "matmul 512" : which == 1 ? "elementwise" : "sum", "; ", c.shape()));
}
BENCHMARK(BM_StopChecks)->Arg(0)->Arg(1)->Arg(2)->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------
// Cold compile vs cache hit over the corpus of small kernels (kernel_corpus.h).

// One kernel of the corpus through the cold path, in milliseconds.
struct ColdTimes {
  std::string name;
  double lower_ms = 0, llvm_ms = 0, load_ms = 0;
  double total_ms() const { return lower_ms + llvm_ms + load_ms; }
};
struct Artifact {
  std::string name, object;
  KernelAbi abi;
};

// One cold pass over the corpus: each graph is built in a fresh Graph and planned
// (untimed: the planner and its cache are the scheduler's, not the compile path's), then
// each kernel not met earlier in the pass is lowered (the CPU backend), compiled
// (compile_cpu) and loaded (CpuProgram::load), each step timed. Fresh graphs keep one
// pass's interned nodes from making the next pass's lowering cheaper. Kernels come back
// in the same order every pass. `keep` receives the compiled objects.
absl::StatusOr<std::vector<ColdTimes>> cold_pass(std::vector<Artifact>* keep = nullptr) {
  std::vector<ColdTimes> out;
  absl::flat_hash_set<Digest> seen;
  for (const CorpusGraph& cg : kernel_corpus()) {
    Graph g;
    TensorBuilder tb(g);
    auto plan = plan_graph(g, cg.build(tb));
    if (!plan.ok()) return absl::Status(plan.status().code(), cat(cg.name, ": ", plan.status().message()));
    for (const KernelPlan& kp : plan->kernels) {
      if (!seen.insert(kp.kernel->digest()).second) continue;
      ColdTimes t{cat(cg.name, "/", kp.name)};
      auto t0 = Clock::now();  // as LocalRunner::program lowers for its target
      auto linear = runner().backend().lower(g, kp.kernel, {}, kp.name);
      t.lower_ms = seconds_since(t0) * 1e3;
      if (!linear.ok()) return absl::Status(linear.status().code(), cat(t.name, ": ", linear.status().message()));
      t0 = Clock::now();
      auto art = compile_cpu(*linear, runner().target());
      t.llvm_ms = seconds_since(t0) * 1e3;
      if (!art.ok()) return absl::Status(art.status().code(), cat(t.name, ": ", art.status().message()));
      t0 = Clock::now();
      auto prog = CpuProgram::load(art->object, art->abi);
      t.load_ms = seconds_since(t0) * 1e3;
      if (!prog.ok()) return absl::Status(prog.status().code(), cat(t.name, ": ", prog.status().message()));
      if (keep) keep->push_back({t.name, std::move(art->object), art->abi});
      out.push_back(std::move(t));
    }
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
// Nearest-rank percentile.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// Per-kernel medians of the cold path's total, from BM_ColdCompilePipeline, or measured
// here (3 passes) when that benchmark was filtered out.
std::vector<double>& cold_medians_ms() {
  static std::vector<double> m;
  return m;
}

void BM_ColdCompilePipeline(benchmark::State& state) {
  std::vector<std::vector<ColdTimes>> passes;
  for (auto _ : state) {
    auto pass = cold_pass();
    if (!pass.ok()) return skip(state, pass.status());
    double total = 0;
    for (const ColdTimes& t : *pass) total += t.total_ms();
    state.SetIterationTime(total * 1e-3);
    passes.push_back(std::move(*pass));
  }
  const size_t n = passes.front().size();
  // The per-kernel median of each step and of the total over the passes.
  std::vector<double> total(n), lower(n), llvm(n), load(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> t, lo, ll, ld;
    for (const auto& p : passes) {
      t.push_back(p[i].total_ms());
      lo.push_back(p[i].lower_ms);
      ll.push_back(p[i].llvm_ms);
      ld.push_back(p[i].load_ms);
    }
    total[i] = median(t);
    lower[i] = median(lo);
    llvm[i] = median(ll);
    load[i] = median(ld);
  }
  cold_medians_ms() = total;
  // Which kernels cost what, for whoever works on the compile path; off by default to
  // keep the benchmark's output a table.
  if (std::getenv("UOPD_BENCH_KERNELS"))
    for (size_t i = 0; i < n; ++i)
      std::fprintf(stderr, "cold %-36s total %8.3f ms  lower %7.3f  llvm %8.3f  load %6.3f\n",
                   passes.front()[i].name.c_str(), total[i], lower[i], llvm[i], load[i]);
  size_t slowest = std::max_element(total.begin(), total.end()) - total.begin();
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));  // kernels/s
  state.counters["kernels"] = static_cast<double>(n);
  state.counters["median_ms"] = median(total);
  state.counters["p90_ms"] = percentile(total, 0.9);
  state.counters["lower_median_ms"] = median(lower);
  state.counters["llvm_median_ms"] = median(llvm);
  state.counters["load_median_ms"] = median(load);
  state.SetLabel(cat("slowest ", passes.front()[slowest].name, " ", total[slowest], " ms"));
}
BENCHMARK(BM_ColdCompilePipeline)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

// A cache hit as a CPU worker sees it: the object is already compiled; load it and run it
// once on preallocated zeroed buffers. Per-kernel medians over the iterations, each
// iteration one pass over the corpus.
void BM_CacheHitLoad(benchmark::State& state) {
  std::vector<Artifact> arts;
  if (auto pass = cold_pass(&arts); !pass.ok()) return skip(state, pass.status());
  if (cold_medians_ms().empty()) {
    std::vector<std::vector<double>> runs(arts.size());
    for (int r = 0; r < 3; ++r) {
      auto pass = cold_pass();
      if (!pass.ok()) return skip(state, pass.status());
      for (size_t i = 0; i < arts.size(); ++i) runs[i].push_back((*pass)[i].total_ms());
    }
    for (auto& r : runs) cold_medians_ms().push_back(median(r));
  }
  std::vector<std::vector<std::unique_ptr<Buffer>>> mem(arts.size());
  std::vector<std::vector<void*>> ptrs(arts.size());
  for (size_t i = 0; i < arts.size(); ++i) {
    ptrs[i].assign(arts[i].abi.num_buffers(), nullptr);
    for (const KernelParam& p : arts[i].abi.params) {
      mem[i].push_back(std::make_unique<Buffer>(static_cast<size_t>(p.size) * p.dtype.bytes()));
      ptrs[i][p.slot] = mem[i].back()->data();
    }
  }
  std::vector<std::vector<double>> hit_ms(arts.size());
  for (auto _ : state) {
    double total = 0;
    for (size_t i = 0; i < arts.size(); ++i) {
      auto t0 = Clock::now();
      auto prog = CpuProgram::load(arts[i].object, arts[i].abi);
      if (!prog.ok()) return skip(state, prog.status());
      if (absl::Status s = (*prog)->run(ptrs[i], {}, &runner().pool()); !s.ok()) return skip(state, s);
      double ms = seconds_since(t0) * 1e3;
      hit_ms[i].push_back(ms);
      total += ms;
      // Unloading is left out of the timing: a worker keeps what it loads.
    }
    state.SetIterationTime(total * 1e-3);
  }
  std::vector<double> per_kernel;
  for (auto& h : hit_ms) per_kernel.push_back(median(h));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * arts.size()));
  state.counters["kernels"] = static_cast<double>(arts.size());
  state.counters["median_ms"] = median(per_kernel);
  state.counters["p90_ms"] = percentile(per_kernel, 0.9);
  state.counters["cold_median_ms"] = median(cold_medians_ms());
  state.counters["ratio_vs_cold_compile"] = median(cold_medians_ms()) / median(per_kernel);
}
BENCHMARK(BM_CacheHitLoad)->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace uop

BENCHMARK_MAIN();
