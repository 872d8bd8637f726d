// Loading a cubin as a module, shaping a launch from the ABI's LaunchExprs and launching.
// Each launch is waited for: a kernel that faults then names itself, and a launch's
// buffers are known to be free of it when the call returns.
#include "worker/cuda/cuda_program.h"

#include <cstring>

#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr const char* kAxes[3] = {"x", "y", "z"};
constexpr int64_t kDefaultSharedBytes = 48 << 10;  // what a kernel gets without asking

}  // namespace

std::string GpuLaunchShape::str(std::span<const KernelVar> vars) const {
  auto three = [&](const std::array<LaunchExpr, 3>& e) {
    return cat("(", e[0].str(vars), ", ", e[1].str(vars), ", ", e[2].str(vars), ")");
  };
  return cat("grid ", three(grid), " block ", three(block));
}

std::string LaunchDims::str() const {
  return cat("grid (", grid[0], ", ", grid[1], ", ", grid[2], ") block (", block[0], ", ", block[1], ", ", block[2],
             ")", shared_bytes ? cat(" shared ", shared_bytes) : std::string());
}

absl::StatusOr<GpuLaunchShape> gpu_launch_shape(const KernelAbi& abi) {
  if (!abi.gpu)
    return absl::FailedPreconditionError("the kernel's ABI has no GPU launch dims (grid / block): not a CUDA kernel");
  const GpuLaunch& g = *abi.gpu;
  // The expressions may only name the ABI's variables (parse_abi checks this for the
  // text form; an ABI built in memory is checked here, before any launch evaluates it).
  auto check = [&](const LaunchExpr& e, std::string_view what, int axis) -> absl::Status {
    for (const LaunchExpr::Term& t : e.terms())
      if (t.kind == LaunchExpr::Term::Kind::Var && (t.value < 0 || static_cast<size_t>(t.value) >= abi.vars.size()))
        return absl::InvalidArgumentError(cat("the kernel's ", what, " ", kAxes[axis], " extent names variable ", t.value,
                                              "; the ABI has ", abi.vars.size()));
    return absl::OkStatus();
  };
  for (int i = 0; i < 3; ++i) {
    if (absl::Status st = check(g.grid[i], "grid", i); !st.ok()) return st;
    if (absl::Status st = check(g.block[i], "block", i); !st.ok()) return st;
  }
  if (g.dynamic_shared_bytes < 0)
    return absl::InvalidArgumentError(cat("the kernel asks for ", g.dynamic_shared_bytes, " bytes of dynamic shared memory"));
  GpuLaunchShape s;
  s.grid = g.grid;
  s.block = g.block;
  s.dynamic_shared_bytes = g.dynamic_shared_bytes;
  return s;
}

absl::StatusOr<LaunchDims> eval_launch_dims(const GpuLaunchShape& shape, std::span<const KernelVar> vars,
                                            std::span<const int64_t> values, const GpuLimits& limits) {
  LaunchDims d;
  int64_t grid[3], block[3];
  for (int i = 0; i < 3; ++i) {
    grid[i] = shape.grid[i].eval(values);
    block[i] = shape.block[i].eval(values);
    if (grid[i] <= 0 || block[i] <= 0) d.empty = true;
  }
  if (d.empty) return d;
  auto past = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        cat("launch dims grid (", grid[0], ", ", grid[1], ", ", grid[2], ") block (", block[0], ", ", block[1], ", ",
            block[2], ") from ", shape.str(vars), ": ", what));
  };
  int64_t threads = 1;
  for (int i = 0; i < 3; ++i) {
    if (grid[i] > limits.max_grid[i])
      return past(cat("grid ", kAxes[i], " is past the device's ", limits.max_grid[i]));
    if (block[i] > limits.max_block[i])
      return past(cat("block ", kAxes[i], " is past the device's ", limits.max_block[i]));
    threads *= block[i];  // each factor <= 1024: no overflow
  }
  if (threads > limits.max_threads_per_block)
    return past(cat(threads, " threads in a block, the device allows ", limits.max_threads_per_block));
  if (shape.dynamic_shared_bytes < 0 || shape.dynamic_shared_bytes > limits.max_shared_bytes)
    return past(cat(shape.dynamic_shared_bytes, " bytes of shared memory, the device allows ", limits.max_shared_bytes));
  for (int i = 0; i < 3; ++i) {
    d.grid[i] = static_cast<uint32_t>(grid[i]);
    d.block[i] = static_cast<uint32_t>(block[i]);
  }
  d.shared_bytes = static_cast<uint32_t>(shape.dynamic_shared_bytes);
  return d;
}

KernelArgs pack_kernel_args(std::span<const cu::DevicePtr> buffers, std::span<const int64_t> vars) {
  KernelArgs a;
  a.values.reserve(buffers.size() + vars.size());
  for (cu::DevicePtr p : buffers) a.values.push_back(p);
  for (int64_t v : vars) a.values.push_back(static_cast<uint64_t>(v));
  // Pointers into `values` only once it stops growing.
  for (uint64_t& v : a.values) a.pointers.push_back(&v);
  return a;
}

absl::StatusOr<std::unique_ptr<CudaProgram>> CudaProgram::load(std::shared_ptr<const CudaContext> ctx, std::string key,
                                                               std::string_view cubin, KernelAbi abi,
                                                               GpuLaunchShape shape, const GpuLimits& limits) {
  if (cubin.empty()) return absl::InvalidArgumentError("an empty CUDA image");
  if (shape.dynamic_shared_bytes < 0 || shape.dynamic_shared_bytes > limits.max_shared_bytes)
    return absl::InvalidArgumentError(cat("the kernel asks for ", shape.dynamic_shared_bytes,
                                          " bytes of shared memory, the device has ", limits.max_shared_bytes));
  const CudaDriver& drv = ctx->driver();
  // The driver reads an ELF image through aligned loads, and PTX text up to a NUL: give
  // it an 8-byte aligned copy with a NUL after it.
  std::vector<uint64_t> image(cubin.size() / 8 + 1, 0);
  std::memcpy(image.data(), cubin.data(), cubin.size());
  cu::Module module = nullptr;
  if (absl::Status st = UOP_CU(drv, cuModuleLoadData, &module, image.data()); !st.ok()) return st;
  cu::Function fn = nullptr;
  absl::Status st = UOP_CU(drv, cuModuleGetFunction, &fn, module, kEntry);
  if (st.ok() && shape.dynamic_shared_bytes > kDefaultSharedBytes)
    st = UOP_CU(drv, cuFuncSetAttribute, fn, cu::kFuncAttrMaxDynamicSharedSizeBytes,
                static_cast<int>(shape.dynamic_shared_bytes));
  if (!st.ok()) {
    (void)drv.api().cuModuleUnload(module);
    return absl::Status(st.code(), cat("entry ", kEntry, ": ", st.message()));
  }
  return std::unique_ptr<CudaProgram>(
      new CudaProgram(std::move(ctx), std::move(key), std::move(abi), std::move(shape), module, fn));
}

CudaProgram::~CudaProgram() {
  // Unloading needs the context current on this thread, which may be any thread.
  if (ctx_->bind().ok()) (void)ctx_->driver().api().cuModuleUnload(module_);
}

absl::Status CudaProgram::launch(std::span<const cu::DevicePtr> buffers, std::span<const int64_t> vars,
                                 cu::Stream stream, const GpuLimits& limits, bool* context_lost,
                                 double* device_ms) const {
  *context_lost = false;
  auto dims = eval_launch_dims(shape_, abi_.vars, vars, limits);
  if (!dims.ok()) return dims.status();
  if (dims->empty) {
    if (device_ms) *device_ms = 0;
    return absl::OkStatus();
  }
  KernelArgs args = pack_kernel_args(buffers, vars);
  const CudaDriver& drv = ctx_->driver();
  const CudaApi& api = drv.api();
  // A pair of events around the launch when it is timed: the device's time, without the
  // launch overhead and the host's wait. An event that cannot be made only costs the timer.
  cu::Event events[2] = {nullptr, nullptr};
  bool timed = device_ms && api.has_events() && api.cuEventCreate(&events[0], 0) == cu::kSuccess;
  if (timed && api.cuEventCreate(&events[1], 0) != cu::kSuccess) {
    (void)api.cuEventDestroy(events[0]);
    timed = false;
  }
  if (timed && api.cuEventRecord(events[0], stream) != cu::kSuccess) timed = false;
  cu::Result r = api.cuLaunchKernel(fn_, dims->grid[0], dims->grid[1], dims->grid[2], dims->block[0], dims->block[1],
                                    dims->block[2], dims->shared_bytes, stream, args.pointers.data(), nullptr);
  std::string_view where = "cuLaunchKernel";
  if (r == cu::kSuccess && timed && api.cuEventRecord(events[1], stream) != cu::kSuccess) timed = false;
  if (r == cu::kSuccess) {
    r = api.cuStreamSynchronize(stream);
    where = "cuStreamSynchronize";
  }
  if (events[0]) {
    float ms = 0;
    if (r == cu::kSuccess && timed && api.cuEventSynchronize(events[1]) == cu::kSuccess &&
        api.cuEventElapsedTime(&ms, events[0], events[1]) == cu::kSuccess)
      *device_ms = ms;
    (void)api.cuEventDestroy(events[0]);
    (void)api.cuEventDestroy(events[1]);
  }
  if (r == cu::kSuccess) return absl::OkStatus();
  *context_lost = is_sticky(r);
  absl::Status st = drv.check(r, where);
  return absl::Status(st.code(), cat(*context_lost ? "the kernel faulted, " : "", dims->str(), ": ", st.message(),
                                     *context_lost ? "; the CUDA context is lost" : ""));
}

}  // namespace uop
