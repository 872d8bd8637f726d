// The kernel ABI: what a compiled kernel needs from whoever runs it. Its buffers (slot,
// element dtype, element count, read / written), its runtime variables (name and bounds,
// in argument order) and its launch extent as a LaunchExpr: a small integer expression
// over those variables that the runtime evaluates before a launch, never reading memory
// (PIPELINE.md "The kernel ABI", the LaunchExpr of the shared GPU IR note).
//
// GPU kernels (CUDA, codegen/cuda.h) also carry their launch dims: grid x/y/z and block
// x/y/z, each a LaunchExpr over the same variables (GpuLaunch below). The CUDA contract,
// for whoever launches a cubin of codegen/cuda.h (worker/cuda):
//
//   extern "C" __global__ void <entry>(T0* b0, T1* b1, ..., long long v0, long long v1, ...)
//
//   * one pointer per slot 0 .. num_buffers()-1 (a slot no op uses is an unused `const
//     void*`: pass anything, null included), then one int64 per variable in `vars` order;
//     so cuLaunchKernel's kernelParams is {&ptr0, ..., &var0, ...};
//   * every pointer is 16-byte aligned (cuMemAlloc gives 256): vector loads rely on it;
//     written buffers do not overlap any other buffer of the launch;
//   * the runtime checks each variable against [min, max], evaluates gpu->grid and
//     gpu->block with them, and launches once with those dims and
//     gpu->dynamic_shared_bytes of dynamic shared memory (static shared memory is in the
//     cubin). A grid dim <= 0 means there is nothing to do: the launch is skipped, never
//     clamped up. Block dims are constants today; their product is at most 1024.
//   * one kernel is one launch: no second launch, no device-side sync beyond the block.
//
// CPU kernels (codegen/llvm_cpu.h) take a stop word: a pointer to a 32-bit word that
// the runtime sets (to nonzero) when the launch must stop, its deadline passed or its
// caller went away. The kernel reads it with a relaxed load at chosen loop headers
// (stop_checks.h) and returns early once it is set; its outputs are then garbage and the
// launch fails. Parallel tasks of one launch share the word.
//
// The ABI travels with every cached artifact, so it has a stable text form
// (serialize / parse_abi): version 1 for kernels without GPU dims (byte for byte what
// it always was), version 2 adds the `gpu` section, version 3 says that the
// kernel checks a stop word, with or without the `gpu` section; version 4 adds the work
// estimate (`work` below) after the stop line, version 5 the loop schedule after it;
// parse_abi reads all five.
// A kernel that does not check the word (an older artifact, a CUDA kernel today) can only
// be stopped by ending its worker. LLVM-free: the server and the workers use it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/dtype.h"
#include "compiler/ir/op.h"
#include "compiler/ir/uop.h"

namespace uop {

struct KernelParam {
  int64_t slot = 0;
  DType dtype;        // element type (a scalar, or a vector if the buffer holds vectors)
  int64_t size = 0;   // elements
  bool read = false;
  bool written = false;
  bool operator==(const KernelParam&) const = default;
};

struct KernelVar {
  std::string name;
  int64_t min = 0, max = 0;
  bool operator==(const KernelVar&) const = default;
};

// An index expression over the kernel's variables, in postfix form. Evaluation follows
// ir/eval.h on `index` (wrap-around, IDIV truncates and x / 0 = 0), so it gives exactly
// the value the kernel computes from the same IR.
class LaunchExpr {
 public:
  struct Term {
    enum class Kind : uint8_t { Const, Var, Op };
    Kind kind = Kind::Const;
    int64_t value = 0;  // Const: the value; Var: the variable's position
    Op op = Op::ADD;    // Op: ADD, SUB, MUL, IDIV, MAX or MIN, on the two topmost values
    bool operator==(const Term&) const = default;
  };

  LaunchExpr() : LaunchExpr(constant(1)) {}
  static LaunchExpr constant(int64_t v);
  // A well-formed postfix program over `num_vars` variables, or INVALID_ARGUMENT.
  static absl::StatusOr<LaunchExpr> from_terms(std::vector<Term> terms, size_t num_vars);

  // `vars` must hold at least as many values as the expression's variables.
  int64_t eval(std::span<const int64_t> vars) const;
  const std::vector<Term>& terms() const { return terms_; }
  // "(n + 3) // 4"-like form for messages and `uop explain`.
  std::string str(std::span<const KernelVar> vars = {}) const;
  bool operator==(const LaunchExpr&) const = default;

 private:
  explicit LaunchExpr(std::vector<Term> t) : terms_(std::move(t)) {}
  std::vector<Term> terms_;
};

// Where and how a GPU kernel launches: the extents of its SPECIAL nodes
// ("blockIdx.x" .. "threadIdx.z"); a dim the kernel does not use is the constant 1.
struct GpuLaunch {
  std::array<LaunchExpr, 3> grid;   // blocks along x, y, z
  std::array<LaunchExpr, 3> block;  // threads per block along x, y, z
  int64_t dynamic_shared_bytes = 0;
  bool operator==(const GpuLaunch&) const = default;
};

// GpuLaunch evaluated for one launch.
struct GpuDims {
  std::array<int64_t, 3> grid{1, 1, 1}, block{1, 1, 1};
  // Nothing to launch: some grid or block dim is <= 0.
  bool empty() const;
  int64_t threads_per_block() const { return block[0] * block[1] * block[2]; }
};

struct KernelAbi {
  std::vector<KernelParam> params;  // sorted by slot
  std::vector<KernelVar> vars;      // argument order: sorted by name
  // Trip count of the Thread range (before clamping at 0); 1 without one.
  LaunchExpr tasks_extent;
  bool has_thread_range = false;
  // GPU kernels only (a LINEAR with SPECIAL nodes); nullopt for CPU kernels.
  std::optional<GpuLaunch> gpu;
  // The kernel watches a stop word (see above). Set by the backend that renders it, not
  // derived from the LINEAR.
  bool stop_word = false;
  // The compiler's estimate of one launch's work, for profiles (GFLOPS, GB/s): floating
  // point ALU operations (per lane, MULACC as two) and bytes loaded from and stored to the
  // kernel's buffers, each op weighted by the trip counts of the ranges around it in the
  // LINEAR (an op under an IF counts as if the IF were taken). Expressions over the
  // kernel's variables, like the launch extent; nullopt where a range's extent is not one
  // (and for artifacts of older ABI versions). `loops` are the ranges the estimate
  // multiplies over, in the LINEAR's order, and `lanes` the widest vector of its floating
  // point ops: what the optimize stage made of the kernel (its schedule), for profiles.
  struct Loop {
    AxisType type = AxisType::Loop;
    LaunchExpr extent;
    bool operator==(const Loop&) const = default;
  };
  struct Work {
    LaunchExpr flops, bytes;
    std::vector<Loop> loops;
    int64_t lanes = 1;
    bool operator==(const Work&) const = default;
  };
  std::optional<Work> work;
  // "Thread(n) Loop(16) Reduce(64) lanes=4": `work`'s loops and lanes; "" without it.
  std::string loops_str() const;
  // The loop schedule the optimize stage applied (compiler/passes/loop_schedule.h text:
  // "split(1,8,upcast);thread(0)", "" for none), set by whoever lowered the kernel; in
  // the text form of version 5 (with the work estimate), "" in older ones.
  std::string schedule;
  // What profiles print as the schedule: `schedule`, "-" for the empty one.
  std::string schedule_str() const { return schedule.empty() ? "-" : schedule; }

  // How many buffer pointers a launch passes: max slot + 1 (a slot no op uses is a
  // null-tolerant hole), 0 without params.
  int64_t num_buffers() const { return params.empty() ? 0 : params.back().slot + 1; }
  // The launch extent `tasks` for these variable values: max(extent, 0).
  int64_t eval_tasks(std::span<const int64_t> var_values) const;
  // Position of the variable `name` in the argument order, -1 if none.
  int var_position(std::string_view name) const;
  // The launch dims for these variable values (all 1 without `gpu`).
  GpuDims eval_gpu(std::span<const int64_t> var_values) const;

  // Stable text form (versioned, line based). parse_abi(serialize()) == *this.
  std::string serialize() const;
  bool operator==(const KernelAbi&) const = default;
};

absl::StatusOr<KernelAbi> parse_abi(std::string_view text);

// The newest text version serialize() writes (with a work estimate). Backends name it in their
// build ids, so that kernels of an older ABI never share a cache key with newer ones.
inline constexpr int kAbiVersion = 5;

// The ABI of a LINEAR: params from PARAM (read / written from the LOADs and STOREs that
// reach them through INDEX), vars from DEFINE_VAR, the launch extent from the Thread
// RANGE, GPU launch dims from SPECIAL (its end is the dim's extent), the work estimate
// from the ALU ops, LOADs and STOREs and the RANGEs around them. INVALID_ARGUMENT
// when the LINEAR breaks the ABI's rules: conflicting PARAMs for one slot or DEFINE_VARs
// for one name, more than one Thread range, a Thread range that is not outermost, a
// Thread extent that is not a LaunchExpr, a buffer store outside the Thread range (each
// task would repeat it), a SPECIAL with an unknown name or an end that is not a
// LaunchExpr, two SPECIALs of one name with different ends, or SPECIAL and Thread ranges
// in one kernel.
absl::StatusOr<KernelAbi> abi_of(const UOp* linear);

}  // namespace uop
