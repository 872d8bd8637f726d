// One loop per (op, storage type), written so that GCC vectorizes it (no branches in the
// body: selects on compare masks), and compiled twice on x86-64: for x86-64-v3 (AVX2 and
// F16C, whose vcvtph2ps makes float16 as cheap as float32) and for the baseline, picked
// at load time (target_clones). reduce_test checks every kernel against eval_alu.
#include "worker/collectives/reduce.h"

#include <bit>
#include <cstdint>
#include <type_traits>

#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define UOP_COMBINE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define UOP_COMBINE_CLONES
#endif

#define UOP_INLINE [[gnu::always_inline]] inline
#define UOP_LAMBDA_INLINE __attribute__((always_inline))

template <typename T, typename F>
UOP_INLINE void apply(void* out, const void* a, const void* b, size_t n, F f) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
}

// Integers wrap (eval.h): compute in an unsigned type at least as wide as int, so that
// neither promotion (uint16 * uint16 overflows int) nor signed overflow is undefined.
template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <typename T> UOP_INLINE T int_add(T x, T y) { return static_cast<T>(Wide<T>(x) + Wide<T>(y)); }
template <typename T> UOP_INLINE T int_mul(T x, T y) { return static_cast<T>(Wide<T>(x) * Wide<T>(y)); }
template <typename T> UOP_INLINE T int_max(T x, T y) { return x > y ? x : y; }
template <typename T> UOP_INLINE T int_min(T x, T y) { return x < y ? x : y; }

// MAX / MIN of two floats as eval.h defines them, on bit patterns so the selects
// vectorize: NaN if either is NaN; for equal operands (which differ at most in the sign
// of a zero) AND of the bits for MAX (+0 wins) and OR for MIN (-0 wins).
template <typename F, typename U, U kNaN, bool kMax>
UOP_INLINE F float_maxmin(F x, F y) {
  U xb = std::bit_cast<U>(x), yb = std::bit_cast<U>(y);
  U r = (kMax ? x > y : x < y) ? xb : yb;
  r = x == y ? (kMax ? (xb & yb) : (xb | yb)) : r;
  r = (x != x || y != y) ? kNaN : r;
  return std::bit_cast<F>(r);
}
template <bool kMax> UOP_INLINE float f32_maxmin(float x, float y) {
  return float_maxmin<float, uint32_t, 0x7fc00000u, kMax>(x, y);
}
template <bool kMax> UOP_INLINE double f64_maxmin(double x, double y) {
  return float_maxmin<double, uint64_t, 0x7ff8000000000000ull, kMax>(x, y);
}

// float16 and bfloat16 go through float: exact on the way in, and one rounding on the way
// out. float has 24 >= 2 * 11 + 2 bits, so rounding a float sum or product of two float16
// values to float16 equals rounding the exact value once (as eval.h does through double);
// bfloat16 (8 bits) has the margin too, and float's exponent range covers both.
#if defined(__FLT16_MAX__)
UOP_INLINE float half_to_float(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
UOP_INLINE uint16_t float_to_half(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
#else
UOP_INLINE float half_to_float(uint16_t h) { return static_cast<float>(half_bits_to_double(h)); }
UOP_INLINE uint16_t float_to_half(float f) { return float_to_half_bits(f); }
#endif
UOP_INLINE float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
// Round to nearest even on the bits; a NaN becomes eval.h's 0x7fc0 (the rounding could
// otherwise carry a low-payload NaN into inf).
UOP_INLINE uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7fc0u : r);
}

// bool: memory holds a byte whose low bit is the value (eval.h's bits_to_value); the
// result is 0 or 1. MAX is OR, MIN is AND.
UOP_INLINE uint8_t bool_or(uint8_t x, uint8_t y) { return static_cast<uint8_t>((x | y) & 1u); }
UOP_INLINE uint8_t bool_and(uint8_t x, uint8_t y) { return static_cast<uint8_t>(x & y & 1u); }

// One exported-in-this-file kernel per (op, type). Macros because target_clones applies
// to plain functions, not to templates.
#define UOP_KERNEL(name, T, expr)                                                   \
  UOP_COMBINE_CLONES void name(void* out, const void* a, const void* b, size_t n) { \
    apply<T>(out, a, b, n, [](T x, T y) UOP_LAMBDA_INLINE { return expr; });               \
  }
#define UOP_INT_KERNELS(T, tag)                  \
  UOP_KERNEL(add_##tag, T, int_add<T>(x, y))     \
  UOP_KERNEL(mul_##tag, T, int_mul<T>(x, y))     \
  UOP_KERNEL(max_##tag, T, int_max<T>(x, y))     \
  UOP_KERNEL(min_##tag, T, int_min<T>(x, y))

UOP_INT_KERNELS(int8_t, i8)
UOP_INT_KERNELS(int16_t, i16)
UOP_INT_KERNELS(int32_t, i32)
UOP_INT_KERNELS(int64_t, i64)
UOP_INT_KERNELS(uint8_t, u8)
UOP_INT_KERNELS(uint16_t, u16)
UOP_INT_KERNELS(uint32_t, u32)
UOP_INT_KERNELS(uint64_t, u64)

UOP_KERNEL(max_bool, uint8_t, bool_or(x, y))
UOP_KERNEL(min_bool, uint8_t, bool_and(x, y))

UOP_KERNEL(add_f32, float, x + y)
UOP_KERNEL(mul_f32, float, x * y)
UOP_KERNEL(max_f32, float, f32_maxmin<true>(x, y))
UOP_KERNEL(min_f32, float, f32_maxmin<false>(x, y))
UOP_KERNEL(add_f64, double, x + y)
UOP_KERNEL(mul_f64, double, x * y)
UOP_KERNEL(max_f64, double, f64_maxmin<true>(x, y))
UOP_KERNEL(min_f64, double, f64_maxmin<false>(x, y))

UOP_KERNEL(add_f16, uint16_t, float_to_half(half_to_float(x) + half_to_float(y)))
UOP_KERNEL(mul_f16, uint16_t, float_to_half(half_to_float(x) * half_to_float(y)))
UOP_KERNEL(max_f16, uint16_t, float_to_half(f32_maxmin<true>(half_to_float(x), half_to_float(y))))
UOP_KERNEL(min_f16, uint16_t, float_to_half(f32_maxmin<false>(half_to_float(x), half_to_float(y))))
UOP_KERNEL(add_bf16, uint16_t, float_to_bf16(bf16_to_float(x) + bf16_to_float(y)))
UOP_KERNEL(mul_bf16, uint16_t, float_to_bf16(bf16_to_float(x) * bf16_to_float(y)))
UOP_KERNEL(max_bf16, uint16_t, float_to_bf16(f32_maxmin<true>(bf16_to_float(x), bf16_to_float(y))))
UOP_KERNEL(min_bf16, uint16_t, float_to_bf16(f32_maxmin<false>(bf16_to_float(x), bf16_to_float(y))))

#undef UOP_INT_KERNELS
#undef UOP_KERNEL

// The four kernels of one type, in ReduceOp order (Add, Mul, Max, Min); null: undefined.
struct Kernels {
  CombineFn by_op[4];
};

Kernels kernels_of(Scalar s) {
  switch (s) {
    case Scalar::Bool: return {{nullptr, nullptr, max_bool, min_bool}};
    case Scalar::Int8: return {{add_i8, mul_i8, max_i8, min_i8}};
    case Scalar::Int16: return {{add_i16, mul_i16, max_i16, min_i16}};
    case Scalar::Int32: return {{add_i32, mul_i32, max_i32, min_i32}};
    case Scalar::Int64:
    case Scalar::Index: return {{add_i64, mul_i64, max_i64, min_i64}};  // index evaluates as int64
    case Scalar::UInt8: return {{add_u8, mul_u8, max_u8, min_u8}};
    case Scalar::UInt16: return {{add_u16, mul_u16, max_u16, min_u16}};
    case Scalar::UInt32: return {{add_u32, mul_u32, max_u32, min_u32}};
    case Scalar::UInt64: return {{add_u64, mul_u64, max_u64, min_u64}};
    case Scalar::Float16: return {{add_f16, mul_f16, max_f16, min_f16}};
    case Scalar::BFloat16: return {{add_bf16, mul_bf16, max_bf16, min_bf16}};
    case Scalar::Float32: return {{add_f32, mul_f32, max_f32, min_f32}};
    case Scalar::Float64: return {{add_f64, mul_f64, max_f64, min_f64}};
    case Scalar::Void: break;
  }
  return {{nullptr, nullptr, nullptr, nullptr}};
}

constexpr std::string_view kWireNames[4] = {"add", "mul", "max", "min"};

}  // namespace

absl::StatusOr<CombineFn> combine_function(ReduceOp op, Scalar dtype) {
  CombineFn fn = kernels_of(dtype).by_op[static_cast<int>(op)];
  if (!fn)
    return absl::InvalidArgumentError(
        cat("a reduction with ", reduce_op_wire_name(op), " is not defined on ", scalar_name(dtype)));
  return fn;
}

std::optional<ReduceOp> reduce_op_from_wire(std::string_view name) {
  for (int i = 0; i < 4; ++i)
    if (kWireNames[i] == name) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

std::string_view reduce_op_wire_name(ReduceOp op) { return kWireNames[static_cast<int>(op)]; }

}  // namespace uop
