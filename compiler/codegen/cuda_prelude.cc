// The CUDA C every rendered kernel starts with: the helpers that give CUDA code ir/eval.h's
// semantics where C++ and PTX differ from it. No headers: NVRTC compiles it as it is, so
// no CUDA include directory is needed where the scheduler compiles.
//
// float16 and bfloat16 live in registers and memory as their 16-bit patterns (uop_f16,
// uop_bf16), are widened exactly to float32 for arithmetic and rounded back once; PTX's
// cvt does float16 (sm_53+), integer code bfloat16, so the rounding is the one eval.h
// does. Where a value must be rounded twice (float64 -> float32 -> float16, an int64 ->
// bfloat16, the sum of a narrow MULACC), the first rounding is to odd, which makes the
// second a correct single rounding (Boldo & Melquiond, "When double rounding is odd").
#include "compiler/codegen/cuda.h"

namespace uop {

std::string_view cuda_prelude() {
  static constexpr std::string_view kPrelude = R"CUDA(// uopd CUDA prelude: ir/eval.h's semantics (compiler/codegen/cuda_prelude.cc).
typedef unsigned short uop_f16;   // float16 bits
typedef unsigned short uop_bf16;  // bfloat16 bits
#define UOP_D __device__ __forceinline__
// N lanes of T in memory, A-byte aligned: one vector load / store.
template <typename T, int N, int A> struct alignas(A) uop_vec { T v[N]; };

UOP_D float uop_f16_to_f32(uop_f16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
UOP_D uop_f16 uop_f32_to_f16(float f) { uop_f16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
UOP_D float uop_bf16_to_f32(uop_bf16 b) { return __uint_as_float((unsigned)b << 16); }
// Round to nearest even on the bits; a NaN stays a quiet NaN of its sign.
UOP_D uop_bf16 uop_f32_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if (f != f) return (uop_bf16)((u >> 16) | 0x40u);
  return (uop_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// float64 -> float32 rounded to odd: truncate, then set the last bit if anything was lost.
UOP_D float uop_f64_to_f32_odd(double d) {
  float t = __double2float_rz(d);
  if ((double)t != d && d == d) t = __uint_as_float(__float_as_uint(t) | 1u);
  return t;
}
UOP_D uop_f16 uop_f64_to_f16(double d) { return uop_f32_to_f16(uop_f64_to_f32_odd(d)); }
UOP_D uop_bf16 uop_f64_to_bf16(double d) { return uop_f32_to_bf16(uop_f64_to_f32_odd(d)); }
// A 64-bit magnitude as float32 rounded to odd: 24 bits kept, the rest folded into the last.
UOP_D float uop_u64_to_f32_odd(unsigned long long m) {
  int shift = 40 - __clzll(m);
  if (shift < 0) shift = 0;
  unsigned long long keep = m >> shift;
  if (shift > 0 && (m & ((1ull << shift) - 1ull)) != 0) keep |= 1ull;
  return (float)keep * __uint_as_float((unsigned)(127 + shift) << 23);
}
UOP_D float uop_i64_to_f32_odd(long long x) {
  float f = uop_u64_to_f32_odd(x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x);
  return x < 0 ? -f : f;
}

// MAX / MIN: a NaN operand gives NaN; -0.0 < +0.0.
UOP_D float uop_fmax(float x, float y) {
  if (x != x || y != y) return x + y;
  if (x == y) return __float_as_int(x) < 0 ? y : x;
  return x > y ? x : y;
}
UOP_D float uop_fmin(float x, float y) {
  if (x != x || y != y) return x + y;
  if (x == y) return __float_as_int(x) < 0 ? x : y;
  return x < y ? x : y;
}
UOP_D double uop_fmax(double x, double y) {
  if (x != x || y != y) return x + y;
  if (x == y) return __double_as_longlong(x) < 0 ? y : x;
  return x > y ? x : y;
}
UOP_D double uop_fmin(double x, double y) {
  if (x != x || y != y) return x + y;
  if (x == y) return __double_as_longlong(x) < 0 ? x : y;
  return x < y ? x : y;
}

// MULACC below float32: x*y is exact in float64; the sum is rounded to odd there (TwoSum
// gives its exact error), so rounding it to the narrow type afterwards is one rounding.
UOP_D double uop_fma_odd(double x, double y, double z) {
  double p = x * y, s = p + z;
  if (s - s == 0.0) {  // finite
    double bb = s - p, err = (p - (s - bb)) + (z - bb);
    if (err != 0.0 && (__double_as_longlong(s) & 1) == 0) s = nextafter(s, err > 0.0 ? 1.0 / 0.0 : -1.0 / 0.0);
  }
  return s;
}

// float -> int: truncate toward zero, saturate at the type's range, NaN -> 0.
template <typename T, typename F> UOP_D T uop_sat_s(F x) {
  const F lim = (F)(1ull << (8 * sizeof(T) - 1));
  if (x != x) return (T)0;
  if (x >= lim) return (T)((1ull << (8 * sizeof(T) - 1)) - 1ull);
  if (x < -lim) return (T)(0ull - (1ull << (8 * sizeof(T) - 1)));
  return (T)x;
}
template <typename T, typename F> UOP_D T uop_sat_u(F x) {
  const F lim = (F)2 * (F)(1ull << (8 * sizeof(T) - 1));
  if (x != x || x <= (F)0) return (T)0;
  if (x >= lim) return (T)~0ull;
  return (T)x;
}

// Integer division and remainder without UB: x / 0 = 0, x % 0 = x, MIN / -1 = MIN (it
// wraps), MIN % -1 = 0. U is the unsigned type the result wraps in.
template <typename T, typename U> UOP_D T uop_idiv_s(T x, T y) {
  return y == 0 ? (T)0 : y == (T)-1 ? (T)(U(0) - (U)x) : (T)(x / y);
}
template <typename T> UOP_D T uop_idiv_u(T x, T y) { return y == 0 ? (T)0 : (T)(x / y); }
template <typename T> UOP_D T uop_mod_s(T x, T y) { return y == 0 ? x : y == (T)-1 ? (T)0 : (T)(x % y); }
template <typename T> UOP_D T uop_mod_u(T x, T y) { return y == 0 ? x : (T)(x % y); }

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// WMMA on the tensor cores, one warp: D (16x8, f32) = A (16x16) * B (16x8) + C, with the
// fragment layout of PTX's mma.m16n8k16 (lane l = 4g + t holds A[g + 8i][2t + j + 8k],
// B[2t + j + 8k][g], C[g + 8i][2t + j]; see optimize_gpu's tensor-core rule).
#define UOP_MMA_16816(NAME, TYPE, T)                                                           \
  UOP_D void NAME(float& d0, float& d1, float& d2, float& d3, T a0, T a1, T a2, T a3, T a4,   \
                  T a5, T a6, T a7, T b0, T b1, T b2, T b3, float c0, float c1, float c2,      \
                  float c3) {                                                                  \
    unsigned A0 = a0 | ((unsigned)a1 << 16), A1 = a2 | ((unsigned)a3 << 16);                   \
    unsigned A2 = a4 | ((unsigned)a5 << 16), A3 = a6 | ((unsigned)a7 << 16);                   \
    unsigned B0 = b0 | ((unsigned)b1 << 16), B1 = b2 | ((unsigned)b3 << 16);                   \
    asm("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0,%1,%2,%3}, "          \
        "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"                                           \
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                                               \
        : "r"(A0), "r"(A1), "r"(A2), "r"(A3), "r"(B0), "r"(B1), "f"(c0), "f"(c1), "f"(c2),     \
          "f"(c3));                                                                            \
  }
UOP_MMA_16816(uop_mma_m16n8k16_f16, "f16", uop_f16)
UOP_MMA_16816(uop_mma_m16n8k16_bf16, "bf16", uop_bf16)
#undef UOP_MMA_16816
#endif
)CUDA";
  return kPrelude;
}

}  // namespace uop
