// One GPU's primary context, shared by the device and by every buffer and module made in
// it, so that it outlives them all whichever goes last. Driver calls act on the calling
// thread's current context and gRPC runs each call on a thread of its own, so every entry
// point binds the context first (cheap: once per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/cuda/cuda_driver.h"

namespace uop {

class CudaContext {
 public:
  // cuDeviceGet + cuDevicePrimaryCtxRetain for device `ordinal`. UNAVAILABLE "no GPU
  // CUDA:<n>: ..." for an ordinal the driver does not have.
  static absl::StatusOr<std::shared_ptr<CudaContext>> retain(const CudaDriver* driver, int ordinal);
  ~CudaContext();  // cuDevicePrimaryCtxRelease
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // Makes the context current on the calling thread.
  absl::Status bind() const;

  const CudaDriver& driver() const { return *driver_; }
  cu::Device device() const { return device_; }
  int ordinal() const { return ordinal_; }

 private:
  CudaContext(const CudaDriver* driver, int ordinal, cu::Device device, cu::Context ctx, uint64_t serial)
      : driver_(driver), ordinal_(ordinal), device_(device), ctx_(ctx), serial_(serial) {}

  const CudaDriver* driver_;
  int ordinal_;
  cu::Device device_;
  cu::Context ctx_;
  uint64_t serial_;
};

}  // namespace uop
