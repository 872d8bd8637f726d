// The LLVM CPU backend's driver (compile_cpu, llvm_cpu.h): the target machine for a
// CpuTarget, the module rendered by llvm_cpu_render.cc, LLVM's verifier, the kernel
// pipeline (see optimize) and code generation to a relocatable ELF object in memory.
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "absl/status/status.h"
#include "compiler/codegen/linear_walk.h"
#include "compiler/codegen/llvm_cpu.h"
#include "compiler/codegen/llvm_cpu_render.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"

namespace uop {
namespace {

// The heuristic's choices are part of what this names (docs/ARCHITECTURE.md, The compile cache):
// a change in heuristic_schedule bumps it too.
constexpr int kBackendVersion = 8;  // 2: the stop word; 3: convolution tiles of half the register file, masked pixel tiles;
                                     // 4: sibling reductions in a dot tile, threads by summed iterations, EXP2 in vector code;
                                     // 5: reduce loops a load divides split into lanes;
                                     // 6: a split index rejoined; 7: gated tails, masked vector
                                     // stores, elementwise threads by elements; 8: a dead
                                     // tail's clamped reads as masked vector loads, AVX2
                                     // window tiles of one channel's pixels a vector

void init_llvm_targets() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargets();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllAsmPrinters();
  });
}

absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> make_target_machine(const CpuTarget& t, int opt) {
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(t.triple, err);
  if (!target) return absl::InvalidArgumentError(cat("unknown target triple '", t.triple, "': ", err));
  llvm::TargetOptions to;
  to.AllowFPOpFusion = llvm::FPOpFusion::Strict;  // one rounding per op, as eval.h says
  auto level = static_cast<llvm::CodeGenOptLevel>(std::clamp(opt, 0, 3));  // None .. Aggressive
  std::unique_ptr<llvm::TargetMachine> tm(target->createTargetMachine(
      t.triple, t.cpu, t.features, to, llvm::Reloc::PIC_, llvm::CodeModel::Small, level));
  if (!tm) return absl::InvalidArgumentError(cat("cannot make a target machine for ", t.id()));
  return tm;
}

void optimize(llvm::Module& m, llvm::TargetMachine* tm, int opt) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopVectorization = opt >= 2;
  pto.SLPVectorization = opt >= 2;
  llvm::PassBuilder pb(tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm;
  if (opt <= 0) {
    mpm = pb.buildO0DefaultPipeline(llvm::OptimizationLevel::O0);
  } else if (opt == 2) {
    // The kernel pipeline. Our LINEAR arrives already tiled, unrolled into vector lanes
    // (expand) and with its accumulators in registers (lower_reduce), with one function
    // and no calls: the default O2 pipeline's inliner, loop vectorizer, SLP, unroller and
    // interprocedural passes find nothing to do and cost two thirds of a cold compile.
    // What our IR does need: promote the accumulator allocas, fold and CSE the index
    // arithmetic, hoist loop invariants (row bases) out of the inner loops. Code
    // generation runs at the Less level (see compile_cpu).
    static const char* kKernelPipeline =
        "function(sroa<modify-cfg>,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,"
        "loop-mssa(loop-rotate,licm),instcombine<no-verify-fixpoint>,simplifycfg)";
    if (auto err = pb.parsePassPipeline(mpm, kKernelPipeline)) {
      llvm::consumeError(std::move(err));  // a pipeline this LLVM cannot parse: the default one
      mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
    }
  } else {
    mpm = pb.buildPerModuleDefaultPipeline(opt == 1 ? llvm::OptimizationLevel::O1 : llvm::OptimizationLevel::O3);
  }
  mpm.run(m, mam);
}

}  // namespace

std::string compiler_build_id() {
  return cat("uopd-llvm-cpu/", kBackendVersion, " abi-", kAbiVersion, " llvm-", LLVM_VERSION_STRING);
}

absl::StatusOr<CpuArtifact> compile_cpu(const UOp* linear, const CpuTarget& target,
                                        const CpuCompileOptions& options) {
  auto t0 = std::chrono::steady_clock::now();  // render_ms counts the verification too
  RETURN_IF_ERROR(verify_for_rendering(linear, "compile_cpu"));
  CpuArtifact art;
  ASSIGN_OR_RETURN(art.abi, abi_of(linear));
  art.abi.stop_word = options.stop_checks;
  init_llvm_targets();
  // Level 2 is the kernel pipeline of optimize(); its code generation runs at LLVM's
  // "Less" level: on bench_cpu the kernels run as fast as at Default, and instruction
  // selection and scheduling cost a third less.
  auto tm = make_target_machine(target, options.opt_level == 2 ? 1 : options.opt_level);
  if (!tm.ok()) return tm.status();

  llvm::LLVMContext ctx;
  llvm::Module m("uop_kernel", ctx);
  m.setTargetTriple(target.triple);
  m.setDataLayout((*tm)->createDataLayout());
  if (auto st = llvm_cpu::render_module(m, linear, art.abi, target, options.stop_checks); !st.ok()) return st;
  std::string verify_msg;
  llvm::raw_string_ostream vos(verify_msg);
  if (llvm::verifyModule(m, &vos))
    return absl::InternalError(cat("the LLVM CPU backend produced invalid IR: ", vos.str()));
  if (options.emit_ir_text) {
    llvm::raw_string_ostream os(art.ir_text);
    m.print(os, nullptr);
  }
  art.render_ms = ms_since(t0);

  auto t1 = std::chrono::steady_clock::now();
  optimize(m, tm->get(), options.opt_level);
  llvm::SmallVector<char, 0> obj;
  llvm::raw_svector_ostream os(obj);
  llvm::legacy::PassManager pm;
  if ((*tm)->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
    return absl::InternalError(cat("target ", target.triple, " cannot emit an object file"));
  pm.run(m);
  art.object.assign(obj.begin(), obj.end());
  art.compile_ms = ms_since(t1);
  return art;
}

}  // namespace uop
