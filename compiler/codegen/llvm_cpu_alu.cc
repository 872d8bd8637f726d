// Lowers values to LLVM IR with ir/eval.h's semantics, which C and LLVM leave undefined
// in places: integer division by zero and INT_MIN / -1 are selected around (never UB),
// shift amounts are masked to the width, float -> int casts saturate (fptosi.sat), MAX /
// MIN propagate NaN and order -0 < +0 (llvm.maximum / minimum), MULACC is fused.
//
// Narrow floats round once per op, as eval.h does. float16 and bfloat16 compute + - * /
// sqrt in float32 and round the result once, which is exact: float32 has more than 2p+2
// bits, a product of two narrow values (<= 22 bits) is exact in float32 even at the
// magnitudes where float32 itself is subnormal, and an exhaustive check of every pair
// of bfloat16 significands at every exponent that lands near float32's subnormal range
// found no quotient that float32 rounds to a bfloat16 tie. Where a second rounding can
// differ (float64 -> narrow, int64 -> bfloat16, MULACC), the first rounding is to odd,
// which makes the final one exact. bfloat16 lives in i16 registers and every
// conversion is integer code, so no compiler-runtime helper (__truncsfbf2, absent from
// Debian 12's libgcc) is ever called.
#include "compiler/codegen/llvm_cpu_alu.h"

#include <bit>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

#include "absl/status/status.h"
#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"

namespace uop::llvm_cpu {
namespace {

using llvm::Constant;
using llvm::Type;
using llvm::Value;
namespace Intr = llvm::Intrinsic;

Type* scalar_type(llvm::IRBuilderBase& b, Scalar s) {
  switch (s) {
    case Scalar::Bool: return b.getInt1Ty();
    case Scalar::Int8: case Scalar::UInt8: return b.getInt8Ty();
    case Scalar::Int16: case Scalar::UInt16: case Scalar::BFloat16: return b.getInt16Ty();
    case Scalar::Int32: case Scalar::UInt32: return b.getInt32Ty();
    case Scalar::Int64: case Scalar::UInt64: case Scalar::Index: return b.getInt64Ty();
    case Scalar::Float16: return b.getHalfTy();
    case Scalar::Float32: return b.getFloatTy();
    case Scalar::Float64: return b.getDoubleTy();
    case Scalar::Void: return nullptr;
  }
  return nullptr;
}

// The lowering of one node: element-wise helpers that keep the vector shape of their input.
class Lower {
 public:
  explicit Lower(llvm::IRBuilderBase& b) : b_(b) {}

  Type* shaped(Value* like, Type* elem) {
    if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(like->getType()))
      return llvm::FixedVectorType::get(elem, vt->getNumElements());
    return elem;
  }
  Constant* ci(Value* like, Type* elem, uint64_t v) { return llvm::ConstantInt::get(shaped(like, elem), v); }
  Constant* cf(Value* like, Type* elem, double v) { return llvm::ConstantFP::get(shaped(like, elem), v); }
  Value* intr(Intr::ID id, Value* a) { return b_.CreateUnaryIntrinsic(id, a); }
  Value* intr(Intr::ID id, Value* a, Value* c) { return b_.CreateBinaryIntrinsic(id, a, c); }

  // --- float formats -------------------------------------------------------------------
  Value* bf16_to_f32(Value* v) {
    Value* w = b_.CreateZExt(v, shaped(v, b_.getInt32Ty()));
    return b_.CreateBitCast(b_.CreateShl(w, 16), shaped(v, b_.getFloatTy()));
  }
  // Round to nearest even on the bits; NaN stays a quiet NaN of the same sign.
  Value* f32_to_bf16(Value* v) {
    Type* i32 = b_.getInt32Ty();
    Value* bits = b_.CreateBitCast(v, shaped(v, i32));
    Value* hi = b_.CreateLShr(bits, 16);
    Value* odd = b_.CreateAnd(hi, ci(v, i32, 1));
    Value* rounded = b_.CreateLShr(b_.CreateAdd(b_.CreateAdd(bits, ci(v, i32, 0x7fff)), odd), 16);
    Value* quiet = b_.CreateOr(hi, ci(v, i32, 0x40));
    Value* r = b_.CreateSelect(b_.CreateFCmpUNO(v, v), quiet, rounded);
    return b_.CreateTrunc(r, shaped(v, b_.getInt16Ty()));
  }
  // float64 -> float32 rounded to odd: inexact results get an odd last bit, so a later
  // rounding to <= 22 bits is a correct single rounding of the float64 value.
  Value* f64_to_f32_odd(Value* v) {
    Type* i32 = b_.getInt32Ty();
    Value* t = b_.CreateFPTrunc(v, shaped(v, b_.getFloatTy()));
    Value* back = b_.CreateFPExt(t, v->getType());
    Value* inexact = b_.CreateFCmpONE(back, v);
    Value* tb = b_.CreateBitCast(t, shaped(v, i32));
    Value* even = b_.CreateICmpEQ(b_.CreateAnd(tb, ci(v, i32, 1)), ci(v, i32, 0));
    Value* grow = b_.CreateFCmpOLT(intr(Intr::fabs, back), intr(Intr::fabs, v));
    Value* adj = b_.CreateSelect(grow, b_.CreateAdd(tb, ci(v, i32, 1)), b_.CreateSub(tb, ci(v, i32, 1)));
    Value* r = b_.CreateSelect(b_.CreateAnd(inexact, even), adj, tb);
    return b_.CreateBitCast(r, t->getType());
  }
  // Exact widening of a float of kind `s` to float32 (float16, bfloat16, float32).
  Value* to_f32(Value* v, Scalar s) {
    if (s == Scalar::Float16) return b_.CreateFPExt(v, shaped(v, b_.getFloatTy()));
    if (s == Scalar::BFloat16) return bf16_to_f32(v);
    return v;
  }
  Value* to_f64(Value* v, Scalar s) {
    if (s == Scalar::Float64) return v;
    return b_.CreateFPExt(to_f32(v, s), shaped(v, b_.getDoubleTy()));
  }
  // One correct rounding from float32 / float64 to kind `to`.
  Value* from_f32(Value* v, Scalar to) {
    if (to == Scalar::Float16) return b_.CreateFPTrunc(v, shaped(v, b_.getHalfTy()));
    if (to == Scalar::BFloat16) return f32_to_bf16(v);
    if (to == Scalar::Float64) return b_.CreateFPExt(v, shaped(v, b_.getDoubleTy()));
    return v;
  }
  Value* from_f64(Value* v, Scalar to) {
    if (to == Scalar::Float64) return v;
    if (to == Scalar::Float32) return b_.CreateFPTrunc(v, shaped(v, b_.getFloatTy()));
    return from_f32(f64_to_f32_odd(v), to);
  }
  // Narrow floats compute in float32 (see the file comment), float64 in itself.
  Value* from_wide(Value* v, Scalar to) {
    return v->getType()->getScalarType()->isDoubleTy() ? from_f64(v, to) : from_f32(v, to);
  }

  // int64 / uint64 -> float32 rounded to odd (for int -> bfloat16, one rounding in all).
  Value* i64_to_f32_odd(Value* v, bool is_signed) {
    Type* i64 = b_.getInt64Ty();
    Value* neg = is_signed ? b_.CreateICmpSLT(v, ci(v, i64, 0)) : nullptr;
    Value* mag = neg ? b_.CreateSelect(neg, b_.CreateNeg(v), v) : v;
    Value* lz = intr(Intr::ctlz, mag, b_.getFalse());
    Value* shift = intr(Intr::smax, b_.CreateSub(ci(v, i64, 40), lz), ci(v, i64, 0));
    Value* keep = b_.CreateLShr(mag, shift);
    Value* low = b_.CreateAnd(mag, b_.CreateSub(b_.CreateShl(ci(v, i64, 1), shift), ci(v, i64, 1)));
    keep = b_.CreateOr(keep, b_.CreateZExt(b_.CreateICmpNE(low, ci(v, i64, 0)), shaped(v, i64)));
    Type* f32 = shaped(v, b_.getFloatTy());
    Value* f = b_.CreateUIToFP(keep, f32);
    Value* e = b_.CreateTrunc(b_.CreateAdd(shift, ci(v, i64, 127)), shaped(v, b_.getInt32Ty()));
    Value* scale = b_.CreateBitCast(b_.CreateShl(e, 23), f32);
    Value* r = b_.CreateFMul(f, scale);
    return neg ? b_.CreateSelect(neg, b_.CreateFNeg(r), r) : r;
  }

  Value* int_to_float(Value* v, Scalar from, Scalar to) {
    bool sgn = scalar_is_signed_int(from);
    int bits = scalar_bits(from);
    auto itofp = [&](Type* elem) {
      return sgn ? b_.CreateSIToFP(v, shaped(v, elem)) : b_.CreateUIToFP(v, shaped(v, elem));
    };
    switch (to) {
      case Scalar::Float64: return itofp(b_.getDoubleTy());
      case Scalar::Float32: return itofp(b_.getFloatTy());
      // Integers below 65520 are exact in float32 and the rest overflow either way.
      case Scalar::Float16: return from_f32(itofp(b_.getFloatTy()), to);
      default:  // bfloat16
        if (bits <= 16) return f32_to_bf16(itofp(b_.getFloatTy()));
        if (bits <= 32) return from_f64(itofp(b_.getDoubleTy()), to);
        return f32_to_bf16(i64_to_f32_odd(v, sgn));
    }
  }

  // --- ops -------------------------------------------------------------------------------
  Value* cast(Value* v, Scalar from, Scalar to, Type* to_ty) {
    if (from == to) return v;
    if (to == Scalar::Bool) {
      if (scalar_is_float(from)) {
        Value* w = to_f32(v, from);
        return b_.CreateFCmpUNE(w, llvm::Constant::getNullValue(w->getType()));
      }
      return b_.CreateICmpNE(v, llvm::Constant::getNullValue(v->getType()));
    }
    if (from == Scalar::Bool) {
      if (!scalar_is_float(to)) return b_.CreateZExt(v, to_ty);
      ConstValue one = ConstValue::Float(1), zero = ConstValue::Float(0);
      DType d(to, to_ty->isVectorTy() ? llvm::cast<llvm::FixedVectorType>(to_ty)->getNumElements() : 1);
      return b_.CreateSelect(v, constant(b_, d, {&one, 1}), constant(b_, d, {&zero, 1}));
    }
    if (scalar_is_float(from) && scalar_is_float(to)) {
      if (to == Scalar::Float64) return to_f64(v, from);
      if (from == Scalar::Float64) return from_f64(v, to);
      return from_f32(to_f32(v, from), to);
    }
    if (scalar_is_float(from)) {  // -> int: truncate, saturate, NaN -> 0
      Value* w = to_f32(v, from);
      auto id = scalar_is_signed_int(to) ? Intr::fptosi_sat : Intr::fptoui_sat;
      return b_.CreateIntrinsic(id, {to_ty, w->getType()}, {w});
    }
    if (scalar_is_float(to)) return int_to_float(v, from, to);
    int fb = scalar_bits(from), tb = scalar_bits(to);  // int -> int wraps
    if (tb < fb) return b_.CreateTrunc(v, to_ty);
    if (tb > fb) return scalar_is_signed_int(from) ? b_.CreateSExt(v, to_ty) : b_.CreateZExt(v, to_ty);
    return v;
  }

  Value* int_op(Op op, Scalar s, std::span<Value* const> a) {
    bool sgn = scalar_is_signed_int(s);
    Type* et = a[0]->getType()->getScalarType();
    Value* x = a[0];
    Value* y = a.size() > 1 ? a[1] : nullptr;
    auto zero = [&] { return ci(x, et, 0); };
    switch (op) {
      case Op::NEG: return b_.CreateNeg(x);
      case Op::ADD: return b_.CreateAdd(x, y);
      case Op::SUB: return b_.CreateSub(x, y);
      case Op::MUL: return b_.CreateMul(x, y);
      case Op::MULACC: return b_.CreateAdd(b_.CreateMul(x, y), a[2]);
      case Op::IDIV:
      case Op::MOD: {
        Value* is0 = b_.CreateICmpEQ(y, zero());
        Value* m1 = sgn ? b_.CreateICmpEQ(y, llvm::Constant::getAllOnesValue(y->getType())) : nullptr;
        Value* safe = b_.CreateSelect(m1 ? b_.CreateOr(is0, m1) : is0, ci(x, et, 1), y);
        if (op == Op::MOD)  // x % 0 = x; x % -1 = x % 1 = 0
          return b_.CreateSelect(is0, x, sgn ? b_.CreateSRem(x, safe) : b_.CreateURem(x, safe));
        Value* q = sgn ? b_.CreateSDiv(x, safe) : b_.CreateUDiv(x, safe);
        q = b_.CreateSelect(is0, zero(), q);
        return m1 ? b_.CreateSelect(m1, b_.CreateNeg(x), q) : q;  // INT_MIN / -1 wraps
      }
      case Op::MAX: return intr(sgn ? Intr::smax : Intr::umax, x, y);
      case Op::MIN: return intr(sgn ? Intr::smin : Intr::umin, x, y);
      case Op::CMPLT: return sgn ? b_.CreateICmpSLT(x, y) : b_.CreateICmpULT(x, y);
      case Op::CMPNE: return b_.CreateICmpNE(x, y);
      case Op::CMPEQ: return b_.CreateICmpEQ(x, y);
      case Op::AND: return b_.CreateAnd(x, y);
      case Op::OR: return b_.CreateOr(x, y);
      case Op::XOR: return b_.CreateXor(x, y);
      case Op::SHL:
      case Op::SHR: {
        Value* amt = b_.CreateAnd(y, ci(x, et, scalar_bits(s) - 1));
        if (op == Op::SHL) return b_.CreateShl(x, amt);
        return sgn ? b_.CreateAShr(x, amt) : b_.CreateLShr(x, amt);
      }
      default: return nullptr;
    }
  }

  Value* bool_op(Op op, std::span<Value* const> a) {
    Value* x = a[0];
    Value* y = a.size() > 1 ? a[1] : nullptr;
    switch (op) {
      case Op::AND: case Op::MIN: return b_.CreateAnd(x, y);
      case Op::OR: case Op::MAX: return b_.CreateOr(x, y);
      case Op::XOR: case Op::CMPNE: return b_.CreateXor(x, y);
      case Op::CMPEQ: return b_.CreateICmpEQ(x, y);
      case Op::CMPLT: return b_.CreateAnd(b_.CreateNot(x), y);
      default: return nullptr;
    }
  }

  // MULACC below float32: a*b is exact in float64; the sum is rounded to odd there
  // (TwoSum gives the exact error), then to odd at float32, then once to the type.
  Value* narrow_fma(Scalar s, std::span<Value* const> a) {
    Value* x = to_f64(a[0], s);
    Value* p = b_.CreateFMul(x, to_f64(a[1], s));
    Value* z = to_f64(a[2], s);
    Value* sum = b_.CreateFAdd(p, z);
    Value* bb = b_.CreateFSub(sum, p);
    Value* err = b_.CreateFAdd(b_.CreateFSub(p, b_.CreateFSub(sum, bb)), b_.CreateFSub(z, bb));
    Type* i64 = b_.getInt64Ty();
    Value* bits = b_.CreateBitCast(sum, shaped(x, i64));
    Value* even = b_.CreateICmpEQ(b_.CreateAnd(bits, ci(x, i64, 1)), ci(x, i64, 0));
    Value* finite = b_.CreateFCmpOLT(intr(Intr::fabs, sum), cf(x, b_.getDoubleTy(), INFINITY));
    Value* inexact = b_.CreateFCmpONE(err, cf(x, b_.getDoubleTy(), 0));
    Value* away = b_.CreateICmpEQ(b_.CreateFCmpOGT(err, cf(x, b_.getDoubleTy(), 0)),
                                  b_.CreateFCmpOGT(sum, cf(x, b_.getDoubleTy(), 0)));
    Value* adj = b_.CreateSelect(away, b_.CreateAdd(bits, ci(x, i64, 1)), b_.CreateSub(bits, ci(x, i64, 1)));
    Value* odd = b_.CreateSelect(b_.CreateAnd(b_.CreateAnd(finite, inexact), even), adj, bits);
    return from_f64(b_.CreateBitCast(odd, sum->getType()), s);
  }

  // 2^x for float32 and the narrower floats in vector code rather than a libm call per
  // lane (sigmoid's and softmax's exp were scalar calls, a sixth of a recurrent model's
  // worker time). In float64: 2^x = 2^n 2^f with n the integer nearest x (the 1.5 * 2^52
  // trick: adding it leaves n in the low bits, with plain vector adds on AVX2 too) and
  // |f| <= 1/2; 2^f = e^(f ln 2) by its Taylor series to degree 10, whose truncation is
  // below 3e-13 relative and its rounding a few float64 ULPs, far under float32's half
  // ULP of 6e-8, so the one rounding to the type at the end is the correct one in all
  // but vanishingly rare ties (within 1 ULP always, as llvm_cpu.h bounds it); 2^n by its
  // exponent bits, exact. x is clamped to [-300, 300] first, where 2^x rounds to 0 or
  // infinity in float32 as it would unclamped; NaN stays NaN; 2^k of an integer k is exact.
  Value* exp2_narrow(Value* v, Scalar s) {
    Type* d = b_.getDoubleTy();
    Type* i64 = b_.getInt64Ty();
    Value* x = to_f64(v, s);
    Value* c = intr(Intr::minnum, intr(Intr::maxnum, x, cf(x, d, -300)), cf(x, d, 300));
    constexpr double kShifter = 6755399441055744.0;  // 1.5 * 2^52
    Value* t = b_.CreateFAdd(c, cf(x, d, kShifter));
    Value* n = b_.CreateFSub(t, cf(x, d, kShifter));
    Value* f = b_.CreateFSub(c, n);  // exact
    double coeff[11];
    coeff[0] = 1;
    for (int k = 1; k <= 10; ++k) coeff[k] = coeff[k - 1] * 0.6931471805599453 / k;  // (ln 2)^k / k!
    Value* p = cf(x, d, coeff[10]);
    for (int k = 9; k >= 0; --k) p = b_.CreateIntrinsic(Intr::fma, {p->getType()}, {p, f, cf(x, d, coeff[k])});
    Value* ni = b_.CreateSub(b_.CreateBitCast(t, shaped(x, i64)), ci(x, i64, std::bit_cast<uint64_t>(kShifter)));
    Value* scale = b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(ni, ci(x, i64, 1023)), 52), shaped(x, d));
    Value* r = b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, b_.CreateFMul(p, scale));
    return from_f64(r, s);
  }

  Value* float_op(Op op, Scalar s, std::span<Value* const> a) {
    switch (op) {
      case Op::NEG:  // a sign flip, no rounding
        if (s == Scalar::BFloat16) return b_.CreateXor(a[0], ci(a[0], b_.getInt16Ty(), 0x8000));
        return b_.CreateFNeg(a[0]);
      case Op::ADD: case Op::SUB: case Op::MUL: case Op::FDIV: {
        Value* x = to_f32(a[0], s);
        Value* y = to_f32(a[1], s);
        Value* r = op == Op::ADD ? b_.CreateFAdd(x, y)
                 : op == Op::SUB ? b_.CreateFSub(x, y)
                 : op == Op::MUL ? b_.CreateFMul(x, y)
                                 : b_.CreateFDiv(x, y);
        return from_wide(r, s);
      }
      case Op::RECIPROCAL: {
        Value* x = to_f32(a[0], s);
        return from_wide(b_.CreateFDiv(llvm::ConstantFP::get(x->getType(), 1.0), x), s);
      }
      case Op::SQRT: return from_wide(intr(Intr::sqrt, to_f32(a[0], s)), s);
      case Op::TRUNC: return from_wide(intr(Intr::trunc, to_f32(a[0], s)), s);
      case Op::EXP2:
        if (s == Scalar::Float64) return intr(Intr::exp2, a[0]);
        return exp2_narrow(a[0], s);
      case Op::LOG2: return from_wide(intr(Intr::log2, to_f32(a[0], s)), s);
      case Op::SIN: return from_wide(intr(Intr::sin, to_f32(a[0], s)), s);
      case Op::POW: return from_wide(intr(Intr::pow, to_f32(a[0], s), to_f32(a[1], s)), s);
      case Op::MAX: case Op::MIN: {
        Value* x = to_f32(a[0], s);
        Value* y = to_f32(a[1], s);
        if (s != Scalar::Float16) return from_wide(intr(op == Op::MAX ? Intr::maximum : Intr::minimum, x, y), s);
        // LLVM 19 narrows fpext/maximum/fptrunc to llvm.maximum on half vectors, whose
        // x86 lowering without avx512fp16 returns 0 for maximum(0, NaN). Spelled out with
        // compares and selects, the NaN and signed-zero rules of eval.h hold.
        Value* nan = llvm::ConstantFP::getNaN(x->getType());
        Value* unordered = b_.CreateFCmpUNO(x, y);
        Value* x_wins = op == Op::MAX ? b_.CreateFCmpOGT(x, y) : b_.CreateFCmpOLT(x, y);
        Value* tie = b_.CreateFCmpOEQ(x, y);  // only zeros of either sign can tie unequal bits
        Value* x_negative = b_.CreateICmpSLT(b_.CreateBitCast(x, shaped(x, b_.getInt32Ty())), ci(x, b_.getInt32Ty(), 0));
        Value* tie_pick = op == Op::MAX ? b_.CreateSelect(x_negative, y, x) : b_.CreateSelect(x_negative, x, y);
        Value* r = b_.CreateSelect(x_wins, x, b_.CreateSelect(tie, tie_pick, y));
        return from_wide(b_.CreateSelect(unordered, nan, r), s);
      }
      case Op::CMPLT: return b_.CreateFCmpOLT(to_f32(a[0], s), to_f32(a[1], s));
      case Op::CMPNE: return b_.CreateFCmpUNE(to_f32(a[0], s), to_f32(a[1], s));
      case Op::CMPEQ: return b_.CreateFCmpOEQ(to_f32(a[0], s), to_f32(a[1], s));
      case Op::MULACC:
        if (s == Scalar::Float32 || s == Scalar::Float64)
          return b_.CreateIntrinsic(Intr::fma, {a[0]->getType()}, {a[0], a[1], a[2]});
        return narrow_fma(s, a);
      default: return nullptr;
    }
  }

 private:
  llvm::IRBuilderBase& b_;
};

}  // namespace

Type* value_type(llvm::IRBuilderBase& b, DType d) {
  if (d.ptr || d.count == 0) return nullptr;
  Type* t = scalar_type(b, d.scalar);
  if (!t || d.count == 1) return t;
  return llvm::FixedVectorType::get(t, d.count);
}

Type* memory_type(llvm::IRBuilderBase& b, DType d) {
  if (d.scalar != Scalar::Bool) return value_type(b, d.pointee());
  DType bytes = d.pointee();
  bytes.scalar = Scalar::UInt8;
  return value_type(b, bytes);
}

Value* to_memory(llvm::IRBuilderBase& b, Value* v, DType d) {
  return d.scalar == Scalar::Bool ? b.CreateZExt(v, memory_type(b, d)) : v;
}

Value* from_memory(llvm::IRBuilderBase& b, Value* v, DType d) {
  // eval.h reads a bool as its lowest bit.
  return d.scalar == Scalar::Bool ? b.CreateTrunc(v, value_type(b, d.pointee())) : v;
}

Constant* constant(llvm::IRBuilderBase& b, DType d, std::span<const ConstValue> lanes) {
  Type* et = scalar_type(b, d.scalar);
  llvm::SmallVector<Constant*, 8> cs;
  for (const ConstValue& raw : lanes) {
    uint64_t bits = value_to_bits(cast_value(raw, d.scalar), d.scalar);
    switch (d.scalar) {
      case Scalar::Float16:
        cs.push_back(llvm::ConstantFP::get(b.getContext(), llvm::APFloat(llvm::APFloat::IEEEhalf(), llvm::APInt(16, bits))));
        break;
      case Scalar::Float32:
        cs.push_back(llvm::ConstantFP::get(b.getContext(), llvm::APFloat(llvm::APFloat::IEEEsingle(), llvm::APInt(32, bits))));
        break;
      case Scalar::Float64:
        cs.push_back(llvm::ConstantFP::get(b.getContext(), llvm::APFloat(llvm::APFloat::IEEEdouble(), llvm::APInt(64, bits))));
        break;
      default: cs.push_back(llvm::ConstantInt::get(et, bits));  // value_to_bits is zero-extended
    }
  }
  if (d.count == 1) return cs[0];
  if (cs.size() == 1) return llvm::ConstantVector::getSplat(llvm::ElementCount::getFixed(d.count), cs[0]);
  return llvm::ConstantVector::get(cs);
}

Value* lower_alu(llvm::IRBuilderBase& b, const UOp* u, std::span<Value* const> srcs) {
  Lower lw(b);
  const Op op = u->op();
  const DType out = u->dtype();
  Type* out_ty = value_type(b, out);
  if (op == Op::CAST) return lw.cast(srcs[0], u->src(0)->dtype().scalar, out.scalar, out_ty);
  if (op == Op::BITCAST) return b.CreateBitCast(srcs[0], out_ty);
  if (op == Op::WHERE) return b.CreateSelect(srcs[0], srcs[1], srcs[2]);
  // Operand type: the values' dtype (WHERE's condition aside, all operands have it).
  const Scalar t = u->src(0)->dtype().scalar;
  return t == Scalar::Bool ? lw.bool_op(op, srcs)
       : scalar_is_float(t) ? lw.float_op(op, t, srcs)
                            : lw.int_op(op, t, srcs);
}

Value* lower_vector(llvm::IRBuilderBase& b, const UOp* u, std::span<Value* const> srcs) {
  std::vector<std::pair<Value*, int64_t>> lanes;  // (source, lane; -1 for a scalar source)
  for (size_t k = 0; k < u->num_src(); ++k) {
    const DType d = u->src(k)->dtype();
    for (uint32_t i = 0; i < d.count; ++i) lanes.push_back({srcs[k], d.is_vector() ? int64_t{i} : -1});
  }
  if (u->is(Op::GEP)) {
    std::vector<std::pair<Value*, int64_t>> picked;
    for (int64_t i : u->arg_as<IntsArg>().values) picked.push_back(lanes[i]);
    lanes = std::move(picked);
  }
  auto lane = [&](const std::pair<Value*, int64_t>& l) {
    return l.second < 0 ? l.first : b.CreateExtractElement(l.first, static_cast<uint64_t>(l.second));
  };
  if (lanes.size() == 1) return lane(lanes[0]);
  Value* r = llvm::PoisonValue::get(value_type(b, u->dtype()));
  for (size_t i = 0; i < lanes.size(); ++i) r = b.CreateInsertElement(r, lane(lanes[i]), uint64_t{i});
  return r;
}

}  // namespace uop::llvm_cpu
