// bench_cuda: the CUDA backend's kernels on a GPU against the peers measured in the same
// run (docs/ARCHITECTURE.md, Testing): fp16 and fp32 matmul TFLOPS against cuBLAS (cublasGemmEx with fp32
// accumulation, cublasSgemm without TF32), counter ratio_vs_cublas; elementwise and
// sum-reduction GB/s against a device-to-device cuMemcpyDtoD of the same bytes, counter
// ratio_vs_memcpy. Our kernels go the way the service runs them: plan_graph,
// the CUDA backend's lowering, NVRTC for the device's arch, loaded through CudaDevice::load_program
// (launch dims from the ABI) and launched by CudaDevice::run (one launch, then a wait).
// The peers are timed the same way (call, then a stream synchronize). The GEMMs also run
// with each shared-memory tile given as a schedule (BM_MatmulF32/tile(...),
// BM_MatmulF16/tc_tile(...), and tc(4) without shared memory); the label names the
// schedule each kernel was lowered with.
//
// cuBLAS is loaded with dlopen (libcublas.so.13, libcublas.so, /usr/local/cuda/lib64/...):
// no build dependency. Without a GPU, a driver, NVRTC or cuBLAS, each benchmark skips
// with the reason.
#include <dlfcn.h>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/codegen/cuda.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/backends/cuda/cuda_backend.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/cuda_driver.h"

namespace uop {
namespace {

// --- the GPU, once per process ------------------------------------------------------------

struct Gpu {
  const CudaDriver* driver = nullptr;  // the process's, never freed
  std::unique_ptr<CudaDevice> dev;
  CudaTarget target;
  absl::Status status;  // why there is none
};

Gpu& gpu() {
  static Gpu* g = [] {
    auto* g = new Gpu;
    if (absl::Status nv = nvrtc_status(); !nv.ok()) {
      g->status = absl::Status(nv.code(), cat("no NVRTC: ", nv.message()));
      return g;
    }
    auto d = CudaDriver::load();
    if (!d.ok()) {
      g->status = d.status();
      return g;
    }
    g->driver = *d;
    auto dev = CudaDevice::open(g->driver, {});
    if (!dev.ok()) {
      g->status = dev.status();
      return g;
    }
    g->dev = *std::move(dev);
    auto t = CudaTarget::parse(g->dev->arch());
    if (!t.ok()) {
      g->status = t.status();
      return g;
    }
    g->target = *t;
    return g;
  }();
  return *g;
}

void skip(benchmark::State& state, const absl::Status& why) { state.SkipWithError(std::string(why.message()).c_str()); }

// --- cuBLAS through dlopen -----------------------------------------------------------------

using cublasHandle = void*;
constexpr int kOpN = 0;             // CUBLAS_OP_N
constexpr int kR16F = 2;            // CUDA_R_16F
constexpr int kR32F = 0;            // CUDA_R_32F
constexpr int kCompute32F = 68;     // CUBLAS_COMPUTE_32F
constexpr int kGemmDefault = -1;    // CUBLAS_GEMM_DEFAULT
constexpr int kDefaultMath = 0;     // CUBLAS_DEFAULT_MATH: no TF32 for Sgemm

struct Cublas {
  void* lib = nullptr;
  cublasHandle handle = nullptr;
  int (*create)(cublasHandle*) = nullptr;
  int (*set_math_mode)(cublasHandle, int) = nullptr;
  int (*sgemm)(cublasHandle, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*,
               float*, int) = nullptr;
  int (*gemm_ex)(cublasHandle, int, int, int, int, int, const void*, const void*, int, int, const void*, int, int,
                 const void*, void*, int, int, int, int) = nullptr;
  std::string library;
  absl::Status status;
};

Cublas& cublas() {
  static Cublas* c = [] {
    auto* c = new Cublas;
    std::string errors;
    for (const char* path : {"libcublas.so.13", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13",
                             "/usr/local/cuda/lib64/libcublas.so", "libcublas.so.12"}) {
      c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (c->lib) {
        c->library = path;
        break;
      }
      const char* e = dlerror();
      errors = e ? e : path;
    }
    if (!c->lib) {
      c->status = absl::UnavailableError(cat("no cuBLAS: dlopen: ", errors));
      return c;
    }
    c->create = reinterpret_cast<decltype(c->create)>(dlsym(c->lib, "cublasCreate_v2"));
    c->set_math_mode = reinterpret_cast<decltype(c->set_math_mode)>(dlsym(c->lib, "cublasSetMathMode"));
    c->sgemm = reinterpret_cast<decltype(c->sgemm)>(dlsym(c->lib, "cublasSgemm_v2"));
    c->gemm_ex = reinterpret_cast<decltype(c->gemm_ex)>(dlsym(c->lib, "cublasGemmEx"));
    if (!c->create || !c->sgemm || !c->gemm_ex) {
      c->status = absl::UnavailableError(cat("no cuBLAS: ", c->library, " lacks cublasCreate_v2 / cublasSgemm_v2 / cublasGemmEx"));
      return c;
    }
    // cuBLAS uses the device's primary context, the one CudaDevice retained: bind it first.
    if (int rc = c->create(&c->handle); rc != 0) {
      c->status = absl::UnavailableError(cat("cublasCreate failed: status ", rc));
      return c;
    }
    if (c->set_math_mode) c->set_math_mode(c->handle, kDefaultMath);
    return c;
  }();
  return *c;
}

// --- a graph compiled by us, in device memory ----------------------------------------------

// The graph's kernels compiled for the GPU, its buffers allocated and filled with small
// random values; launch() runs every kernel once, in order.
struct Compiled {
  Graph g;
  std::vector<std::shared_ptr<const DeviceProgram>> programs;
  std::vector<std::vector<DeviceMemory*>> args;
  std::vector<std::vector<int64_t>> vars;
  absl::flat_hash_map<const UOp*, std::shared_ptr<DeviceMemory>> memory;
  std::string dims;  // the launch dims, for the label
  absl::Status status;

  absl::Status launch() {
    for (size_t i = 0; i < programs.size(); ++i)
      if (absl::Status s = gpu().dev->run(*programs[i], args[i], vars[i]); !s.ok()) return s;
    return absl::OkStatus();
  }
};

// Random values in [-1, 1) in `dtype` (float32 or float16).
std::string random_bytes(Scalar dtype, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::string out(static_cast<size_t>(n) * scalar_bytes(dtype), '\0');
  for (int64_t i = 0; i < n; ++i) {
    float f = u(rng);
    if (dtype == Scalar::Float16) {
      // Round to float16 through its bits (values are small and normal enough here).
      uint32_t b;
      std::memcpy(&b, &f, 4);
      uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff, man = b & 0x7fffff;
      uint16_t h = 0;
      if (exp > 112) h = static_cast<uint16_t>(sign | ((exp - 112) << 10) | (man >> 13));
      else h = static_cast<uint16_t>(sign);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &f, 4);
    }
  }
  return out;
}

// `schedule`: the loop schedule every kernel is lowered with ("" the heuristic's); the
// label (dims) names the one each kernel got.
std::unique_ptr<Compiled> compile_graph(const std::function<const UOp*(TensorBuilder&)>& build,
                                        std::string_view schedule = {}) {
  auto c = std::make_unique<Compiled>();
  Gpu& G = gpu();
  TensorBuilder tb(c->g);
  const UOp* root = build(tb);
  auto plan = plan_graph(c->g, root);
  if (!plan.ok()) {
    c->status = plan.status();
    return c;
  }
  absl::flat_hash_map<std::string, int64_t> var_by_name;
  for (auto& [v, value] : plan->var_values) var_by_name[v->arg_as<DefineVarArg>().name] = value;
  uint64_t seed = 1;
  for (const ScheduleStep& st : plan->steps) {
    if (st.kind != ScheduleStep::Kind::Kernel) {
      c->status = absl::UnimplementedError("bench_cuda: single-device graphs only");
      return c;
    }
    const KernelPlan& k = plan->kernels[st.index];
    PipelineOptions opts;
    opts.schedule = std::string(schedule);
    std::string applied;
    opts.applied_schedule = &applied;
    auto linear = CudaBackend(G.target).lower(c->g, k.kernel, opts, k.name);
    if (!linear.ok()) {
      c->status = linear.status();
      return c;
    }
    auto art = compile_cuda(*linear, G.target, CudaCompileOptions{.emit_ptx = false});
    if (!art.ok()) {
      c->status = art.status();
      return c;
    }
    // What the worker does with a LoadProgram: the launch shape from the ABI.
    auto prog = G.dev->load_program(cat("bench-", k.kernel->digest().short_hex()), art->cubin, art->abi);
    if (!prog.ok()) {
      c->status = prog.status();
      return c;
    }
    std::vector<DeviceMemory*> bufs(art->abi.num_buffers(), nullptr);
    for (const KernelParam& p : art->abi.params) {
      const UOp* b = k.buffers.at(p.slot);
      auto it = c->memory.find(b);
      if (it == c->memory.end()) {
        uint64_t bytes = static_cast<uint64_t>(p.size) * p.dtype.bytes();
        auto m = G.dev->allocate(bytes);
        if (!m.ok()) {
          c->status = m.status();
          return c;
        }
        if (p.read && (p.dtype.scalar == Scalar::Float32 || p.dtype.scalar == Scalar::Float16) && p.dtype.count == 1) {
          if (absl::Status s = G.dev->write(**m, 0, random_bytes(p.dtype.scalar, p.size, seed++)); !s.ok()) {
            c->status = s;
            return c;
          }
        }
        it = c->memory.emplace(b, *m).first;
      }
      bufs[p.slot] = it->second.get();
    }
    std::vector<int64_t> vars;
    for (const KernelVar& v : art->abi.vars) vars.push_back(var_by_name.at(v.name));
    auto shape = gpu_launch_shape(art->abi);
    auto dims = shape.ok() ? eval_launch_dims(*shape, art->abi.vars, vars, G.dev->limits())
                           : absl::StatusOr<LaunchDims>(shape.status());
    c->dims += cat(c->dims.empty() ? "" : "; ", dims.ok() ? dims->str() : std::string(dims.status().message()),
                   applied.empty() ? "" : cat(" ", applied));
    c->programs.push_back(*prog);
    c->args.push_back(std::move(bufs));
    c->vars.push_back(std::move(vars));
  }
  // One launch to warm up (module load, first-touch), and to fail here rather than timed.
  c->status = c->launch();
  return c;
}

// Seconds per call of `body`, best of a few rounds (for the peers' counters).
template <typename F>
absl::StatusOr<double> best_seconds(F&& body, int rounds = 20) {
  if (absl::Status s = body(); !s.ok()) return s;  // warm-up
  double best = 1e30;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = body(); !s.ok()) return s;
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

absl::Status sync_default_stream() {
  // The legacy default stream (cuBLAS's and cuMemcpyDtoD's here); CudaDevice's own stream
  // is a blocking one, so this also orders after its launches.
  return gpu().driver->check(gpu().driver->api().cuStreamSynchronize(nullptr), "cuStreamSynchronize");
}

// --- matmul vs cuBLAS ----------------------------------------------------------------------

// `schedule`: the matmul kernel's loop schedule ("" the heuristic's: tensor cores for
// float16 on sm_80+, shared-memory GEMM tiles for float32), so one run compares tiles.
void BM_Matmul(benchmark::State& state, Scalar dtype, std::string schedule) {
  Gpu& G = gpu();
  if (!G.status.ok()) return skip(state, G.status);
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  auto c = compile_graph(
      [&](TensorBuilder& tb) {
        const UOp* a = tb.input(dtype, {n, k});
        const UOp* b = tb.input(dtype, {k, m});
        return tb.sink({tb.matmul(a, b)});
      },
      schedule);
  if (!c->status.ok()) return skip(state, c->status);
  // Ours, timed by the framework: best-case per-iteration time feeds the counters too.
  double ours_best = 1e30;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s = c->launch();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) return skip(state, s);
    ours_best = std::min(ours_best, secs);
    state.SetIterationTime(secs);
  }
  const double flops = 2.0 * n * k * m;
  state.counters["TFLOPS"] = benchmark::Counter(flops * state.iterations() / 1e12, benchmark::Counter::kIsRate);
  state.counters["TFLOPS_best"] = flops / ours_best / 1e12;

  // cuBLAS on buffers of the same sizes: row-major C = A B is column-major C^T = B^T A^T.
  Cublas& cb = cublas();
  if (!cb.status.ok()) {
    state.SetLabel(cat(c->dims, "; ", cb.status.message()));
    return;
  }
  const uint64_t es = scalar_bytes(dtype);
  auto A = G.dev->allocate(n * k * es), B = G.dev->allocate(k * m * es), C = G.dev->allocate(n * m * es);
  if (!A.ok() || !B.ok() || !C.ok()) return skip(state, !A.ok() ? A.status() : !B.ok() ? B.status() : C.status());
  (void)G.dev->write(**A, 0, random_bytes(dtype, n * k, 101));
  (void)G.dev->write(**B, 0, random_bytes(dtype, k * m, 102));
  auto pa = reinterpret_cast<const void*>((*A)->address()), pb = reinterpret_cast<const void*>((*B)->address());
  auto pc = reinterpret_cast<void*>((*C)->address());
  const float alpha = 1.f, beta = 0.f;
  const int N = static_cast<int>(n), K = static_cast<int>(k), M = static_cast<int>(m);
  auto call = [&]() -> absl::Status {
    int rc = dtype == Scalar::Float16
                 ? cb.gemm_ex(cb.handle, kOpN, kOpN, M, N, K, &alpha, pb, kR16F, M, pa, kR16F, K, &beta, pc, kR16F, M,
                              kCompute32F, kGemmDefault)
                 : cb.sgemm(cb.handle, kOpN, kOpN, M, N, K, &alpha, static_cast<const float*>(pb), M,
                            static_cast<const float*>(pa), K, &beta, static_cast<float*>(pc), M);
    if (rc != 0) return absl::InternalError(cat(dtype == Scalar::Float16 ? "cublasGemmEx" : "cublasSgemm", ": status ", rc));
    return sync_default_stream();
  };
  auto peer = best_seconds(call);
  if (!peer.ok()) {
    state.SetLabel(cat(c->dims, "; cuBLAS: ", peer.status().message()));
    return;
  }
  state.counters["cublas_TFLOPS"] = flops / *peer / 1e12;
  state.counters["ratio_vs_cublas"] = *peer / ours_best;  // > 1: ours is faster
  state.SetLabel(c->dims);
}

// --- bandwidth vs cuMemcpyDtoD -------------------------------------------------------------

// `bytes_moved` bytes of traffic per launch of the graph, against a device-to-device copy
// moving as many (a copy of bytes_moved / 2: it reads and writes each byte).
void bandwidth(benchmark::State& state, std::unique_ptr<Compiled> c, double bytes_moved) {
  Gpu& G = gpu();
  if (!c->status.ok()) return skip(state, c->status);
  double ours_best = 1e30;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s = c->launch();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) return skip(state, s);
    ours_best = std::min(ours_best, secs);
    state.SetIterationTime(secs);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes_moved * state.iterations()));
  state.counters["GBps_best"] = bytes_moved / ours_best / 1e9;
  const uint64_t copy = static_cast<uint64_t>(bytes_moved / 2);
  auto src = G.dev->allocate(copy), dst = G.dev->allocate(copy);
  if (!src.ok() || !dst.ok()) return skip(state, !src.ok() ? src.status() : dst.status());
  const CudaDriver& drv = *G.driver;
  auto peer = best_seconds([&]() -> absl::Status {
    cu::Result r = drv.api().cuMemcpyDtoD((*dst)->address(), (*src)->address(), copy);
    if (r != cu::kSuccess) return drv.check(r, "cuMemcpyDtoD");
    return sync_default_stream();
  });
  if (!peer.ok()) return skip(state, peer.status());
  state.counters["memcpy_GBps"] = bytes_moved / *peer / 1e9;
  state.counters["ratio_vs_memcpy"] = *peer / ours_best;  // our GB/s over the copy's
  state.SetLabel(c->dims);
}

void BM_Elementwise(benchmark::State& state) {
  if (!gpu().status.ok()) return skip(state, gpu().status);
  const int64_t n = state.range(0);
  // c = a * b + a: two reads, one write of float32.
  auto c = compile_graph([&](TensorBuilder& tb) {
    const UOp* a = tb.input(Scalar::Float32, {n});
    const UOp* b = tb.input(Scalar::Float32, {n});
    return tb.sink({tb.alu(Op::ADD, {tb.alu(Op::MUL, {a, b}), a})});
  });
  bandwidth(state, std::move(c), 3.0 * 4 * n);
}

void BM_Sum(benchmark::State& state) {
  if (!gpu().status.ok()) return skip(state, gpu().status);
  const int64_t rows = state.range(0), cols = state.range(1);
  // Row sums: one read of the matrix (the rows' sums are a rounding error of the traffic).
  auto c = compile_graph([&](TensorBuilder& tb) {
    const UOp* a = tb.input(Scalar::Float32, {rows, cols});
    return tb.sink({tb.reduce(a, ReduceOp::Add, {1})});
  });
  bandwidth(state, std::move(c), 4.0 * rows * cols + 4.0 * rows);
}

}  // namespace
}  // namespace uop

int main(int argc, char** argv) {
  using uop::Scalar;
  for (int64_t s : {1024, 4096}) {
    benchmark::RegisterBenchmark("BM_MatmulF16", uop::BM_Matmul, Scalar::Float16, std::string())
        ->Args({s, s, s})->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_MatmulF32", uop::BM_Matmul, Scalar::Float32, std::string())
        ->Args({s, s, s})->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  // The GEMM tiles the heuristic chooses among, each given as a schedule (a search's
  // starting points), on the large fp32 case.
  for (const char* tile : {"tile(128,128,8,8,8)", "tile(64,64,8,4,4)", "tile(128,64,8,8,4)", "tile(64,128,16,4,8)"})
    benchmark::RegisterBenchmark(uop::cat("BM_MatmulF32/", tile).c_str(), uop::BM_Matmul, Scalar::Float32,
                                 std::string(tile))
        ->Args({4096, 4096, 4096})->UseManualTime()->Unit(benchmark::kMillisecond);
  // The tensor cores fed from shared memory (the heuristic's and a smaller block) and
  // without (one warp per 16 x 8 tile, fragments read from global memory).
  for (const char* tile : {"tc_tile(128,128,32,64,32)", "tc_tile(64,64,32,32,32)", "tc(4)"})
    benchmark::RegisterBenchmark(uop::cat("BM_MatmulF16/", tile).c_str(), uop::BM_Matmul, Scalar::Float16,
                                 std::string(tile))
        ->Args({4096, 4096, 4096})->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_Elementwise", uop::BM_Elementwise)
      ->Arg(int64_t{1} << 24)->Arg(int64_t{1} << 26)->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_Sum", uop::BM_Sum)
      ->Args({4096, 4096})->Args({16384, 4096})->UseManualTime()->Unit(benchmark::kMicrosecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
