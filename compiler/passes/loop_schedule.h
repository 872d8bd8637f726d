// A loop schedule: how a normalized kernel's loops run, as data (docs/ARCHITECTURE.md, The
// pipeline). The optimize stage applies one: the target's heuristic chooses it
// (heuristic_schedule in optimize.h), or a client gives it (CompileRequest.schedules),
// or a search tries many. It is part of the compiled artifact and of its cache key, never
// of the kernel's identity (the normalized kernel's digest).
//
// Axes. A step names a range by its position in the kernel's canonical axis list, which
// depends on the kernel's structure only (not on pointers or on the ids its ranges
// happen to carry):
//   * 0 .. N-1: the ranges of the normalized kernel, first those its STORE closes, in the
//     order it closes them (outermost first), then those of each REDUCE in the order the
//     kernel's toposort reaches the REDUCEs, each REDUCE's in the order it closes them;
//   * N, N+1, ...: the inner ranges the split steps make, in the order of the steps.
// A split keeps the axis number for its outer part, so an axis means the same loop from
// the first step to the last.
//
// Steps, and their text (the whole schedule: steps joined by ';', no spaces; "" is the
// empty schedule, which leaves every loop as it is):
//   split(A,F,TYPE)   axis A (trip count n, a constant) becomes A * F + B, where B is a new
//                     axis of trip count F and axis type TYPE, and A's trip count becomes
//                     ceil(n / F). F need not divide n: then the iterations past n are
//                     masked (see split_range in optimize.h). An axis that the gate of
//                     an access reads (a padded read) splits only into upcast lanes, a
//                     tail gated on every access rather than clamped: that gate is what
//                     proves the access in bounds, and it narrows a loop plus a lane's
//                     constant exactly, not a sum of two loops or a clamp. TYPE is an AxisType in
//                     lower case with '_' between words: loop, upcast, reduce, unroll,
//                     global, local, group_reduce, thread, warp; a target accepts some.
//   reorder(A,B,...)  the loops the STORE closes, outermost first: a permutation of
//                     exactly those axes (outer loops first for locality).
//   thread(A)         axis A runs on the thread pool: it must be an output axis, the
//                     outermost loop of the STORE at that point, and not Upcast.
// The GPU's steps (a target that has no GPU refuses them, ScheduleLimits::gpu):
//   grid(X[,Y[,Z]])   output axes X, Y, Z become Global: blockIdx.x, .y, .z in that order
//                     (Y and Z at most 65535 iterations; none Upcast or already parallel).
//                     A split into `local` / `group_reduce` makes threadIdx ranges, the
//                     inner range of the latest such split threadIdx.x (at most three, of
//                     1024 threads in all; upcast lanes and a group_reduce range do not go
//                     together in one kernel).
//   tc(W)             the kernel, a float16 / bfloat16 matmul, runs on the tensor cores
//                     (tensor_cores.h), W warps per block (1, 2 or 4 dividing N / 8).
//   tile(BM,BN,BK,TM,TN)
//                     the kernel, a float matmul, runs as a tiled GEMM (gemm_tiles.h):
//                     a block computes a BM x BN tile of C from BM x BK and BK x BN tiles
//                     of A and B staged through shared memory (double-buffered), each
//                     thread a TM x TN block of outputs in registers.
//   tc_tile(BM,BN,BK,WM,WN)
//                     the kernel, a float16 / bfloat16 matmul, as tile's block tiles staged
//                     through shared memory, computed by warps of WM x WN on the tensor
//                     cores (sm_80+; gemm_tiles.h).
//                     tc, tile and tc_tile rebuild the whole kernel: each is a schedule's
//                     last step.
// The parser refuses what it does not know. Every text form older schedules used (split,
// reorder, thread) means what it meant.
//
// Text is parsed strictly: names in lower case, integers in decimal without signs or
// leading zeros, nothing else; str() prints the same text back, so parse(s)->str() == s
// for every s parse accepts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

struct LoopStep {
  enum class Kind { Split, Reorder, Thread, Grid, TensorCores, Tile, TensorCoreTile };
  Kind kind = Kind::Split;
  int64_t axis = 0;             // Split, Thread
  int64_t factor = 0;           // Split; TensorCores: warps per block
  AxisType type = AxisType::Loop;  // Split: the inner range's type
  std::vector<int64_t> order;   // Reorder; Grid: the x, y, z axes; Tile, TensorCoreTile: its 5 extents
  std::string str() const;
  bool operator==(const LoopStep&) const = default;
};

struct LoopSchedule {
  std::vector<LoopStep> steps;
  std::string str() const;
  bool empty() const { return steps.empty(); }
  bool operator==(const LoopSchedule&) const = default;

  // The bounds on what a schedule may say, so that one from the network costs bounded
  // time and memory before any kernel is looked at.
  static constexpr size_t kMaxText = 4096;
  static constexpr size_t kMaxSteps = 64;
  static constexpr int64_t kMaxNumber = int64_t{1} << 31;
};

// INVALID_ARGUMENT naming the step (its index and text) and what is wrong with it.
absl::StatusOr<LoopSchedule> parse_loop_schedule(std::string_view text);

// The name a split step gives an axis type ("group_reduce"), and back.
std::string axis_type_step_name(AxisType t);

// What a target lets a schedule do.
struct ScheduleLimits {
  // Axis types a split may give an output axis's inner range, and a reduce axis's.
  std::vector<AxisType> output_types{AxisType::Loop, AxisType::Upcast};
  std::vector<AxisType> reduce_types{AxisType::Reduce, AxisType::Upcast};
  bool thread = true;      // thread(A) is allowed
  bool gpu = false;        // grid, tc, tile and tc_tile are allowed
  int sm = 0;              // the GPU's compute capability (tc, tc_tile need 80 or more)
  // The product of every Upcast range's trip count: the lanes one value may have.
  int64_t max_lanes = 256;
};

// A RANGE's trip count when it is a constant, else -1.
int64_t const_end(const UOp* r);
// The RANGEs `x` (a STORE, REDUCE or END) closes, outermost first.
std::vector<const UOp*> closed_ranges(const UOp* x);

// The kernel's canonical axis list (above): its ranges, 0 .. N-1. Empty when the kernel
// is not one STORE (the only shape a schedule applies to).
std::vector<const UOp*> schedule_axes(const UOp* kernel);

// The steps a schedule search may add after `schedule` on `kernel` (docs/ARCHITECTURE.md,
// The pipeline): for every axis with a constant trip count n >= 2, splits by 2, 3, 4, 8
// and 16 (below n) into each of Upcast and Unroll that `limits` lets that axis take; for
// every output loop but the outermost, a reorder that moves it outermost; and thread(A) of
// the outermost output loop when no loop runs on threads yet. Axis numbers, trip counts
// and the loops' order follow the steps of `schedule` (a split's inner loop right inside
// its outer one), which must be one apply_schedule accepts for `kernel`. Not every step
// listed applies (a gate's axis splits only into lanes that divide it, lanes have a cap,
// ...): apply_schedule is the judge. None for a kernel that is not one STORE.
std::vector<LoopStep> candidate_steps(const UOp* kernel, const LoopSchedule& schedule, const ScheduleLimits& limits = {});

// The schedules one change away from `schedule` without adding a step: each split's factor
// halved (while at least 2) or doubled, and the last step dropped. A search that only
// extended a schedule could never leave a tile that already takes every lane a schedule
// may have (a matmul's or a convolution's heuristic tile); these let it trade one loop's
// lanes for another's (32 channels x 4 x 2 pixels -> 16 x 4 x 4 in two moves). Neither
// changes any other step's axis numbers. apply_schedule judges them like candidate_steps.
std::vector<LoopSchedule> schedule_neighbours(const LoopSchedule& schedule);

// `kernel` with `schedule` applied. INVALID_ARGUMENT naming the step's index and text for
// a step that does not fit the kernel (an axis it does not have, a factor below 2 or above
// the trip count, a trip count that is no constant, a type the target or the axis does not
// take, a reduce axis given Thread, lanes beyond limits.max_lanes, a reorder that is not a
// permutation of the STORE's loops, ...), and for a non-empty schedule of a kernel that is
// not one STORE. The empty schedule gives back the kernel.
absl::StatusOr<const UOp*> apply_schedule(Graph& g, const UOp* kernel, const LoopSchedule& schedule,
                                          const ScheduleLimits& limits = {});

}  // namespace uop
