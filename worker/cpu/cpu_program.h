// A compiled CPU kernel loaded into this process and ready to run. load() links the
// relocatable object from compiler/codegen/llvm_cpu with LLVM's ORC JIT linker: one
// ExecutionSession for the whole process, one JITDylib per program (so every program can
// define `uop_kernel`), C library symbols (libm) resolved from the process. Destroying
// the program removes its JITDylib and frees its code. LLVM-free header.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/abi/kernel_abi.h"
#include "worker/cpu/thread_pool.h"
#include "worker/device_backend.h"

namespace uop {

class CpuProgram final : public DeviceProgram {
 public:
  // INVALID_ARGUMENT if the object does not link (not an object, undefined symbols, no
  // `uop_kernel`); INTERNAL if the JIT itself cannot start. Thread-safe.
  static absl::StatusOr<std::unique_ptr<CpuProgram>> load(std::string_view object, const KernelAbi& abi);
  // Makes the process's JIT now, as the first load() would: before a sandbox, so that
  // nothing the JIT sets up once happens under it. INTERNAL if it cannot start.
  static absl::Status start_jit();
  ~CpuProgram() override;
  CpuProgram(const CpuProgram&) = delete;
  CpuProgram& operator=(const CpuProgram&) = delete;

  // One launch. `buffers[slot]` must point at the param's `size` elements (the caller's
  // buffer table knows their sizes; this cannot check them). INVALID_ARGUMENT for a wrong
  // number of buffers or vars, a var outside its bounds, a null or misaligned buffer,
  // or a written buffer that overlaps another one (the kernel assumes distinct buffers). The Thread
  // range's `tasks` iterations are split over min(tasks, pool size) tasks on `pool`
  // (or one task on the calling thread without a pool, or when the kernel's buffers
  // total under `serial_below` bytes). `stop` is the launch's stop word (abi/kernel_abi.h), shared
  // by its tasks; null: a word that is never set. A kernel stopped by it returns early;
  // whoever set it knows the launch failed. Thread-safe.
  absl::Status run(std::span<void* const> buffers, std::span<const int64_t> vars, ThreadPool* pool,
                   uint64_t serial_below = 0, const std::atomic<uint32_t>* stop = nullptr) const;

  const KernelAbi& abi() const override { return abi_; }

 private:
  // A kernel of an ABI without a stop word takes the first four only; the fifth is
  // then an unused argument register (the SysV calling convention allows it).
  using KernelFn = void (*)(void* const* buffers, const int64_t* vars, int64_t task, int64_t ntasks,
                            const uint32_t* stop);
  struct Code;  // the JITDylib holding the linked object
  CpuProgram(KernelAbi abi, std::unique_ptr<Code> code, KernelFn fn);
  absl::Status check(std::span<void* const> buffers, std::span<const int64_t> vars) const;

  KernelAbi abi_;
  uint64_t buffer_bytes_ = 0;  // what the ABI's params hold, all together
  std::unique_ptr<Code> code_;
  KernelFn fn_;
};

}  // namespace uop
