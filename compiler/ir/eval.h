// The exact scalar semantics of every ALU op, CAST and BITCAST, for every dtype. Constant
// folding and the reference interpreter both evaluate through here, and the backends
// generate code with the same results. The rules that C leaves undefined are defined:
//
//   integers   wrap around in their width (two's complement).
//   IDIV       truncates toward zero. x / 0 = 0, and INT_MIN / -1 = INT_MIN (wraps).
//   MOD        x % y = x - (x / y) * y with the IDIV above: the sign follows x,
//              x % 0 = x, INT_MIN % -1 = 0.
//   SHL, SHR   the shift amount is taken modulo the bit width; SHR is arithmetic for
//              signed types and logical for unsigned.
//   floats     IEEE 754, round to nearest even. float16 and bfloat16 are computed in
//              double and rounded once to the type (exact for + - * / sqrt, since double
//              has more than 2p+2 bits). MULACC is fused (one rounding).
//   MAX, MIN   propagate NaN; -0.0 < +0.0.
//   CMPLT, CMPEQ are false when either side is NaN; CMPNE is true.
//   transcendentals (EXP2, LOG2, SIN, POW) are computed in double and rounded to the
//              type; compiled code may differ by a few ULP (see the backends' bounds).
//   CAST       float -> int truncates and saturates at the type's range, NaN -> 0;
//              int -> int wraps; x -> bool is x != 0 (NaN -> true); bool -> x is 0 / 1;
//              -> float rounds to nearest even (overflow -> inf).
//   BITCAST    reinterprets the bits; both types must have the same width.
//   index      evaluates as int64.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"
#include "compiler/ir/op.h"

namespace uop {

// Round a double to the nearest value of a binary floating format with `precision` bits
// (including the implicit one) and exponents in [emin, emax]; overflow goes to inf.
double round_to_precision(double x, int precision, int emin, int emax);
// Round a double to a float scalar type (float16, bfloat16, float32, float64).
double round_to_float(double x, Scalar to);

uint16_t float_to_half_bits(double x);   // x must already be a float16 value for exactness
double half_bits_to_double(uint16_t h);
uint16_t float_to_bfloat_bits(double x);
double bfloat_bits_to_double(uint16_t b);

// The bit pattern of a value of `type`, zero-extended to 64 bits (what memory holds).
uint64_t value_to_bits(ConstValue v, Scalar type);
// The value of `type` whose memory holds `bits` (the low scalar_bits(type) bits).
ConstValue bits_to_value(uint64_t bits, Scalar type);

// CAST of a value to `to` with the semantics above. `v` may be of any kind.
ConstValue cast_value(ConstValue v, Scalar to);
// BITCAST from `from` to `to` (same width required; nullopt otherwise).
std::optional<ConstValue> bitcast_value(ConstValue v, Scalar from, Scalar to);
// Whether `v` is a value of `type` as it is (kind matches and it is in range / exact).
bool is_value_of(ConstValue v, Scalar type);

// One ALU op on scalar operands. `operand_type` is the type of the operands (for WHERE,
// the type of the two values; its condition is bool). The result is of the op's result
// type: bool for comparisons, else `operand_type`. nullopt if the op is not defined on
// that type (e.g. SIN on int32): the verifier rejects such graphs before anything runs.
std::optional<ConstValue> eval_alu(Op op, Scalar operand_type, std::span<const ConstValue> args);

// The identity a reduction starts from, as a value of `type`: Add 0, Mul 1, Max the
// lowest value (-inf for floats, false for bool), Min the highest (+inf, true).
ConstValue reduce_identity(ReduceOp op, Scalar type);
// The binary op a reduction folds with: ADD, MUL, MAX, MIN.
Op reduce_combine_op(ReduceOp op);

}  // namespace uop
