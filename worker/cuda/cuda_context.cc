// Retaining, binding and releasing a device's primary context.
#include "worker/cuda/cuda_context.h"

#include <atomic>

#include "compiler/support/strings.h"

namespace uop {
namespace {

// Which CudaContext this thread made current last (by serial, not by handle: a primary
// context released and retained again may come back under the same handle, needing a bind).
thread_local uint64_t bound_here = 0;
std::atomic<uint64_t> next_serial{1};

}  // namespace

absl::StatusOr<std::shared_ptr<CudaContext>> CudaContext::retain(const CudaDriver* driver, int ordinal) {
  if (ordinal < 0 || ordinal >= driver->device_count())
    return absl::UnavailableError(cat("no GPU CUDA:", ordinal, ": the CUDA driver sees ", driver->device_count(),
                                      driver->device_count() == 1 ? " device" : " devices"));
  cu::Device device = 0;
  if (absl::Status st = UOP_CU(*driver, cuDeviceGet, &device, ordinal); !st.ok())
    return absl::UnavailableError(cat("no GPU CUDA:", ordinal, ": ", st.message()));
  cu::Context ctx = nullptr;
  // The primary context is the one the runtime API and other libraries (NCCL) share.
  if (absl::Status st = UOP_CU(*driver, cuDevicePrimaryCtxRetain, &ctx, device); !st.ok())
    return absl::UnavailableError(cat("CUDA:", ordinal, ": cannot create a context: ", st.message()));
  return std::shared_ptr<CudaContext>(new CudaContext(driver, ordinal, device, ctx, next_serial.fetch_add(1)));
}

CudaContext::~CudaContext() {
  (void)driver_->api().cuDevicePrimaryCtxRelease(device_);
}

absl::Status CudaContext::bind() const {
  if (bound_here == serial_) return absl::OkStatus();
  if (absl::Status st = UOP_CU(*driver_, cuCtxSetCurrent, ctx_); !st.ok()) return st;
  bound_here = serial_;
  return absl::OkStatus();
}

}  // namespace uop
