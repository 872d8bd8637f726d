// Host memory and the CPU programs' launches for WorkerRuntime.
#include "worker/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "compiler/support/strings.h"
#include "worker/cpu/cpu_program.h"

namespace uop {
namespace {

constexpr uint64_t kAlign = 64;  // a cache line, and enough for any vector load

}  // namespace

absl::StatusOr<std::shared_ptr<HostMemory>> HostMemory::allocate(uint64_t bytes) {
  if (bytes > UINT64_MAX - kAlign) return absl::ResourceExhaustedError(cat("cannot allocate ", bytes, " bytes"));
  // At least one line, so that even an empty buffer has a real, aligned address.
  uint64_t padded = std::max<uint64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, padded);
  if (!p) return absl::ResourceExhaustedError(cat("cannot allocate ", bytes, " bytes: out of memory"));
  // Zeroed: a buffer never shows what an earlier buffer (maybe another session's) held.
  std::memset(p, 0, padded);
  return std::shared_ptr<HostMemory>(new HostMemory(static_cast<uint8_t*>(p), bytes));
}

HostMemory::~HostMemory() { std::free(data_); }

CpuBackend::CpuBackend(std::string target, int threads)
    : target_(std::move(target)), pool_(threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency())) {}

BackendInfo CpuBackend::info() const { return {"cpu", target_, pool_.size()}; }

absl::StatusOr<std::shared_ptr<DeviceMemory>> CpuBackend::allocate(uint64_t bytes) {
  auto mem = HostMemory::allocate(bytes);
  if (!mem.ok()) return mem.status();
  return std::shared_ptr<DeviceMemory>(*std::move(mem));
}

absl::Status CpuBackend::write(DeviceMemory& memory, uint64_t offset, std::string_view data) {
  if (!data.empty()) std::memcpy(static_cast<HostMemory&>(memory).data() + offset, data.data(), data.size());
  return absl::OkStatus();
}

absl::StatusOr<BufferSlice> CpuBackend::read(const std::shared_ptr<DeviceMemory>& memory, uint64_t offset,
                                             uint64_t length) {
  const uint8_t* base = static_cast<const HostMemory&>(*memory).data();
  return BufferSlice{memory, base + offset, offset, length};
}

absl::StatusOr<std::shared_ptr<const DeviceProgram>> CpuBackend::load_program(const std::string&,
                                                                             std::string_view object,
                                                                             const KernelAbi& abi) {
  auto prog = CpuProgram::load(object, abi);
  if (!prog.ok()) return prog.status();
  return std::shared_ptr<const DeviceProgram>(*std::move(prog));
}

absl::Status CpuBackend::run(const DeviceProgram& program, std::span<DeviceMemory* const> buffers,
                             std::span<const int64_t> vars, const std::atomic<uint32_t>* stop, double*) {
  std::vector<void*> ptrs(buffers.size(), nullptr);
  for (size_t slot = 0; slot < buffers.size(); ++slot)
    if (buffers[slot]) ptrs[slot] = static_cast<HostMemory*>(buffers[slot])->data();
  return static_cast<const CpuProgram&>(program).run(ptrs, vars, &pool_, kSerialBytes, stop);
}

}  // namespace uop
