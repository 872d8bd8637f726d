// Interval arithmetic for value_range.h. Every op computes its result range in 128 bits
// from its sources' ranges, then `fit` checks it against the dtype: a range that leaves the
// dtype means the op may wrap, and a wrapped value can be anything of the dtype.
#include "compiler/ir/value_range.h"

#include <algorithm>
#include <bit>
#include <initializer_list>
#include <limits>
#include <vector>

namespace uop {
namespace {

using i128 = __int128;
struct R {
  i128 lo, hi;
};

constexpr i128 kI64Min = std::numeric_limits<int64_t>::min();
constexpr i128 kI64Max = std::numeric_limits<int64_t>::max();

bool integral(const DType& d) { return !d.ptr && (d.is_int() || d.is_bool()); }

R type_range(const DType& d) {
  if (d.is_bool()) return {0, 1};
  int n = scalar_bits(d.scalar);
  if (d.is_unsigned()) return {0, (i128{1} << n) - 1};
  return {-(i128{1} << (n - 1)), (i128{1} << (n - 1)) - 1};
}

ValueRange::Bounds fit(const DType& d, R r) {
  if (!integral(d)) return ValueRange::full(d);
  R t = type_range(d);
  if (r.lo < t.lo || r.hi > t.hi || r.hi > kI64Max) return ValueRange::full(d);
  return {static_cast<int64_t>(r.lo), static_cast<int64_t>(r.hi)};
}

// A stored range as the true values: a uint64 "unknown" is [0, 2^64 - 1].
R widen(const DType& d, ValueRange::Bounds b) {
  if (d.is_unsigned() && b.first < 0) return type_range(d);
  return {b.first, b.second};
}

R hull(std::initializer_list<i128> v) { return {std::min(v), std::max(v)}; }
R join(R a, R b) { return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)}; }
i128 mag(R a) { return std::max(a.lo < 0 ? -a.lo : a.lo, a.hi < 0 ? -a.hi : a.hi); }

// Products of magnitudes up to 2^63 fit in 128 bits; beyond that (uint64 only) give up.
bool mul(R a, R b, R& out) {
  if (mag(a) > (i128{1} << 63) || mag(b) > (i128{1} << 63)) return false;
  out = hull({a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi});
  return true;
}

// Truncating division, x / 0 = 0. Over a divisor range of one sign the quotient is monotone
// in each operand, so the extremes lie at the corners.
R idiv(R a, R b) {
  std::vector<i128> c;
  auto corners = [&](i128 blo, i128 bhi) {
    for (i128 x : {a.lo, a.hi})
      for (i128 y : {blo, bhi}) c.push_back(x / y);
  };
  if (b.lo <= -1) corners(b.lo, std::min<i128>(b.hi, -1));
  if (b.hi >= 1) corners(std::max<i128>(b.lo, 1), b.hi);
  if (b.lo <= 0 && b.hi >= 0) c.push_back(0);
  return {*std::min_element(c.begin(), c.end()), *std::max_element(c.begin(), c.end())};
}

// x % y = x - (x / y) * y: the sign follows x, |x % y| < |y|, and x % 0 = x.
R mod(R a, R b) {
  if (b.lo == b.hi && b.lo != 0) {
    i128 d = b.lo, k = a.lo / d;
    if (a.hi / d == k) return {a.lo - k * d, a.hi - k * d};  // one block: x - k*d
  }
  i128 m = 0;
  if (b.lo < 0) m = std::max(m, -b.lo - 1);
  if (b.hi > 0) m = std::max(m, b.hi - 1);
  R r{a.lo >= 0 ? 0 : std::max(a.lo, -m), a.hi <= 0 ? 0 : std::min(a.hi, m)};
  if (b.lo <= 0 && b.hi >= 0) r = join(r, a);
  return r;
}

// 2^bit_width(v) - 1: every value whose bits are within v's.
i128 all_ones_to(i128 v) {
  unsigned __int128 u = static_cast<unsigned __int128>(v);
  int w = 0;
  while (u) { ++w; u >>= 1; }
  return (i128{1} << w) - 1;
}

}  // namespace

ValueRange::Bounds ValueRange::full(DType d) {
  if (!bounded(d)) return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  R t = type_range(d);
  return {static_cast<int64_t>(t.lo), static_cast<int64_t>(t.hi)};
}

bool ValueRange::bounded(DType d) {
  return integral(d) && !(d.is_unsigned() && scalar_bits(d.scalar) >= 64);
}

ValueRange::Bounds ValueRange::operator()(const UOp* u) {
  if (auto it = memo_.find(u); it != memo_.end()) return it->second;
  // Which sources a node's range reads; the rest of the graph is never visited.
  auto needs = [](const UOp* n) -> size_t {
    if (!integral(n->dtype())) return 0;
    Op op = n->op();
    if (is_alu(op) || op == Op::CAST || op == Op::VECTORIZE || op == Op::GEP) return n->num_src();
    if (op == Op::RANGE || op == Op::SPECIAL || op == Op::BIND) return 1;
    return 0;
  };
  auto empty = [](Bounds b) { return b.first > b.second; };
  std::vector<std::pair<const UOp*, bool>> stack{{u, false}};
  while (!stack.empty()) {
    auto [n, expanded] = stack.back();
    if (memo_.contains(n)) {
      stack.pop_back();
    } else if (!expanded) {
      stack.back().second = true;
      for (size_t i = needs(n); i-- > 0;)
        if (!memo_.contains(n->src(i))) stack.push_back({n->src(i), false});
    } else {
      bool wraps = false, none = false;
      for (size_t i = 0; i < needs(n); ++i) none |= empty(memo_.at(n->src(i)));
      // A source without values (contradicting assumptions) leaves none for n either.
      Bounds b = none ? Bounds{1, 0} : compute(n, &wraps);
      if (auto a = assumed_.find(n); a != assumed_.end() && !none)
        b = {std::max(b.first, a->second.first), std::min(b.second, a->second.second)};
      contradiction_ |= empty(b);
      if (wraps) wraps_.insert(n);
      memo_.emplace(n, b);
      stack.pop_back();
    }
  }
  return memo_.at(u);
}

bool ValueRange::may_wrap(const UOp* u) {
  const DType& d = u->dtype();
  if (!integral(d) || d.is_bool()) return false;
  switch (u->op()) {
    case Op::ADD: case Op::SUB: case Op::MUL: case Op::MULACC: case Op::NEG: case Op::SHL:
    case Op::IDIV: case Op::CAST: case Op::RANGE: case Op::SPECIAL:
      if (!bounded(d)) return true;
      (*this)(u);
      return wraps_.contains(u);
    default: return false;
  }
}

ValueRange::Bounds ValueRange::compute(const UOp* u, bool* wraps) const {
  const DType& d = u->dtype();
  if (!integral(d)) return full(d);
  // The exact result r, or the whole dtype (and a note that it wrapped) when r leaves it.
  auto exact = [&](R r) {
    R t = type_range(d);
    if (r.lo < t.lo || r.hi > t.hi) *wraps = true;
    return fit(d, r);
  };
  auto wrapped = [&] {
    *wraps = true;
    return full(d);
  };
  auto src = [&](size_t i) { return widen(u->src(i)->dtype(), memo_.at(u->src(i))); };
  auto src_integral = [&] {
    for (const UOp* s : u->src())
      if (!integral(s->dtype())) return false;
    return true;
  };
  const Op op = u->op();
  switch (op) {
    case Op::CONST: {
      const ConstValue& c = *u->const_value();
      i128 v = c.kind() == ConstValue::Kind::UInt ? i128(c.as_uint()) : i128(c.to_int());
      return fit(d, {v, v});
    }
    case Op::VCONST: {
      const auto& vals = u->arg_as<VConstArg>().values;
      if (vals.empty()) return full(d);
      R r{kI64Max, kI64Min};
      for (const ConstValue& c : vals) {
        i128 v = c.kind() == ConstValue::Kind::UInt ? i128(c.as_uint()) : i128(c.to_int());
        r = {std::min(r.lo, v), std::max(r.hi, v)};
      }
      return fit(d, r);
    }
    case Op::RANGE:
    case Op::SPECIAL: {
      if (!integral(u->src(0)->dtype())) return full(d);
      return exact({0, std::max<i128>(src(0).hi - 1, 0)});
    }
    case Op::DEFINE_VAR: {
      const auto& v = u->arg_as<DefineVarArg>();
      return v.min <= v.max ? fit(d, {v.min, v.max}) : full(d);
    }
    case Op::BIND:
    case Op::GEP:
      return integral(u->src(0)->dtype()) ? fit(d, src(0)) : full(d);
    case Op::VECTORIZE: {
      if (!src_integral()) return full(d);
      R r = src(0);
      for (size_t i = 1; i < u->num_src(); ++i) r = join(r, src(i));
      return fit(d, r);
    }
    case Op::CAST: {
      if (!integral(u->src(0)->dtype())) return full(d);
      R s = src(0);
      if (d.is_bool()) {  // x != 0
        if (s.lo == 0 && s.hi == 0) return {0, 0};
        if (s.lo > 0 || s.hi < 0) return {1, 1};
        return {0, 1};
      }
      return exact(s);  // int -> int keeps the value when it fits, else it wraps
    }
    default: break;
  }
  if (!is_alu(op) || !src_integral()) return full(d);

  if (op == Op::WHERE) {
    R c = src(0);
    if (c.lo == 1) return fit(d, src(1));
    if (c.hi == 0) return fit(d, src(2));
    return fit(d, join(src(1), src(2)));
  }
  R a = src(0);
  if (u->num_src() == 1) {
    if (op == Op::NEG) return exact({-a.hi, -a.lo});
    return full(d);
  }
  R b = src(1);
  const bool is_bool = u->src(0)->dtype().is_bool();
  switch (op) {
    case Op::ADD: return exact({a.lo + b.lo, a.hi + b.hi});
    case Op::SUB: return exact({a.lo - b.hi, a.hi - b.lo});
    case Op::MUL: {
      R r;
      return mul(a, b, r) ? exact(r) : wrapped();
    }
    case Op::MULACC: {
      R r, c = src(2);
      return mul(a, b, r) ? exact({r.lo + c.lo, r.hi + c.hi}) : wrapped();
    }
    case Op::IDIV: return exact(idiv(a, b));
    case Op::MOD: return fit(d, mod(a, b));
    case Op::MAX: return fit(d, {std::max(a.lo, b.lo), std::max(a.hi, b.hi)});
    case Op::MIN: return fit(d, {std::min(a.lo, b.lo), std::min(a.hi, b.hi)});
    case Op::CMPLT:
      if (a.hi < b.lo) return {1, 1};
      if (a.lo >= b.hi) return {0, 0};
      return {0, 1};
    case Op::CMPNE:
    case Op::CMPEQ: {
      bool differ = a.hi < b.lo || b.hi < a.lo;
      bool same = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
      if (!differ && !same) return {0, 1};
      int64_t ne = differ ? 1 : 0;
      int64_t v = op == Op::CMPNE ? ne : 1 - ne;
      return {v, v};
    }
    case Op::AND:
      if (is_bool) return {int64_t(a.lo & b.lo), int64_t(a.hi & b.hi)};
      // The result's bits are a subset of a nonnegative operand's bits.
      if (a.lo >= 0 && b.lo >= 0) return fit(d, {0, std::min(a.hi, b.hi)});
      if (a.lo >= 0) return fit(d, {0, a.hi});
      if (b.lo >= 0) return fit(d, {0, b.hi});
      return full(d);
    case Op::OR:
      if (is_bool) return {int64_t(a.lo | b.lo), int64_t(a.hi | b.hi)};
      if (a.lo >= 0 && b.lo >= 0) return fit(d, {std::max(a.lo, b.lo), all_ones_to(std::max(a.hi, b.hi))});
      return full(d);
    case Op::XOR:
      if (is_bool) {
        if (a.lo == a.hi && b.lo == b.hi) return {int64_t(a.lo ^ b.lo), int64_t(a.lo ^ b.lo)};
        return {0, 1};
      }
      if (a.lo >= 0 && b.lo >= 0) return fit(d, {0, all_ones_to(std::max(a.hi, b.hi))});
      return full(d);
    case Op::SHL:
    case Op::SHR: {
      if (is_bool) return full(d);
      if (b.lo != b.hi) {
        if (op == Op::SHR && a.lo >= 0) return fit(d, {0, a.hi});
        return op == Op::SHL ? wrapped() : full(d);
      }
      // The amount is taken modulo the width, from its bits as eval.h does.
      int s = static_cast<int>(static_cast<uint64_t>(b.lo) % scalar_bits(d.scalar));
      if (op == Op::SHR) return fit(d, {a.lo >> s, a.hi >> s});  // floor division by 2^s
      R r;
      return mul(a, {i128{1} << s, i128{1} << s}, r) ? exact(r) : wrapped();
    }
    default: return full(d);
  }
}

}  // namespace uop
