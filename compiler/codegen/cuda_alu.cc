// CUDA C for values, one scalar lane at a time. C++ leaves signed overflow, division by
// zero, over-wide shifts and out-of-range float -> int conversions undefined, and eval.h
// defines them all, so integer arithmetic is done in the unsigned type of its width and
// converted back (wrap-around), division and remainder go through guarded helpers, shift
// amounts are masked, and float -> int conversions saturate in a helper. Floats use the
// IEEE operations NVRTC emits with --fmad=false; float16 / bfloat16 are widened to
// float32 exactly and rounded back once per op, which is exact for + - * / sqrt (float32
// has more than 2p+2 bits), and their MULACC rounds to odd first (cuda_prelude.cc).
#include "compiler/codegen/cuda_alu.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"

namespace uop::cuda_c {
namespace {

std::string hex(uint64_t bits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, bits);
  return buf;
}

bool narrow_float(Scalar s) { return s == Scalar::Float16 || s == Scalar::BFloat16; }
// float16 / bfloat16 bits <-> float32, and float64 -> them with one rounding.
std::string widen(Scalar s, const std::string& x) {
  return cat(s == Scalar::Float16 ? "uop_f16_to_f32(" : "uop_bf16_to_f32(", x, ")");
}
std::string narrow(Scalar s, const std::string& x) {
  return cat(s == Scalar::Float16 ? "uop_f32_to_f16(" : "uop_f32_to_bf16(", x, ")");
}
std::string narrow64(Scalar s, const std::string& x) {
  return cat(s == Scalar::Float16 ? "uop_f64_to_f16(" : "uop_f64_to_bf16(", x, ")");
}
// The unsigned type integer arithmetic of `s` wraps in (at least 32 bits, as C promotes).
std::string_view wrap_type(Scalar s) { return scalar_bits(s) > 32 ? "unsigned long long" : "unsigned"; }

std::string int_op(Op op, Scalar s, std::span<const std::string> a) {
  const std::string T(reg_type(s));
  const std::string U(wrap_type(s));
  const bool sgn = scalar_is_signed_int(s);
  auto wrap = [&](const std::string& e) { return cat("((", T, ")(", e, "))"); };
  auto u = [&](const std::string& x) { return cat("(", U, ")(", x, ")"); };
  switch (op) {
    case Op::NEG: return wrap(cat("(", U, ")0 - ", u(a[0])));
    case Op::ADD: return wrap(cat(u(a[0]), " + ", u(a[1])));
    case Op::SUB: return wrap(cat(u(a[0]), " - ", u(a[1])));
    case Op::MUL: return wrap(cat(u(a[0]), " * ", u(a[1])));
    case Op::MULACC: return wrap(cat(u(a[0]), " * ", u(a[1]), " + ", u(a[2])));
    case Op::IDIV:
      return sgn ? cat("uop_idiv_s<", T, ", ", U, ">(", a[0], ", ", a[1], ")") : cat("uop_idiv_u<", T, ">(", a[0], ", ", a[1], ")");
    case Op::MOD:
      return sgn ? cat("uop_mod_s<", T, ">(", a[0], ", ", a[1], ")") : cat("uop_mod_u<", T, ">(", a[0], ", ", a[1], ")");
    case Op::MAX: return cat("((", a[0], ") > (", a[1], ") ? (", a[0], ") : (", a[1], "))");
    case Op::MIN: return cat("((", a[0], ") < (", a[1], ") ? (", a[0], ") : (", a[1], "))");
    case Op::CMPLT: return cat("((", a[0], ") < (", a[1], "))");
    case Op::CMPNE: return cat("((", a[0], ") != (", a[1], "))");
    case Op::CMPEQ: return cat("((", a[0], ") == (", a[1], "))");
    case Op::AND: return wrap(cat(u(a[0]), " & ", u(a[1])));
    case Op::OR: return wrap(cat(u(a[0]), " | ", u(a[1])));
    case Op::XOR: return wrap(cat(u(a[0]), " ^ ", u(a[1])));
    case Op::SHL: return wrap(cat(u(a[0]), " << (", u(a[1]), " & ", scalar_bits(s) - 1, "u)"));
    // Signed: the value promoted to int / long long shifts arithmetically; unsigned
    // narrow types promote to a non-negative int, which shifts logically.
    case Op::SHR: return wrap(cat("(", a[0], ") >> (", u(a[1]), " & ", scalar_bits(s) - 1, "u)"));
    default: return "";
  }
}

std::string bool_op(Op op, std::span<const std::string> a) {
  switch (op) {
    case Op::AND: case Op::MIN: return cat("((", a[0], ") && (", a[1], "))");
    case Op::OR: case Op::MAX: return cat("((", a[0], ") || (", a[1], "))");
    case Op::XOR: case Op::CMPNE: return cat("((", a[0], ") != (", a[1], "))");
    case Op::CMPEQ: return cat("((", a[0], ") == (", a[1], "))");
    case Op::CMPLT: return cat("(!(", a[0], ") && (", a[1], "))");
    default: return "";
  }
}

// float32 / float64 natively; float16 / bfloat16 through float32 (see the file comment).
std::string float_op(Op op, Scalar s, std::span<const std::string> a) {
  const bool nar = narrow_float(s);
  const bool f64 = s == Scalar::Float64;
  auto w = [&](size_t i) { return nar ? widen(s, a[i]) : cat("(", a[i], ")"); };
  auto back = [&](const std::string& e) { return nar ? narrow(s, e) : cat("(", e, ")"); };
  // Transcendentals in float64, rounded once to the type.
  auto via_f64 = [&](std::string_view fn, size_t n) {
    std::string e = cat(fn, "(");
    for (size_t i = 0; i < n; ++i) e += cat(i ? ", " : "", "(double)", w(i));
    e += ")";
    if (f64) return e;
    return nar ? narrow64(s, e) : cat("((float)", e, ")");
  };
  switch (op) {
    case Op::NEG:  // a sign flip, no rounding
      return nar ? cat("((", reg_type(s), ")((", a[0], ") ^ 0x8000u))") : cat("(-(", a[0], "))");
    case Op::ADD: return back(cat(w(0), " + ", w(1)));
    case Op::SUB: return back(cat(w(0), " - ", w(1)));
    case Op::MUL: return back(cat(w(0), " * ", w(1)));
    case Op::FDIV: return back(cat(w(0), " / ", w(1)));
    case Op::RECIPROCAL: return back(cat(f64 ? "1.0" : "1.0f", " / ", w(0)));
    case Op::SQRT: return back(cat(f64 ? "sqrt(" : "sqrtf(", w(0), ")"));
    case Op::TRUNC: return back(cat(f64 ? "trunc(" : "truncf(", w(0), ")"));
    case Op::EXP2: return via_f64("exp2", 1);
    case Op::LOG2: return via_f64("log2", 1);
    case Op::SIN: return via_f64("sin", 1);
    case Op::POW: return via_f64("pow", 2);
    case Op::MAX: return back(cat("uop_fmax(", w(0), ", ", w(1), ")"));
    case Op::MIN: return back(cat("uop_fmin(", w(0), ", ", w(1), ")"));
    case Op::CMPLT: return cat("(", w(0), " < ", w(1), ")");
    case Op::CMPNE: return cat("(", w(0), " != ", w(1), ")");
    case Op::CMPEQ: return cat("(", w(0), " == ", w(1), ")");
    case Op::MULACC:
      if (nar) return narrow64(s, cat("uop_fma_odd((double)", w(0), ", (double)", w(1), ", (double)", w(2), ")"));
      return cat(f64 ? "fma(" : "fmaf(", a[0], ", ", a[1], ", ", a[2], ")");
    default: return "";
  }
}

}  // namespace

std::string_view reg_type(Scalar s) {
  switch (s) {
    case Scalar::Bool: return "bool";
    case Scalar::Int8: return "signed char";
    case Scalar::Int16: return "short";
    case Scalar::Int32: return "int";
    case Scalar::Int64: case Scalar::Index: return "long long";
    case Scalar::UInt8: return "unsigned char";
    case Scalar::UInt16: return "unsigned short";
    case Scalar::UInt32: return "unsigned";
    case Scalar::UInt64: return "unsigned long long";
    case Scalar::Float16: return "uop_f16";
    case Scalar::BFloat16: return "uop_bf16";
    case Scalar::Float32: return "float";
    case Scalar::Float64: return "double";
    case Scalar::Void: return "";
  }
  return "";
}

std::string_view mem_type(Scalar s) { return s == Scalar::Bool ? "unsigned char" : reg_type(s); }

std::string from_memory(Scalar s, const std::string& x) {
  return s == Scalar::Bool ? cat("(((", x, ") & 1) != 0)") : x;
}

std::string to_memory(Scalar s, const std::string& x) {
  return s == Scalar::Bool ? cat("((unsigned char)(", x, "))") : x;
}

std::string constant(Scalar s, ConstValue raw) {
  ConstValue v = cast_value(raw, s);
  uint64_t bits = value_to_bits(v, s);
  switch (s) {
    case Scalar::Bool: return v.as_bool() ? "true" : "false";
    case Scalar::Float16: case Scalar::BFloat16: return cat("((", reg_type(s), ")", hex(bits), "u)");
    case Scalar::Float32: case Scalar::Float64: {
      double d = v.as_float();
      // Small integers read best as literals; everything else as its exact bit pattern.
      if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) <= 16777216.0 && !(d == 0 && std::signbit(d)))
        return cat("(", static_cast<int64_t>(d), s == Scalar::Float32 ? ".0f)" : ".0)");
      if (s == Scalar::Float32) return cat("__uint_as_float(", hex(bits), "u)");
      return cat("__longlong_as_double((long long)", hex(bits), "ull)");
    }
    default: break;
  }
  const std::string T(reg_type(s));
  if (scalar_is_unsigned_int(s)) return cat("((", T, ")", v.as_uint(), "ull)");
  int64_t i = v.as_int();
  if (i == INT64_MIN) return cat("((", T, ")(-9223372036854775807ll - 1))");
  return cat("((", T, ")", i, "ll)");
}

absl::Status check_alu(const UOp* u) {
  if (!u->is(Op::BITCAST)) return absl::OkStatus();
  // Lane by lane: each lane of the result is one lane of the source, reinterpreted.
  const DType in = u->src(0)->dtype(), out = u->dtype();
  if (in.count != out.count)
    return absl::InvalidArgumentError(
        cat("BITCAST from ", in.str(), " to ", out.str(), " changes the vector width; the CUDA backend bitcasts lane by lane [cuda.bitcast]"));
  return absl::OkStatus();
}

std::string alu(Op op, Scalar t, std::span<const std::string> a) {
  if (op == Op::WHERE) return cat("((", a[0], ") ? (", a[1], ") : (", a[2], "))");
  if (t == Scalar::Bool) return bool_op(op, a);
  if (scalar_is_float(t)) return float_op(op, t, a);
  return int_op(op, t, a);
}

std::string cast(Scalar from, Scalar to, const std::string& x) {
  if (from == to) return x;
  const std::string T(reg_type(to));
  if (to == Scalar::Bool) {
    if (narrow_float(from)) return cat("(((", x, ") & 0x7fffu) != 0)");  // NaN -> true, -0 -> false
    return cat("((", x, ") != 0)");
  }
  if (from == Scalar::Bool) {
    if (!scalar_is_float(to)) return cat("((", T, ")(", x, "))");
    return cat("((", x, ") ? ", constant(to, ConstValue::Int(1)), " : ", constant(to, ConstValue::Int(0)), ")");
  }
  const bool ff = scalar_is_float(from), ft = scalar_is_float(to);
  if (ff && ft) {
    std::string wide = narrow_float(from) ? widen(from, x) : x;  // exact
    if (to == Scalar::Float64) return cat("((double)", wide, ")");
    if (from == Scalar::Float64) return to == Scalar::Float32 ? cat("((float)(", x, "))") : narrow64(to, x);
    return to == Scalar::Float32 ? wide : narrow(to, wide);
  }
  if (ff) {  // -> int: truncate, saturate, NaN -> 0
    std::string wide = narrow_float(from) ? widen(from, x) : x;
    return cat(scalar_is_signed_int(to) ? "uop_sat_s<" : "uop_sat_u<", T, ">(", wide, ")");
  }
  if (ft) {  // int -> float: one rounding
    const int bits = scalar_bits(from);
    switch (to) {
      case Scalar::Float64: return cat("((double)(", x, "))");
      case Scalar::Float32: return cat("((float)(", x, "))");
      // Integers below 65520 are exact in float32 and the rest overflow either way.
      case Scalar::Float16: return narrow(to, cat("(float)(", x, ")"));
      default:
        if (bits <= 16) return narrow(to, cat("(float)(", x, ")"));
        if (bits <= 32) return narrow64(to, cat("(double)(", x, ")"));
        return narrow(to, cat(scalar_is_signed_int(from) ? "uop_i64_to_f32_odd(" : "uop_u64_to_f32_odd(", x, ")"));
    }
  }
  return cat("((", T, ")(", x, "))");  // int -> int wraps
}

std::string bitcast(Scalar from, Scalar to, const std::string& x) {
  if (from == to) return x;
  if (from == Scalar::Float32) return cat(scalar_is_signed_int(to) ? "__float_as_int(" : "__float_as_uint(", x, ")");
  if (to == Scalar::Float32) return cat("__uint_as_float((unsigned)(", x, "))");
  if (from == Scalar::Float64) return cat("((", reg_type(to), ")__double_as_longlong(", x, "))");
  if (to == Scalar::Float64) return cat("__longlong_as_double((long long)(", x, "))");
  return cat("((", reg_type(to), ")(", x, "))");  // same width: the bits carry over
}

}  // namespace uop::cuda_c
