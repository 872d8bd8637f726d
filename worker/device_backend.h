// What a device runtime gives WorkerRuntime (STYLE §10): memory, a way in and out of it,
// loaded programs and one launch at a time. WorkerRuntime keeps everything that is the
// same on every device (buffers by id, the byte budget, programs by key, the launch
// checks against the kernel's ABI, the order of launches); a backend (worker/cpu,
// worker/cuda) only moves bytes and runs code. The scheduler never includes this.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/abi/kernel_abi.h"

namespace uop {

// A range of a buffer's bytes in host memory, for reading: either the buffer's own memory
// (cpu) or a staging copy (cuda). `holder` keeps those bytes alive, so a buffer freed
// while it is read stays readable until the slice goes.
struct BufferSlice {
  std::shared_ptr<const void> holder;
  const uint8_t* data = nullptr;  // the slice's first byte
  uint64_t offset = 0;            // where the slice starts in the buffer
  uint64_t length = 0;
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data), static_cast<size_t>(length)}; }
};

// One buffer's memory on the device; freed when the last reference goes (a launch in
// progress holds one).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual uint64_t size() const = 0;
  // Where the first byte is in the device's address space (what a kernel gets).
  virtual uintptr_t address() const = 0;
};

// A program loaded on the device.
class DeviceProgram {
 public:
  virtual ~DeviceProgram() = default;
  virtual const KernelAbi& abi() const = 0;
};

struct BackendInfo {
  std::string backend;  // "cpu", "cuda"
  std::string target;   // the target programs must be compiled for: a CPU target id, "sm_90"
  int threads = 0;      // cpu: the kernel thread pool
};

// Thread-safe. A backend is handed back only the memory and programs it made.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual BackendInfo info() const = 0;

  // `bytes` of zeroed memory (a buffer never shows what an earlier one held).
  // RESOURCE_EXHAUSTED when the device has no room.
  virtual absl::StatusOr<std::shared_ptr<DeviceMemory>> allocate(uint64_t bytes) = 0;
  // [offset, offset + size) is inside the memory (the runtime checked).
  virtual absl::Status write(DeviceMemory& memory, uint64_t offset, std::string_view data) = 0;
  virtual absl::StatusOr<BufferSlice> read(const std::shared_ptr<DeviceMemory>& memory, uint64_t offset,
                                           uint64_t length) = 0;

  // INVALID_ARGUMENT for an object the device cannot load. `key` names it in messages.
  virtual absl::StatusOr<std::shared_ptr<const DeviceProgram>> load_program(const std::string& key,
                                                                           std::string_view object,
                                                                           const KernelAbi& abi) = 0;
  // One launch, finished when this returns. `buffers[slot]` is null for a slot the launch
  // leaves empty; every other one holds at least what the ABI says (the runtime checked).
  // The backend checks the variables against the ABI's bounds and that no written buffer
  // overlaps another one. Errors name nothing of the launch: the runtime adds that.
  // `stop` (null: none) is the launch's stop word (compiler/abi/kernel_abi.h), set by the
  // runtime when the launch must end: a backend whose kernels watch it hands it to them;
  // one whose kernels cannot is ended with its process (worker/launch_watchdog.h).
  // `device_ms` (null: the launch is not timed): a backend with a timer of its own (CUDA
  // events) writes the launch's device time there; one without leaves it, and the
  // runtime's clock around run() is the launch's time.
  virtual absl::Status run(const DeviceProgram& program, std::span<DeviceMemory* const> buffers,
                           std::span<const int64_t> vars, const std::atomic<uint32_t>* stop = nullptr,
                           double* device_ms = nullptr) = 0;
};

// The checks every backend makes before a launch, given each slot's device address (0
// for none): as many buffers and variables as the ABI says, every variable inside its
// bounds, no missing or misaligned buffer, and no written buffer overlapping another one
// (the kernel assumes distinct buffers). INVALID_ARGUMENT saying which.
absl::Status check_launch_args(const KernelAbi& abi, std::span<const uintptr_t> addresses,
                               std::span<const int64_t> vars);

}  // namespace uop
