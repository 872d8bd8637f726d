// The CUDA device behind WorkerRuntime (`uop-worker --device=cuda:N`): buffers in device
// memory (zeroed on allocation, written and read through synchronous copies from and to
// host memory), programs loaded from cubins, launches one at a time on the device's own
// stream. A kernel that faults leaves the context unusable: from then on every call fails
// with UNAVAILABLE and the owner is told once, so that the worker can exit and be started
// again with a fresh context (the scheduler restarts embedded workers).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "worker/cuda/cuda_context.h"
#include "worker/cuda/cuda_program.h"
#include "worker/device_backend.h"

namespace uop {

struct CudaDeviceOptions {
  int ordinal = 0;
  // Called once, on the thread that hit it, when the context is lost; that call has
  // already been given its error.
  std::function<void(const absl::Status&)> on_context_lost;
};

// One buffer in device memory.
class CudaMemory final : public DeviceMemory {
 public:
  CudaMemory(std::shared_ptr<const CudaContext> ctx, cu::DevicePtr ptr, uint64_t size)
      : ctx_(std::move(ctx)), ptr_(ptr), size_(size) {}
  ~CudaMemory() override;  // cuMemFree, from whichever thread lets go last
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  uint64_t size() const override { return size_; }
  uintptr_t address() const override { return static_cast<uintptr_t>(ptr_); }
  cu::DevicePtr ptr() const { return ptr_; }
  // The context the memory lives in (NCCL binds it and reduces in place).
  const std::shared_ptr<const CudaContext>& context() const { return ctx_; }

 private:
  std::shared_ptr<const CudaContext> ctx_;
  cu::DevicePtr ptr_;
  uint64_t size_;
};

class CudaDevice final : public DeviceBackend {
 public:
  // Retains device `ordinal`'s primary context and makes a stream in it. UNAVAILABLE "no
  // GPU CUDA:<n>: ..." for a device the driver does not have, or when no context can be
  // made on it.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> open(const CudaDriver* driver, CudaDeviceOptions options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const std::string& name() const { return name_; }  // "NVIDIA H200"
  std::string arch() const;                          // "sm_90", from the compute capability
  const GpuLimits& limits() const { return limits_; }
  // cuMemGetInfo: {free, total} bytes of device memory.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> memory_info() const;
  bool context_lost() const { return lost_.load(); }

  // DeviceBackend. info() reports backend "cuda", target arch(), threads 0.
  BackendInfo info() const override;
  absl::StatusOr<std::shared_ptr<DeviceMemory>> allocate(uint64_t bytes) override;
  absl::Status write(DeviceMemory& memory, uint64_t offset, std::string_view data) override;
  // A staging copy of the range in host memory.
  absl::StatusOr<BufferSlice> read(const std::shared_ptr<DeviceMemory>& memory, uint64_t offset,
                                   uint64_t length) override;
  // FAILED_PRECONDITION for an ABI without GPU launch dims (a CPU kernel's).
  absl::StatusOr<std::shared_ptr<const DeviceProgram>> load_program(const std::string& key, std::string_view object,
                                                                   const KernelAbi& abi) override;
  // CUDA kernels do not watch a stop word yet: `stop` is not read, and a launch past its
  // deadline ends with the worker (worker/launch_watchdog.h). A timed launch is timed by
  // events on the device's stream (CudaProgram::launch).
  absl::Status run(const DeviceProgram& program, std::span<DeviceMemory* const> buffers,
                   std::span<const int64_t> vars, const std::atomic<uint32_t>* stop = nullptr,
                   double* device_ms = nullptr) override;

  // Loads a program with a launch shape given outright instead of read from its ABI
  // (tests with hand-written kernels).
  absl::StatusOr<std::shared_ptr<const DeviceProgram>> load_program(const std::string& key, std::string_view cubin,
                                                                   const KernelAbi& abi, GpuLaunchShape shape);

 private:
  CudaDevice(CudaDeviceOptions options, std::shared_ptr<CudaContext> ctx)
      : options_(std::move(options)), ctx_(std::move(ctx)) {}
  // Binds the context, or says the context is lost.
  absl::Status enter() const;
  // A driver error that lost the context: remember it, tell the owner once.
  void lose_context(const absl::Status& why);

  CudaDeviceOptions options_;
  std::shared_ptr<CudaContext> ctx_;
  cu::Stream stream_ = nullptr;
  std::string name_;
  int major_ = 0, minor_ = 0;
  GpuLimits limits_;
  // One launch at a time: a launch and its wait are one step, so an error belongs to the
  // kernel that caused it.
  std::mutex launch_mu_;
  std::atomic<bool> lost_{false};
  mutable std::mutex lost_mu_;
  std::string lost_why_;
};

}  // namespace uop
