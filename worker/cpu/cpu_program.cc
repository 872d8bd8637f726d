// Loading goes through one process-wide ORC ExecutionSession and ObjectLinkingLayer
// (JITLink), both thread-safe; each program gets a JITDylib of its own whose removal
// unmaps the program's memory. Symbols the object does not define (sinf, exp2, memset)
// come from the process through DynamicLibrarySearchGenerator.
#include "worker/cpu/cpu_program.h"

#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutorProcessControl.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/ExecutionEngine/Orc/TaskDispatch.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "compiler/support/strings.h"
#include "worker/device_backend.h"

namespace uop {
namespace {

struct Jit {
  std::unique_ptr<llvm::orc::ExecutionSession> session;
  std::unique_ptr<llvm::orc::ObjectLinkingLayer> linker;
  char global_prefix = '\0';
  std::string error;  // why the JIT could not start, if it could not
};

// Made on first use and never destroyed: programs may outlive static destruction order.
Jit& jit() {
  static Jit* j = [] {
    auto* jit = new Jit;
    // Links run on the loading thread; no background threads of LLVM's own.
    auto epc = llvm::orc::SelfExecutorProcessControl::Create(
        nullptr, std::make_unique<llvm::orc::InPlaceTaskDispatcher>());
    if (!epc) {
      jit->error = llvm::toString(epc.takeError());
      return jit;
    }
    jit->global_prefix = (*epc)->getTargetTriple().isOSBinFormatMachO() ? '_' : '\0';
    jit->session = std::make_unique<llvm::orc::ExecutionSession>(std::move(*epc));
    jit->linker = std::make_unique<llvm::orc::ObjectLinkingLayer>(*jit->session);
    return jit;
  }();
  return *j;
}

std::atomic<uint64_t> next_program_id{0};

// The first symbol the object needs that neither it nor the process defines (a CUSTOM's
// function this worker does not have), so that the refusal can name it; JITLink only
// says that materialization failed.
std::optional<std::string> missing_symbol(std::string_view object) {
  auto obj = llvm::object::ObjectFile::createObjectFile(
      llvm::MemoryBufferRef(llvm::StringRef(object.data(), object.size()), "uop_kernel.o"));
  if (!obj) {
    llvm::consumeError(obj.takeError());
    return std::nullopt;  // not an object: the linker says so
  }
  for (const llvm::object::SymbolRef& sym : (*obj)->symbols()) {
    auto flags = sym.getFlags();
    if (!flags) {
      llvm::consumeError(flags.takeError());
      continue;
    }
    if (!(*flags & llvm::object::SymbolRef::SF_Undefined)) continue;
    auto name = sym.getName();
    if (!name) {
      llvm::consumeError(name.takeError());
      continue;
    }
    if (name->empty()) continue;
    if (!llvm::sys::DynamicLibrary::SearchForAddressOfSymbol(name->str())) return name->str();
  }
  return std::nullopt;
}

}  // namespace

struct CpuProgram::Code {
  llvm::orc::JITDylib* dylib = nullptr;
  ~Code() {
    if (!dylib) return;
    if (llvm::Error err = jit().session->removeJITDylib(*dylib))
      jit().session->reportError(std::move(err));
  }
};

CpuProgram::CpuProgram(KernelAbi abi, std::unique_ptr<Code> code, KernelFn fn)
    : abi_(std::move(abi)), code_(std::move(code)), fn_(fn) {
  for (const KernelParam& p : abi_.params) {
    uint64_t bytes = 0;
    if (p.size < 0 || __builtin_mul_overflow(static_cast<uint64_t>(p.size), static_cast<uint64_t>(p.dtype.bytes()), &bytes) ||
        __builtin_add_overflow(buffer_bytes_, bytes, &buffer_bytes_))
      buffer_bytes_ = UINT64_MAX;
  }
}

CpuProgram::~CpuProgram() = default;

absl::Status CpuProgram::start_jit() {
  Jit& j = jit();
  if (!j.session) return absl::InternalError(cat("cannot start the ORC JIT: ", j.error));
  // The process's symbols, as every load asks for them.
  auto generator = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(j.global_prefix);
  if (!generator) return absl::InternalError(cat("process symbols: ", llvm::toString(generator.takeError())));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CpuProgram>> CpuProgram::load(std::string_view object, const KernelAbi& abi) {
  Jit& j = jit();
  if (!j.session) return absl::InternalError(cat("cannot start the ORC JIT: ", j.error));
  auto code = std::make_unique<Code>();
  code->dylib = &j.session->createBareJITDylib(cat("uop_program_", next_program_id.fetch_add(1)));
  auto generator = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(j.global_prefix);
  if (!generator) return absl::InternalError(cat("process symbols: ", llvm::toString(generator.takeError())));
  code->dylib->addGenerator(std::move(*generator));
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), "uop_kernel.o");
  if (auto missing = missing_symbol(object))
    return absl::InvalidArgumentError(cat("the kernel object calls `", *missing, "`, which this worker does not define"));
  if (llvm::Error err = j.linker->add(*code->dylib, std::move(buffer)))
    return absl::InvalidArgumentError(cat("cannot load the kernel object: ", llvm::toString(std::move(err))));
  // The lookup links the object (and fails if a symbol it needs is nowhere to be found).
  auto sym = j.session->lookup({code->dylib}, "uop_kernel");
  if (!sym) return absl::InvalidArgumentError(cat("cannot link the kernel object: ", llvm::toString(sym.takeError())));
  auto fn = sym->getAddress().toPtr<KernelFn>();
  return std::unique_ptr<CpuProgram>(new CpuProgram(abi, std::move(code), fn));
}

absl::Status CpuProgram::check(std::span<void* const> buffers, std::span<const int64_t> vars) const {
  std::vector<uintptr_t> addresses(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) addresses[i] = reinterpret_cast<uintptr_t>(buffers[i]);
  return check_launch_args(abi_, addresses, vars);
}

absl::Status CpuProgram::run(std::span<void* const> buffers, std::span<const int64_t> vars, ThreadPool* pool,
                             uint64_t serial_below, const std::atomic<uint32_t>* stop) const {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
                "the kernel reads the stop word as a plain 32-bit word");
  static const std::atomic<uint32_t> never{0};
  if (auto st = check(buffers, vars); !st.ok()) return st;
  int64_t tasks = abi_.eval_tasks(vars);
  if (tasks <= 0) return absl::OkStatus();  // every buffer store is inside the Thread range
  int64_t ntasks = pool && buffer_bytes_ >= serial_below ? std::min<int64_t>(tasks, pool->size()) : 1;
  void* const* b = buffers.data();
  const int64_t* v = vars.data();
  const auto* word = reinterpret_cast<const uint32_t*>(stop ? stop : &never);
  if (ntasks == 1) {
    fn_(b, v, 0, 1, word);
  } else {
    KernelFn fn = fn_;
    pool->parallel_for(ntasks, [=](int64_t t) { fn(b, v, t, ntasks, word); });
  }
  return absl::OkStatus();
}

}  // namespace uop
