// HostTensor: a dense row-major tensor in host memory, holding exactly the bytes compiled
// code reads and writes (element i at byte i * scalar_bytes; bool is one byte 0 / 1;
// float16 / bfloat16 are their 16-bit patterns). Values go in and out as ConstValue
// through eval.h's value_to_bits / bits_to_value, so a tensor's contents mean the same to
// the interpreter, the .npy reader and the backends.
//
// Also here: seeded random contents for differential tests, and compare(), which decides
// whether a backend's output matches the interpreter's and says where it does not.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"

namespace uop {

// The element count of a shape; nullopt when a dim is negative or the product overflows
// int64 (a shape from the network is not trusted).
std::optional<int64_t> checked_numel(std::span<const int64_t> shape);
// "[2, 3]" for messages; "[]" for a scalar.
std::string shape_str(std::span<const int64_t> shape);

struct HostTensor {
  Scalar dtype = Scalar::Float32;
  std::vector<int64_t> shape;  // empty: a scalar (one element)
  std::string data;            // numel() * scalar_bytes(dtype) bytes

  int64_t numel() const;  // product of the dims (1 for a scalar)
  int itemsize() const { return scalar_bytes(dtype); }
  int64_t nbytes() const { return static_cast<int64_t>(data.size()); }

  // Element i (row-major), as a value of `dtype`'s kind. i must be in [0, numel()).
  ConstValue get(int64_t i) const;
  // Stores v at element i. A value of another kind is converted with CAST semantics
  // (so set(i, Int(3)) on a float tensor stores 3.0); a float is rounded to the dtype.
  void set(int64_t i, ConstValue v);
  // The raw bit pattern of element i, zero-extended (what memory holds).
  uint64_t get_bits(int64_t i) const;
  void set_bits(int64_t i, uint64_t bits);

  // All zero bits: 0, false, +0.0. The shape must be valid (checked_numel) and the
  // dtype a value type (not void); callers that take shapes from outside check first.
  static HostTensor zeros(Scalar dtype, std::vector<int64_t> shape);
  // A tensor from literal values (converted as set() does); values.size() must equal the
  // shape's element count. For tests: HostTensor::of(Scalar::Int32, {2, 2}, {1, 2, 3, 4}).
  static HostTensor of(Scalar dtype, std::vector<int64_t> shape, std::span<const ConstValue> values);
  static HostTensor of(Scalar dtype, std::vector<int64_t> shape, std::initializer_list<double> values);
  // Seeded random contents valid for the dtype (see fill_random).
  static HostTensor random(Scalar dtype, std::vector<int64_t> shape, uint64_t seed);

  // Every element as a value (for tests and messages).
  std::vector<ConstValue> values() const;
  // "float32[2, 3]" and, when short enough, the values: "float32[2, 3] {1, 2, 3, 4, 5, 6}".
  std::string str(int64_t max_values = 16) const;

  bool operator==(const HostTensor&) const = default;  // bitwise: dtype, shape and bytes
};

// Fills `t` with values from a deterministic generator (the same seed gives the same
// bytes on every machine): signed ints in [-16, 16], unsigned in [0, 32], floats uniform in
// [-2, 2] rounded to the dtype, bools true or false with equal odds. Small ints keep sums
// and products of differential tests away from wrap-around surprises.
void fill_random(HostTensor& t, uint64_t seed);

// How close two float results must be. An element passes when the values are bitwise
// equal, both NaN, |e - g| <= atol + rtol * |e| (NumPy's allclose), or, with max_ulp > 0,
// when they are at most max_ulp representable values apart in the dtype. Infinities must
// match exactly. Ints and bools are always compared exactly.
struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
  int64_t max_ulp = 0;  // 0: not used

  // Exactly equal (NaN still equals NaN).
  static Tolerance exact() { return Tolerance{0, 0, 0}; }
  // The defaults for comparing compiled code against the interpreter: a few ULP of the
  // dtype's epsilon relative, plus room for reassociated Add / Mul reductions.
  //   float16 rtol 2e-3 atol 1e-3, bfloat16 rtol 1.6e-2 atol 1e-2,
  //   float32 rtol 1e-5 atol 1e-6, float64 rtol 1e-12 atol 1e-12; max_ulp 4 everywhere.
  static Tolerance for_dtype(Scalar s);
};

struct Mismatch {
  int64_t index = 0;  // flat, row-major
  ConstValue expected;
  ConstValue got;
  double abs_err = 0;  // |expected - got| as doubles (inf when one side is NaN)
  int64_t ulp = 0;     // float dtypes: representable values between them (INT64_MAX: NaN vs not)
};

struct CompareResult {
  bool ok = true;
  int64_t mismatches = 0;          // elements outside the tolerance
  std::optional<Mismatch> first;   // the lowest index that failed
  std::optional<Mismatch> worst;   // the largest error relative to what was allowed
  std::string message;             // empty when ok; one paragraph for a test log or `uopc run --check`

  explicit operator bool() const { return ok; }
};

// Compares `got` against `expected`: dtype and shape must match, then every element with
// `tol` (floats) or bit-exactly (ints, bools).
CompareResult compare(const HostTensor& expected, const HostTensor& got, Tolerance tol);
inline CompareResult compare(const HostTensor& expected, const HostTensor& got) {
  return compare(expected, got, Tolerance::for_dtype(expected.dtype));
}

}  // namespace uop
