// A seeded generator of random tensor-level graphs, for differential tests (compiled code
// against the reference interpreter), fuzzers and benchmarks. A graph mixes element-wise
// chains over every dtype, NumPy broadcasts, movement ops, reductions (whose results feed
// element-wise ops that are reduced again), casts, bitcasts, composite activations, several
// outputs and shared subexpressions. The same seed gives the same graph on every machine.
//
// Every value carries a bound on its magnitude and on how far compiled code may be from
// the interpreter at it. The backend's contract (compiler/codegen/llvm_cpu.h) is bit-exact
// except for the transcendentals (1 ULP) and reassociated float Add / Mul reductions, so
// most values carry no error at all; the generator propagates the rest through each op's
// Lipschitz bound and keeps magnitudes small (clamping with MAX / MIN where they grow), so
// every output gets a tolerance that is both safe and tight. An op that is not continuous
// (comparisons, TRUNC, float -> int casts, BITCAST) is only applied to exact values, and a
// value that may be inf or NaN (a BITCAST to float, an empty Max reduction) only meets
// exact ops. Magnitudes assume inputs from HostTensor::random (ints in [-16, 32], floats in
// [-2, 2]), except integer inputs marked `wide`, which may hold any value of their type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/interp/host_tensor.h"
#include "compiler/ir/tensor_builder.h"

namespace uop::randgraph {

// splitmix64: small, portable, and the same sequence everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [lo, hi] (inclusive).
  int64_t range(int64_t lo, int64_t hi);
  bool chance(double p);
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(range(0, static_cast<int64_t>(v.size()) - 1))]; }

 private:
  uint64_t state_;
};

struct Options {
  int steps = 20;              // ops added to the pool of values before outputs are chosen
  int max_outputs = 3;
  int max_rank = 4;
  int64_t max_numel = 1536;    // per tensor
  double zero_dim_chance = 0.04;
  std::vector<Scalar> dtypes;  // empty: every value dtype (bool, ints, floats)
};

struct RandomGraph {
  const UOp* sink = nullptr;
  std::vector<const UOp*> inputs;       // TensorBuilder inputs
  std::vector<bool> wide;               // per input: fill with values over the whole integer
                                        // type (difftest::edge_tensor), else HostTensor::random
  std::vector<Tolerance> tolerances;    // one per output: exact, or the propagated bound
  std::vector<std::string> notes;       // one per output: "float32 err<=3e-07 mag<=4"
};

// A random graph in tb's Graph.
RandomGraph generate(TensorBuilder& tb, uint64_t seed, const Options& options = {});

// One movement op of kind `op` (RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP) with random
// arguments valid for x's shape, keeping the result within max_numel elements. EXPAND of
// a tensor without a size-1 dim first inserts one (a RESHAPE); PAD, SHRINK, FLIP and
// EXPAND of a scalar first make it rank 1.
const UOp* random_movement(TensorBuilder& tb, const UOp* x, Op op, Rng& rng, int64_t max_numel);

// A random shape of rank [1, max_rank] with at most max_numel elements: small, often odd
// dims, some 1s, and a 0 with probability zero_dim_chance.
std::vector<int64_t> random_shape(Rng& rng, int max_rank, int64_t max_numel, double zero_dim_chance);

}  // namespace uop::randgraph
