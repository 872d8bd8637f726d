// Legal graphs that cost their compiler a lot for their size, for the tests of the bounds
// on compiling (compiler/pipeline.h limits, the scheduler's compile pool).
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/ir/tensor_builder.h"

namespace uop::testing {

// `kernels` outputs, each (x0 + ... + x[leaves-1]) * (salt + k), over inputs of `width`:
// the sum is elementwise, so every output's kernel recomputes it (leaves loads, leaves - 1
// adds), and its factor makes each kernel distinct. One kernel of ~4 x leaves ops each.
inline const UOp* sums_of_leaves(TensorBuilder& tb, int kernels, int leaves, double salt, int64_t width = 64) {
  const UOp* sum = tb.input(Scalar::Float32, {width});
  for (int i = 1; i < leaves; ++i) sum = tb.alu(Op::ADD, {sum, tb.input(Scalar::Float32, {width})});
  std::vector<const UOp*> outs;
  for (int k = 0; k < kernels; ++k) outs.push_back(tb.alu(Op::MUL, {sum, tb.full(Scalar::Float32, salt + k, {width})}));
  return tb.sink(outs);
}

// v[i] + v[i + 2^k] (zero past the end), level after level: a graph of ~5 x levels nodes
// whose rangeify reads the input at every sum of distinct powers of two below 2^levels,
// 2^levels index expressions. `n` must exceed 2^levels.
inline const UOp* shifted_sums(TensorBuilder& tb, int levels, int64_t n) {
  const UOp* v = tb.input(Scalar::Float32, {n});
  for (int k = 0; k < levels; ++k) {
    int64_t shift = int64_t{1} << k;
    v = tb.alu(Op::ADD, {v, tb.pad(tb.shrink(v, {shift}, {n}), {0}, {shift})});
  }
  return tb.sink({v});
}

}  // namespace uop::testing
