// The activations users build from the IR's primitives (EXP2, LOG2, SIN, SQRT, RECIPROCAL,
// ...), spelled the way a frontend spells them, so the differential tests check what
// models actually run. Every constant has x's dtype; every result has x's shape.
#pragma once

#include <cmath>
#include <numbers>

#include "compiler/ir/tensor_builder.h"

namespace uop::composites {

inline const UOp* k(TensorBuilder& tb, const UOp* like, double v) { return tb.full(like->dtype().scalar, v, {}); }
inline const UOp* add(TensorBuilder& tb, const UOp* a, const UOp* b) { return tb.alu(Op::ADD, {a, b}); }
inline const UOp* mul(TensorBuilder& tb, const UOp* a, const UOp* b) { return tb.alu(Op::MUL, {a, b}); }

// exp(x) = exp2(x * log2(e)); log(x) = log2(x) * ln(2).
inline const UOp* exp(TensorBuilder& tb, const UOp* x) {
  return tb.alu(Op::EXP2, {mul(tb, x, k(tb, x, std::numbers::log2e))});
}
inline const UOp* log(TensorBuilder& tb, const UOp* x) {
  return mul(tb, tb.alu(Op::LOG2, {x}), k(tb, x, std::numbers::ln2));
}
// sigmoid(x) = 1 / (1 + exp(-x)).
inline const UOp* sigmoid(TensorBuilder& tb, const UOp* x) {
  return tb.alu(Op::RECIPROCAL, {add(tb, k(tb, x, 1.0), exp(tb, tb.alu(Op::NEG, {x})))});
}
// tanh(x) = 2 * sigmoid(2x) - 1.
inline const UOp* tanh(TensorBuilder& tb, const UOp* x) {
  const UOp* s = sigmoid(tb, mul(tb, x, k(tb, x, 2.0)));
  return tb.alu(Op::SUB, {mul(tb, s, k(tb, x, 2.0)), k(tb, x, 1.0)});
}
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the tanh approximation.
inline const UOp* gelu(TensorBuilder& tb, const UOp* x) {
  const UOp* x3 = mul(tb, mul(tb, x, x), x);
  const UOp* inner = mul(tb, add(tb, x, mul(tb, x3, k(tb, x, 0.044715))), k(tb, x, std::sqrt(2.0 / std::numbers::pi)));
  return mul(tb, mul(tb, x, k(tb, x, 0.5)), add(tb, k(tb, x, 1.0), tanh(tb, inner)));
}
// |x| = max(x, -x); sign(x) = where(x < 0, -1, 1).
inline const UOp* abs(TensorBuilder& tb, const UOp* x) { return tb.alu(Op::MAX, {x, tb.alu(Op::NEG, {x})}); }
// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), with SQRT in the loop so a frontend's
// usual erf exercises every primitive: t = 1 / (1 + p |x|), erf = sign(x) (1 - poly(t) exp(-x^2)).
inline const UOp* erf(TensorBuilder& tb, const UOp* x) {
  const UOp* ax = abs(tb, x);
  const UOp* t = tb.alu(Op::RECIPROCAL, {add(tb, k(tb, x, 1.0), mul(tb, ax, k(tb, x, 0.3275911)))});
  const UOp* poly = k(tb, x, 1.061405429);
  for (double c : {-1.453152027, 1.421413741, -0.284496736, 0.254829592}) poly = add(tb, mul(tb, poly, t), k(tb, x, c));
  poly = mul(tb, poly, t);
  const UOp* e = exp(tb, tb.alu(Op::NEG, {mul(tb, ax, ax)}));
  const UOp* y = tb.alu(Op::SUB, {k(tb, x, 1.0), mul(tb, poly, e)});
  const UOp* neg = tb.alu(Op::CMPLT, {x, k(tb, x, 0.0)});
  return tb.alu(Op::WHERE, {neg, tb.alu(Op::NEG, {y}), y});
}
// rms norm's scale: 1 / sqrt(mean(x^2) + eps) over the last axis (keepdim).
inline const UOp* rsqrt_mean_square(TensorBuilder& tb, const UOp* x) {
  int64_t last = static_cast<int64_t>(tb.shape(x).size()) - 1;
  double n = static_cast<double>(tb.shape(x)[last]);
  const UOp* ms = mul(tb, tb.reduce(mul(tb, x, x), ReduceOp::Add, {last}), k(tb, x, 1.0 / n));
  return tb.alu(Op::RECIPROCAL, {tb.alu(Op::SQRT, {add(tb, ms, k(tb, x, 1e-5))})});
}

}  // namespace uop::composites
