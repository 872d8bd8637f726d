// A compiled GPU kernel loaded on one device, and how a launch is shaped. The kernel's ABI
// gives its grid and block as LaunchExprs over its variables (compiler/abi/kernel_abi.h);
// the runtime evaluates them on the launch's values, checks them against the device's
// limits and launches `uop_kernel` with one device pointer per buffer slot (0 for a slot
// the launch leaves empty) followed by the variables as int64, in the ABI's order.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/abi/kernel_abi.h"
#include "worker/cuda/cuda_context.h"
#include "worker/device_backend.h"

namespace uop {

// A GPU kernel's launch shape, from its ABI.
struct GpuLaunchShape {
  std::array<LaunchExpr, 3> grid;   // blocks in the grid, x y z
  std::array<LaunchExpr, 3> block;  // threads in a block, x y z
  int64_t dynamic_shared_bytes = 0;
  std::string str(std::span<const KernelVar> vars = {}) const;  // for messages
};

// What one device lets a launch ask for (cuDeviceGetAttribute); the defaults are every
// GPU's since compute capability 3.0, with the 48 KiB of shared memory any kernel gets.
struct GpuLimits {
  std::array<int64_t, 3> max_grid = {2147483647, 65535, 65535};
  std::array<int64_t, 3> max_block = {1024, 1024, 64};
  int64_t max_threads_per_block = 1024;
  int64_t max_shared_bytes = 48 << 10;
};

struct LaunchDims {
  std::array<uint32_t, 3> grid = {1, 1, 1};
  std::array<uint32_t, 3> block = {1, 1, 1};
  uint32_t shared_bytes = 0;
  bool empty = false;  // an extent came out <= 0: nothing to run
  std::string str() const;  // "grid (4, 1, 1) block (256, 1, 1)"
};

// The launch shape the compiler put in `abi`. FAILED_PRECONDITION when there is none (a
// CPU kernel's ABI).
absl::StatusOr<GpuLaunchShape> gpu_launch_shape(const KernelAbi& abi);

// The shape evaluated on the launch's variable values (in the ABI's order, already
// checked against their bounds). An extent <= 0 gives an empty launch, like a Thread
// range with no iterations on the CPU. INVALID_ARGUMENT, with the expressions and their
// values, for dims past the device's limits.
absl::StatusOr<LaunchDims> eval_launch_dims(const GpuLaunchShape& shape, std::span<const KernelVar> vars,
                                            std::span<const int64_t> values, const GpuLimits& limits);

// cuLaunchKernel's parameter block: one pointer per kernel argument, pointing into
// `values`, which holds the buffers' device addresses by slot, then the variables.
struct KernelArgs {
  std::vector<uint64_t> values;
  std::vector<void*> pointers;
};
KernelArgs pack_kernel_args(std::span<const cu::DevicePtr> buffers, std::span<const int64_t> vars);

class CudaProgram final : public DeviceProgram {
 public:
  static constexpr const char* kEntry = "uop_kernel";

  // cuModuleLoadData + cuModuleGetFunction(kEntry). INVALID_ARGUMENT for an image the
  // device cannot run (not a cubin, built for another arch: CUDA_ERROR_NO_BINARY_FOR_GPU)
  // or without the entry; INVALID_ARGUMENT for more shared memory than the device has.
  // The context must be current on the calling thread.
  static absl::StatusOr<std::unique_ptr<CudaProgram>> load(std::shared_ptr<const CudaContext> ctx, std::string key,
                                                           std::string_view cubin, KernelAbi abi, GpuLaunchShape shape,
                                                           const GpuLimits& limits);
  ~CudaProgram() override;  // cuModuleUnload
  CudaProgram(const CudaProgram&) = delete;
  CudaProgram& operator=(const CudaProgram&) = delete;

  const KernelAbi& abi() const override { return abi_; }
  const std::string& key() const { return key_; }
  const GpuLaunchShape& shape() const { return shape_; }

  // One launch on `stream`, waited for, so that an error belongs to this kernel. The
  // caller checked the arguments (check_launch_args) and made the context current. Errors
  // give the dims and the CUDA error; `context_lost` is set for one that leaves the
  // context unusable (the kernel faulted). `device_ms` (null: not timed): the launch's
  // time between two events recorded around it on `stream`, where the driver has events
  // (otherwise left as it is).
  absl::Status launch(std::span<const cu::DevicePtr> buffers, std::span<const int64_t> vars, cu::Stream stream,
                      const GpuLimits& limits, bool* context_lost, double* device_ms = nullptr) const;

 private:
  CudaProgram(std::shared_ptr<const CudaContext> ctx, std::string key, KernelAbi abi, GpuLaunchShape shape,
              cu::Module module, cu::Function fn)
      : ctx_(std::move(ctx)), key_(std::move(key)), abi_(std::move(abi)), shape_(std::move(shape)),
        module_(module), fn_(fn) {}

  std::shared_ptr<const CudaContext> ctx_;
  std::string key_;
  KernelAbi abi_;
  GpuLaunchShape shape_;
  cu::Module module_;
  cu::Function fn_;
};

}  // namespace uop
