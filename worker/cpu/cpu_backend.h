// The CPU device behind WorkerRuntime: buffers are 64-byte aligned host memory, programs
// are relocatable objects linked in-process (CpuProgram), launches run on a thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/cpu/thread_pool.h"
#include "worker/device_backend.h"

namespace uop {

// One buffer's memory: at least one 64-byte line, zeroed.
class HostMemory final : public DeviceMemory {
 public:
  static absl::StatusOr<std::shared_ptr<HostMemory>> allocate(uint64_t bytes);
  ~HostMemory() override;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t size() const override { return size_; }
  uintptr_t address() const override { return reinterpret_cast<uintptr_t>(data_); }

 private:
  HostMemory(uint8_t* d, uint64_t n) : data_(d), size_(n) {}
  uint8_t* data_;
  uint64_t size_;
};

class CpuBackend final : public DeviceBackend {
 public:
  // `target`: the CPU target id Info reports. threads <= 0: the hardware threads.
  CpuBackend(std::string target, int threads);

  BackendInfo info() const override;
  absl::StatusOr<std::shared_ptr<DeviceMemory>> allocate(uint64_t bytes) override;
  absl::Status write(DeviceMemory& memory, uint64_t offset, std::string_view data) override;
  // The buffer's own bytes, no copy.
  absl::StatusOr<BufferSlice> read(const std::shared_ptr<DeviceMemory>& memory, uint64_t offset,
                                   uint64_t length) override;
  absl::StatusOr<std::shared_ptr<const DeviceProgram>> load_program(const std::string& key, std::string_view object,
                                                                   const KernelAbi& abi) override;
  // A kernel whose buffers hold under kSerialBytes together runs on the calling thread:
  // waking the pool costs more than its work (microseconds on an idle machine, far more
  // when the worker shares its cores), and small kernels are what a latency-bound cached
  // Run launches. Larger ones split their Thread range over the pool. No timer of its own:
  // `device_ms` is left to the runtime's clock.
  absl::Status run(const DeviceProgram& program, std::span<DeviceMemory* const> buffers,
                   std::span<const int64_t> vars, const std::atomic<uint32_t>* stop = nullptr,
                   double* device_ms = nullptr) override;
  static constexpr uint64_t kSerialBytes = 64 << 10;

 private:
  std::string target_;
  ThreadPool pool_;
};

}  // namespace uop
