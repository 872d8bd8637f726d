// Math the IR has no op for, written with the ops it has (EXP2, LOG2, SIN, SQRT,
// RECIPROCAL, POW, TRUNC, comparisons, WHERE). Every function takes and returns
// tensor-level nodes whose shapes the TensorBuilder knows, and keeps the input's dtype.
//
// Precision: ONNX's backend tests allow rtol 1e-3. Anything computed through a formula
// that cancels (tanh near 0, acos near 1, sinh, erf, ...) runs in float64 and is rounded
// once at the end; exp and log run in float32 for 16-bit floats and natively otherwise.
#pragma once

#include <vector>

#include "compiler/ir/tensor_builder.h"

namespace uop::onnx_import {

// Small readable wrappers over TensorBuilder for composites whose operand shapes are known
// to broadcast (the importer checks model operands before it gets here).
class Math {
 public:
  explicit Math(TensorBuilder& tb) : tb_(tb) {}
  TensorBuilder& tb() { return tb_; }

  const UOp* k(const UOp* like, double v);  // a scalar constant of like's dtype
  const UOp* add(const UOp* a, const UOp* b) { return tb_.alu(Op::ADD, {a, b}); }
  const UOp* sub(const UOp* a, const UOp* b) { return tb_.alu(Op::SUB, {a, b}); }
  const UOp* mul(const UOp* a, const UOp* b) { return tb_.alu(Op::MUL, {a, b}); }
  const UOp* div(const UOp* a, const UOp* b);  // FDIV on floats, IDIV (truncating) on ints
  const UOp* max(const UOp* a, const UOp* b) { return tb_.alu(Op::MAX, {a, b}); }
  const UOp* min(const UOp* a, const UOp* b) { return tb_.alu(Op::MIN, {a, b}); }
  const UOp* lt(const UOp* a, const UOp* b) { return tb_.alu(Op::CMPLT, {a, b}); }
  const UOp* eq(const UOp* a, const UOp* b) { return tb_.alu(Op::CMPEQ, {a, b}); }
  const UOp* ne(const UOp* a, const UOp* b) { return tb_.alu(Op::CMPNE, {a, b}); }
  const UOp* and_(const UOp* a, const UOp* b) { return tb_.alu(Op::AND, {a, b}); }
  const UOp* or_(const UOp* a, const UOp* b) { return tb_.alu(Op::OR, {a, b}); }
  const UOp* not_(const UOp* a);
  const UOp* where(const UOp* c, const UOp* a, const UOp* b) { return tb_.alu(Op::WHERE, {c, a, b}); }
  const UOp* neg(const UOp* a);
  const UOp* recip(const UOp* a) { return tb_.alu(Op::RECIPROCAL, {a}); }
  const UOp* sqrt(const UOp* a) { return tb_.alu(Op::SQRT, {a}); }
  const UOp* cast(const UOp* a, Scalar to) { return a->dtype().scalar == to ? a : tb_.cast(a, to); }
  // The sum / max / ... over `axes`, keeping them as size 1.
  const UOp* reduce(const UOp* a, ReduceOp op, std::vector<int64_t> axes) { return tb_.reduce(a, op, std::move(axes)); }

  // Elementwise functions of floats.
  const UOp* exp(const UOp* x);
  const UOp* log(const UOp* x);
  const UOp* abs(const UOp* x);  // ints too
  const UOp* sign(const UOp* x);  // ints too
  const UOp* floor(const UOp* x);
  const UOp* ceil(const UOp* x);
  const UOp* round_even(const UOp* x);  // halves to even, as ONNX Round and NumPy
  const UOp* sigmoid(const UOp* x);
  const UOp* tanh(const UOp* x);
  const UOp* erf(const UOp* x);
  const UOp* cos(const UOp* x);
  const UOp* tan(const UOp* x);
  const UOp* atan(const UOp* x);
  const UOp* asin(const UOp* x);
  const UOp* acos(const UOp* x);
  const UOp* sinh(const UOp* x);
  const UOp* cosh(const UOp* x);
  const UOp* asinh(const UOp* x);
  const UOp* acosh(const UOp* x);
  const UOp* atanh(const UOp* x);
  // x ** y on floats (ints go through float64, exact for the results they can hold).
  const UOp* pow(const UOp* x, const UOp* y);
  // C's fmod on floats (computed in float64): the sign follows x.
  const UOp* fmod(const UOp* x, const UOp* y);
  // Python's %: the sign follows y (ints; floats via fmod).
  const UOp* floor_mod(const UOp* x, const UOp* y);

  // f(x) computed in `wide` and rounded back to x's dtype.
  template <typename F>
  const UOp* in(Scalar wide, const UOp* x, F f) {
    Scalar t = x->dtype().scalar;
    if (t == wide) return f(x);
    return cast(f(cast(x, wide)), t);
  }
  // float32 for 16-bit floats, the dtype itself otherwise.
  static Scalar at_least_f32(Scalar s);

 private:
  const UOp* atan_wide(const UOp* x);  // x already float64
  TensorBuilder& tb_;
};

}  // namespace uop::onnx_import
