// Device memory, copies, modules and launches for WorkerRuntime on one GPU.
#include "worker/cuda/cuda_device.h"

#include <algorithm>
#include <new>
#include <vector>

#include "compiler/support/strings.h"

namespace uop {
namespace {

// cuMemAlloc hands out 256-byte aligned blocks; asking in whole blocks lets the zeroing
// cover everything a kernel could see, and gives an empty buffer a real address.
constexpr uint64_t kAllocGranule = 256;

}  // namespace

CudaMemory::~CudaMemory() {
  if (ctx_->bind().ok()) (void)ctx_->driver().api().cuMemFree(ptr_);
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::open(const CudaDriver* driver, CudaDeviceOptions options) {
  auto ctx = CudaContext::retain(driver, options.ordinal);
  if (!ctx.ok()) return ctx.status();
  std::unique_ptr<CudaDevice> d(new CudaDevice(std::move(options), *std::move(ctx)));
  const int n = d->options_.ordinal;
  auto unavailable = [n](const absl::Status& st) {
    return absl::UnavailableError(cat("CUDA:", n, ": ", st.message()));
  };
  if (absl::Status st = d->ctx_->bind(); !st.ok()) return unavailable(st);
  cu::Device dev = d->ctx_->device();
  char name[256] = {};
  if (absl::Status st = UOP_CU(*driver, cuDeviceGetName, name, sizeof name - 1, dev); !st.ok()) return unavailable(st);
  d->name_ = name;
  auto attr = [&](int which, int* out) { return UOP_CU(*driver, cuDeviceGetAttribute, out, which, dev); };
  int v = 0;
  for (auto [which, out] : {std::pair{cu::kAttrComputeCapabilityMajor, &d->major_},
                            std::pair{cu::kAttrComputeCapabilityMinor, &d->minor_}})
    if (absl::Status st = attr(which, out); !st.ok()) return unavailable(st);
  for (int i = 0; i < 3; ++i) {
    if (absl::Status st = attr(cu::kAttrMaxGridDimX + i, &v); !st.ok()) return unavailable(st);
    d->limits_.max_grid[i] = v;
    if (absl::Status st = attr(cu::kAttrMaxBlockDimX + i, &v); !st.ok()) return unavailable(st);
    d->limits_.max_block[i] = v;
  }
  if (absl::Status st = attr(cu::kAttrMaxThreadsPerBlock, &v); !st.ok()) return unavailable(st);
  d->limits_.max_threads_per_block = v;
  if (absl::Status st = attr(cu::kAttrMaxSharedMemoryPerBlockOptin, &v); !st.ok()) return unavailable(st);
  d->limits_.max_shared_bytes = v;
  // A blocking stream: it waits for the synchronous copies on the legacy default stream,
  // so a launch sees every write made before it.
  if (absl::Status st = UOP_CU(*driver, cuStreamCreate, &d->stream_, 0u); !st.ok()) return unavailable(st);
  return d;
}

CudaDevice::~CudaDevice() {
  if (stream_ && ctx_->bind().ok()) (void)ctx_->driver().api().cuStreamDestroy(stream_);
}

std::string CudaDevice::arch() const { return cat("sm_", major_, minor_); }

BackendInfo CudaDevice::info() const { return {"cuda", arch(), 0}; }

absl::Status CudaDevice::enter() const {
  if (lost_.load()) {
    std::lock_guard lock(lost_mu_);
    return absl::UnavailableError(cat("CUDA:", options_.ordinal, ": the CUDA context was lost (", lost_why_,
                                      "); the worker has to start again"));
  }
  return ctx_->bind();
}

void CudaDevice::lose_context(const absl::Status& why) {
  {
    std::lock_guard lock(lost_mu_);
    if (lost_.load()) return;
    lost_why_ = std::string(why.message());
    lost_.store(true);
  }
  if (options_.on_context_lost) options_.on_context_lost(why);
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> CudaDevice::memory_info() const {
  if (absl::Status st = enter(); !st.ok()) return st;
  size_t free = 0, total = 0;
  if (absl::Status st = UOP_CU(ctx_->driver(), cuMemGetInfo, &free, &total); !st.ok()) return st;
  return std::pair<uint64_t, uint64_t>(free, total);
}

absl::StatusOr<std::shared_ptr<DeviceMemory>> CudaDevice::allocate(uint64_t bytes) {
  if (absl::Status st = enter(); !st.ok()) return st;
  if (bytes > UINT64_MAX - kAllocGranule || bytes > SIZE_MAX - kAllocGranule)
    return absl::ResourceExhaustedError(cat("cannot allocate ", bytes, " bytes"));
  uint64_t padded = std::max<uint64_t>(kAllocGranule, (bytes + kAllocGranule - 1) / kAllocGranule * kAllocGranule);
  const CudaDriver& drv = ctx_->driver();
  cu::DevicePtr ptr = 0;
  cu::Result r = drv.api().cuMemAlloc(&ptr, padded);
  if (r != cu::kSuccess) {
    absl::Status st = drv.check(r, "cuMemAlloc");
    if (is_sticky(r)) lose_context(st);
    return absl::Status(st.code(), cat("cannot allocate ", bytes, " bytes: ", st.message()));
  }
  auto mem = std::make_shared<CudaMemory>(ctx_, ptr, bytes);
  // Zeroed: a buffer never shows what an earlier buffer (maybe another session's) held.
  r = drv.api().cuMemsetD8(ptr, 0, padded);
  if (r != cu::kSuccess) {
    absl::Status st = drv.check(r, "cuMemsetD8");
    if (is_sticky(r)) lose_context(st);
    return st;
  }
  return std::shared_ptr<DeviceMemory>(std::move(mem));
}

absl::Status CudaDevice::write(DeviceMemory& memory, uint64_t offset, std::string_view data) {
  if (absl::Status st = enter(); !st.ok()) return st;
  auto& m = static_cast<CudaMemory&>(memory);
  cu::Result r = ctx_->driver().api().cuMemcpyHtoD(m.ptr() + offset, data.data(), data.size());
  if (r == cu::kSuccess) return absl::OkStatus();
  absl::Status st = ctx_->driver().check(r, "cuMemcpyHtoD");
  if (is_sticky(r)) lose_context(st);
  return st;
}

absl::StatusOr<BufferSlice> CudaDevice::read(const std::shared_ptr<DeviceMemory>& memory, uint64_t offset,
                                             uint64_t length) {
  if (absl::Status st = enter(); !st.ok()) return st;
  if (length > SIZE_MAX) return absl::ResourceExhaustedError(cat("cannot stage ", length, " bytes"));
  auto& m = static_cast<const CudaMemory&>(*memory);
  // The staging copy is the slice's memory; the device buffer may be freed meanwhile.
  std::shared_ptr<uint8_t[]> stage(new (std::nothrow) uint8_t[std::max<uint64_t>(length, 1)]);
  if (!stage) return absl::ResourceExhaustedError(cat("cannot stage ", length, " bytes: out of host memory"));
  if (length > 0) {
    cu::Result r = ctx_->driver().api().cuMemcpyDtoH(stage.get(), m.ptr() + offset, length);
    if (r != cu::kSuccess) {
      absl::Status st = ctx_->driver().check(r, "cuMemcpyDtoH");
      if (is_sticky(r)) lose_context(st);
      return st;
    }
  }
  const uint8_t* data = stage.get();
  return BufferSlice{std::shared_ptr<const void>(std::move(stage), data), data, offset, length};
}

absl::StatusOr<std::shared_ptr<const DeviceProgram>> CudaDevice::load_program(const std::string& key,
                                                                              std::string_view object,
                                                                              const KernelAbi& abi) {
  auto shape = gpu_launch_shape(abi);
  if (!shape.ok()) return shape.status();
  return load_program(key, object, abi, *std::move(shape));
}

absl::StatusOr<std::shared_ptr<const DeviceProgram>> CudaDevice::load_program(const std::string& key,
                                                                              std::string_view cubin,
                                                                              const KernelAbi& abi,
                                                                              GpuLaunchShape shape) {
  if (absl::Status st = enter(); !st.ok()) return st;
  auto prog = CudaProgram::load(ctx_, key, cubin, abi, std::move(shape), limits_);
  if (!prog.ok()) return prog.status();
  return std::shared_ptr<const DeviceProgram>(*std::move(prog));
}

absl::Status CudaDevice::run(const DeviceProgram& program, std::span<DeviceMemory* const> buffers,
                             std::span<const int64_t> vars, const std::atomic<uint32_t>*, double* device_ms) {
  const auto& prog = static_cast<const CudaProgram&>(program);
  std::vector<uintptr_t> addresses(buffers.size(), 0);
  std::vector<cu::DevicePtr> ptrs(buffers.size(), 0);
  for (size_t slot = 0; slot < buffers.size(); ++slot) {
    if (!buffers[slot]) continue;
    addresses[slot] = buffers[slot]->address();
    ptrs[slot] = static_cast<const CudaMemory*>(buffers[slot])->ptr();
  }
  if (absl::Status st = check_launch_args(prog.abi(), addresses, vars); !st.ok()) return st;
  std::lock_guard lock(launch_mu_);
  if (absl::Status st = enter(); !st.ok()) return st;
  bool lost = false;
  absl::Status st = prog.launch(ptrs, vars, stream_, limits_, &lost, device_ms);
  if (lost) lose_context(absl::Status(st.code(), cat("kernel ", prog.key(), ": ", st.message())));
  return st;
}

}  // namespace uop
