// HostTensor storage, random contents and the tolerance comparison. Every conversion
// between a value and its bytes goes through eval.h, so a float16 written here is the
// pattern a compiled kernel writes.
#include "compiler/interp/host_tensor.h"

#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"

namespace uop {

std::optional<int64_t> checked_numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    // Refused even when a later dim is zero: such a shape is not worth the risk.
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::string shape_str(std::span<const int64_t> shape) { return cat("[", join(shape, ", "), "]"); }

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t HostTensor::get_bits(int64_t i) const {
  assert(i >= 0 && i < numel());
  uint64_t bits = 0;
  // Little-endian host: the low bytes of `bits` are the element's bytes.
  std::memcpy(&bits, data.data() + i * itemsize(), itemsize());
  return bits;
}

void HostTensor::set_bits(int64_t i, uint64_t bits) {
  assert(i >= 0 && i < numel());
  std::memcpy(data.data() + i * itemsize(), &bits, itemsize());
}

ConstValue HostTensor::get(int64_t i) const { return bits_to_value(get_bits(i), dtype); }

void HostTensor::set(int64_t i, ConstValue v) {
  if (v.kind() != ConstValue::kind_of(dtype) || v.kind() == ConstValue::Kind::Float) v = cast_value(v, dtype);
  set_bits(i, value_to_bits(v, dtype));
}

HostTensor HostTensor::zeros(Scalar dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  std::optional<int64_t> n = checked_numel(t.shape);
  assert(n && dtype != Scalar::Void && "validate shapes from outside before zeros()");
  t.data.assign(static_cast<size_t>(*n) * scalar_bytes(dtype), '\0');
  return t;
}

HostTensor HostTensor::of(Scalar dtype, std::vector<int64_t> shape, std::span<const ConstValue> values) {
  HostTensor t = zeros(dtype, std::move(shape));
  assert(static_cast<int64_t>(values.size()) == t.numel());
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

HostTensor HostTensor::of(Scalar dtype, std::vector<int64_t> shape, std::initializer_list<double> values) {
  std::vector<ConstValue> vs;
  vs.reserve(values.size());
  for (double d : values) vs.push_back(ConstValue::Float(d));
  return of(dtype, std::move(shape), vs);
}

HostTensor HostTensor::random(Scalar dtype, std::vector<int64_t> shape, uint64_t seed) {
  HostTensor t = zeros(dtype, std::move(shape));
  fill_random(t, seed);
  return t;
}

std::vector<ConstValue> HostTensor::values() const {
  std::vector<ConstValue> out;
  out.reserve(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out.push_back(get(i));
  return out;
}

std::string HostTensor::str(int64_t max_values) const {
  std::string out = cat(scalar_name(dtype), shape_str(shape));
  if (numel() > max_values) return out;
  out += " {";
  for (int64_t i = 0; i < numel(); ++i) out += cat(i ? ", " : "", get(i).str());
  return out + "}";
}

namespace {

// splitmix64: tiny, well mixed, and defined here so the sequence never depends on a
// standard library's distribution code.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void fill_random(HostTensor& t, uint64_t seed) {
  uint64_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t r = next_random(state);
    if (t.dtype == Scalar::Bool) {
      t.set(i, ConstValue::Bool(r & 1));
    } else if (scalar_is_float(t.dtype)) {
      double u = static_cast<double>(r >> 11) * 0x1p-53;  // [0, 1)
      t.set(i, ConstValue::Float(round_to_float(-2.0 + 4.0 * u, t.dtype)));
    } else if (scalar_is_unsigned_int(t.dtype)) {
      t.set(i, ConstValue::UInt(r % 33));
    } else {
      t.set(i, ConstValue::Int(static_cast<int64_t>(r % 33) - 16));
    }
  }
}

Tolerance Tolerance::for_dtype(Scalar s) {
  switch (s) {
    case Scalar::Float16: return {2e-3, 1e-3, 4};
    case Scalar::BFloat16: return {1.6e-2, 1e-2, 4};
    case Scalar::Float32: return {1e-5, 1e-6, 4};
    case Scalar::Float64: return {1e-12, 1e-12, 4};
    default: return exact();
  }
}

namespace {

// Position of a float's bit pattern on a line where adjacent representable values are
// one apart (sign-magnitude turned into a signed count), so ULP distance is a difference.
__int128 ordered_float(uint64_t bits, Scalar s) {
  int nb = scalar_bits(s);
  uint64_t sign = uint64_t{1} << (nb - 1);
  __int128 mag = static_cast<__int128>(bits & (sign - 1));
  return (bits & sign) ? -mag : mag;
}

int64_t ulp_distance(ConstValue a, ConstValue b, Scalar s) {
  if (std::isnan(a.as_float()) != std::isnan(b.as_float())) return std::numeric_limits<int64_t>::max();
  __int128 d = ordered_float(value_to_bits(a, s), s) - ordered_float(value_to_bits(b, s), s);
  if (d < 0) d = -d;
  return d > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(d);
}

std::string coords_str(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] == 0) break;
    c[k] = flat % shape[k];
    flat /= shape[k];
  }
  return shape_str(c);
}

std::string mismatch_str(const Mismatch& m, const HostTensor& t, bool is_float) {
  std::string s = cat("at ", coords_str(m.index, t.shape), " (flat ", m.index, "): expected ",
                      m.expected.str(), ", got ", m.got.str());
  if (is_float) {
    s += cat(" (abs err ", m.abs_err);
    if (m.ulp != std::numeric_limits<int64_t>::max()) s += cat(", ", m.ulp, " ulp");
    s += ")";
  }
  return s;
}

}  // namespace

CompareResult compare(const HostTensor& expected, const HostTensor& got, Tolerance tol) {
  CompareResult r;
  if (expected.dtype != got.dtype || expected.shape != got.shape) {
    r.ok = false;
    r.message = cat("expected ", scalar_name(expected.dtype), shape_str(expected.shape), ", got ",
                    scalar_name(got.dtype), shape_str(got.shape));
    return r;
  }
  if (static_cast<int64_t>(expected.data.size()) != expected.numel() * expected.itemsize() ||
      got.data.size() != expected.data.size()) {
    r.ok = false;
    r.message = cat("tensor data of ", expected.data.size(), " and ", got.data.size(),
                    " bytes does not match the shape ", shape_str(expected.shape));
    return r;
  }
  const bool is_float = scalar_is_float(expected.dtype);
  double worst_score = -1;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    uint64_t eb = expected.get_bits(i), gb = got.get_bits(i);
    if (eb == gb) continue;
    Mismatch m{i, expected.get(i), got.get(i), 0, 0};
    double score;
    if (is_float) {
      double e = m.expected.as_float(), g = m.got.as_float();
      if (std::isnan(e) && std::isnan(g)) continue;  // any NaN pattern equals any other
      m.ulp = ulp_distance(m.expected, m.got, expected.dtype);
      bool either_nan = std::isnan(e) || std::isnan(g);
      m.abs_err = either_nan ? INFINITY : std::fabs(e - g);
      if (std::isinf(e) || std::isinf(g)) {
        if (e == g) continue;
        m.abs_err = INFINITY;
      }
      double allowed = tol.atol + tol.rtol * std::fabs(e);
      if (!either_nan && std::isfinite(m.abs_err) && m.abs_err <= allowed) continue;
      if (tol.max_ulp > 0 && !std::isinf(e) && !std::isinf(g) && m.ulp <= tol.max_ulp) continue;
      score = allowed > 0 ? m.abs_err / allowed : INFINITY;
    } else {
      if (m.expected == m.got) continue;  // same value, different padding bits: impossible, kept safe
      m.abs_err = std::fabs(m.expected.to_double() - m.got.to_double());
      score = m.abs_err;
    }
    ++r.mismatches;
    if (!r.first) r.first = m;
    if (score > worst_score) {
      worst_score = score;
      r.worst = m;
    }
  }
  if (r.mismatches == 0) return r;
  r.ok = false;
  r.message = cat(scalar_name(expected.dtype), shape_str(expected.shape), ": ", r.mismatches, " of ",
                  expected.numel(), " elements differ");
  if (is_float) r.message += cat(" (rtol ", tol.rtol, ", atol ", tol.atol, ", max_ulp ", tol.max_ulp, ")");
  r.message += cat("; first ", mismatch_str(*r.first, expected, is_float));
  if (r.worst->index != r.first->index) r.message += cat("; worst ", mismatch_str(*r.worst, expected, is_float));
  return r;
}

}  // namespace uop
