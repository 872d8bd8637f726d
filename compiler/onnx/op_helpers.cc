// The shared helpers of op_helpers.h. Movement-op recipes are spelled out step by step with
// the index each step leaves, since they are easy to get subtly wrong.
#include "compiler/onnx/op_helpers.h"

#include <limits>

namespace uop::onnx_import {

absl::StatusOr<std::vector<const UOp*>> broadcast_all(NodeContext& c, std::vector<const UOp*> xs) {
  std::vector<Dims> shapes;
  for (const UOp* x : xs) shapes.push_back(c.shape_of(x));
  ONNX_ASSIGN(Dims out, c.broadcast(shapes));
  for (const UOp*& x : xs) x = c.tb().broadcast_to(x, out);
  return xs;
}

absl::StatusOr<std::vector<const UOp*>> all_inputs(NodeContext& c) {
  std::vector<const UOp*> xs;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) continue;
    ONNX_ASSIGN(const UOp* x, c.in(i));
    xs.push_back(x);
  }
  return xs;
}

const UOp* host_constant(NodeContext& c, HostTensor t) {
  Value v;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.constant = std::move(t);
  return c.state().node_of(v);
}

const UOp* iota(NodeContext& c, int64_t n, Scalar dtype, std::vector<int64_t> shape) {
  auto made = c.zeros(dtype, {n});
  if (!made.ok()) {
    // Refused: the import fails after this node (ImportState::fail); a lazy stand-in of the
    // right shape lets the handler finish building without spending the memory.
    c.state().fail(made.status());
    return c.tb().full(dtype, 0.0, std::move(shape));
  }
  HostTensor t = std::move(*made);
  for (int64_t i = 0; i < n; ++i) t.set(i, ConstValue::Int(i));
  t.shape = std::move(shape);
  return host_constant(c, std::move(t));
}

int64_t numel_of(const Dims& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

Dims with_axis_removed(const Dims& d, int64_t axis) {
  Dims out = d;
  out.erase(out.begin() + axis);
  return out;
}

const UOp* concat(TensorBuilder& tb, const std::vector<const UOp*>& xs, int64_t axis) {
  if (xs.size() == 1) return xs[0];
  int64_t total = 0;
  for (const UOp* x : xs) total += tb.shape(x)[axis];
  const UOp* acc = nullptr;
  int64_t at = 0;
  bool is_bool = xs[0]->dtype().is_bool();
  for (const UOp* x : xs) {
    size_t rank = tb.shape(x).size();
    std::vector<int64_t> b(rank, 0), e(rank, 0);
    int64_t n = tb.shape(x)[axis];
    b[axis] = at;
    e[axis] = total - at - n;
    at += n;
    if (n == 0) continue;
    const UOp* p = tb.pad(x, b, e);
    acc = acc ? tb.alu(is_bool ? Op::OR : Op::ADD, {acc, p}) : p;
  }
  return acc;
}

const UOp* slice_axis(TensorBuilder& tb, const UOp* x, int64_t axis, int64_t begin, int64_t end, int64_t step) {
  Dims s = tb.shape(x);
  const int64_t n = s[axis];
  if (step < 0) {
    std::vector<bool> f(s.size(), false);
    f[axis] = true;
    // Flipped, element i is x[n-1-i]: x[begin], x[begin+step], ... become a forward slice.
    return slice_axis(tb, tb.flip(x, f), axis, n - 1 - begin, n - 1 - end, -step);
  }
  const int64_t count = end > begin ? (end - begin + step - 1) / step : 0;
  if (step == 1 && begin == 0 && end == n) return x;
  std::vector<int64_t> b(s.size(), 0), e = s;
  b[axis] = begin;
  e[axis] = std::min(n, begin + count * step);
  const UOp* y = tb.shrink(x, b, e);
  if (step == 1) return y;
  // Padded to count*step along the axis, split as [count, step], and the first of each step.
  int64_t have = e[axis] - b[axis];
  if (have < count * step) {
    std::vector<int64_t> pb(s.size(), 0), pe(s.size(), 0);
    pe[axis] = count * step - have;
    y = tb.pad(y, pb, pe);
  }
  Dims split = s;
  split[axis] = count;
  split.insert(split.begin() + axis + 1, step);
  y = tb.reshape(y, split);
  std::vector<int64_t> sb(split.size(), 0), se = split;
  se[axis + 1] = 1;
  y = tb.shrink(y, sb, se);
  Dims out = s;
  out[axis] = count;
  return tb.reshape(y, out);
}

const UOp* windows_last(TensorBuilder& tb, const UOp* x, int64_t K, int64_t s, int64_t d) {
  Dims sh = tb.shape(x);
  const int64_t n = sh.back();
  const int64_t O = (n - d * (K - 1) - 1) / s + 1;
  Dims lead(sh.begin(), sh.end() - 1);
  auto with = [&](std::initializer_list<int64_t> tail) {
    Dims v = lead;
    v.insert(v.end(), tail);
    return v;
  };
  const size_t r = lead.size();
  if (K == 1) return tb.reshape(slice_axis(tb, x, static_cast<int64_t>(r), 0, (O - 1) * s + 1, s), with({1, O}));
  // x repeated reps times and flattened: F[p] = x[p mod n]. Rows of N' = n + d then give
  // G[k, j] = F[k*N' + j] = x[(k*d + j) mod n], which is x[k*d + j] for the j we keep
  // (k*d + o*s <= n-1 for every window that fits).
  const int64_t np = n + d;
  const int64_t reps = (K * np + n - 1) / n;
  const UOp* y = tb.expand(tb.reshape(x, with({1, n})), with({reps, n}));
  y = tb.reshape(y, with({reps * n}));
  std::vector<int64_t> b(r + 1, 0), e = with({K * np});
  y = tb.reshape(tb.shrink(y, b, e), with({K, np}));
  // Columns o*s for o < O: O*s columns, split as [O, s], the first of each.
  if (O * s > np) {
    std::vector<int64_t> pb(r + 2, 0), pe(r + 2, 0);
    pe[r + 1] = O * s - np;
    y = tb.pad(y, pb, pe);
  } else {
    std::vector<int64_t> sb(r + 2, 0), se = with({K, O * s});
    y = tb.shrink(y, sb, se);
  }
  y = tb.reshape(y, with({K, O, s}));
  std::vector<int64_t> sb(r + 3, 0), se = with({K, O, 1});
  return tb.reshape(tb.shrink(y, sb, se), with({K, O}));
}

ConstValue reduce_identity(ReduceOp op, Scalar s) {
  const bool f = scalar_is_float(s);
  switch (op) {
    case ReduceOp::Add: return f ? ConstValue::Float(0) : ConstValue::Int(0);
    case ReduceOp::Mul: return f ? ConstValue::Float(1) : ConstValue::Int(1);
    case ReduceOp::Max:
      if (f) return ConstValue::Float(-std::numeric_limits<double>::infinity());
      if (s == Scalar::Bool || scalar_is_unsigned_int(s)) return ConstValue::Int(0);
      return ConstValue::Int(scalar_bits(s) == 64 ? std::numeric_limits<int64_t>::min()
                                                   : -(int64_t{1} << (scalar_bits(s) - 1)));
    case ReduceOp::Min:
      if (f) return ConstValue::Float(std::numeric_limits<double>::infinity());
      if (s == Scalar::Bool) return ConstValue::Int(1);
      if (scalar_is_unsigned_int(s))
        return scalar_bits(s) == 64 ? ConstValue::UInt(~uint64_t{0}) : ConstValue::UInt((uint64_t{1} << scalar_bits(s)) - 1);
      return ConstValue::Int(scalar_bits(s) == 64 ? std::numeric_limits<int64_t>::max()
                                                   : (int64_t{1} << (scalar_bits(s) - 1)) - 1);
  }
  return ConstValue::Int(0);
}

absl::StatusOr<const UOp*> gather(NodeContext& c, const UOp* data, const UOp* indices, int64_t axis) {
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims ds = c.shape_of(data), is = c.shape_of(indices);
  const int64_t K = ds[axis];
  Dims pre(ds.begin(), ds.begin() + axis), post(ds.begin() + axis + 1, ds.end());
  Dims out = pre;
  out.insert(out.end(), is.begin(), is.end());
  out.insert(out.end(), post.begin(), post.end());
  // Indices known at import: slices of `data`, concatenated.
  if (indices->op() != Op::BUFFER) {
    Value tmp;
    tmp.node = indices;
    tmp.dtype = indices->dtype().scalar;
    tmp.shape = is;
    auto known = c.state().evaluate(tmp, "indices");
    if (known.ok() && known->numel() <= 64) {
      std::vector<const UOp*> parts;
      for (int64_t i = 0; i < known->numel(); ++i) {
        int64_t k = known->get(i).to_int();
        if (k < 0) k += K;
        if (k < 0 || k >= K) return c.invalid(cat("index ", known->get(i).to_int(), " is out of range for a dim of ", K));
        parts.push_back(slice_axis(tb, data, axis, k, k + 1, 1));
      }
      return tb.reshape(concat(tb, parts, axis), out);
    }
  }
  Scalar it = indices->dtype().scalar;
  const UOp* idx = m.where(m.lt(indices, m.k(indices, 0)), m.add(indices, m.k(indices, K)), indices);
  Dims mshape = is;
  mshape.push_back(1);
  Dims kshape(is.size(), 1);
  kshape.push_back(K);
  const UOp* onehot = tb.alu(Op::CMPEQ, {tb.reshape(idx, mshape), iota(c, K, it, kshape)});
  Dims dr = pre;
  dr.insert(dr.end(), is.size(), 1);
  dr.push_back(K);
  dr.insert(dr.end(), post.begin(), post.end());
  Dims mr(pre.size(), 1);
  mr.insert(mr.end(), is.begin(), is.end());
  mr.push_back(K);
  mr.insert(mr.end(), post.size(), 1);
  const UOp* d = tb.reshape(data, dr);
  Scalar dt = data->dtype().scalar;
  if (dt == Scalar::Bool) d = tb.cast(d, Scalar::UInt8);
  const UOp* picked = tb.alu(Op::WHERE, {tb.reshape(onehot, mr), d, m.k(d, 0)});
  const UOp* r = tb.reduce(picked, ReduceOp::Add, {static_cast<int64_t>(pre.size() + is.size())});
  if (dt == Scalar::Bool) r = tb.cast(r, Scalar::Bool);
  return tb.reshape(r, out);
}

}  // namespace uop::onnx_import
