// Indexing operators: Gather, GatherElements, GatherND, OneHot, Scatter*, TopK, Compress and
// Einsum, written as one-hot comparisons
// against an iota and a sum (or as slices when the indices are known at import).
#include <algorithm>
#include <map>

#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

absl::Status gather_op(NodeContext& c) {
  ONNX_ASSIGN(const UOp* data, c.in(0));
  ONNX_ASSIGN(const UOp* idx, c.in(1));
  if (!idx->dtype().is_int()) return c.invalid("indices must be integers");
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", 0), static_cast<int64_t>(c.shape_of(data).size())));
  ONNX_ASSIGN(const UOp* y, gather(c, data, idx, axis));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status gather_elements(NodeContext& c) {
  ONNX_ASSIGN(const UOp* data, c.in(0));
  ONNX_ASSIGN(const UOp* idx, c.in(1));
  if (!idx->dtype().is_int()) return c.invalid("indices must be integers");
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims ds = c.shape_of(data), is = c.shape_of(idx);
  const int64_t r = static_cast<int64_t>(ds.size());
  if (static_cast<int64_t>(is.size()) != r) return c.invalid("data and indices differ in rank");
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", 0), r));
  // data cut to the indices' dims off the axis, then out[.., i, ..] = sum_k data[.., k, ..]
  // where idx[.., i, ..] == k.
  std::vector<int64_t> b(r, 0), e = ds;
  for (int64_t a = 0; a < r; ++a) {
    if (a == axis) continue;
    if (is[a] > ds[a]) return c.invalid("indices larger than data off the axis");
    e[a] = is[a];
  }
  const UOp* d = tb.shrink(data, b, e);
  const int64_t K = ds[axis];
  const UOp* ix = m.where(m.lt(idx, m.k(idx, 0)), m.add(idx, m.k(idx, K)), idx);
  Dims ir = is, dr = e, kr(r + 1, 1);
  ir.insert(ir.begin() + axis + 1, 1);
  dr[axis] = 1;
  dr.insert(dr.begin() + axis + 1, K);
  kr[axis + 1] = K;
  Dims full = is;
  full.insert(full.begin() + axis + 1, K);
  const UOp* hit = tb.alu(Op::CMPEQ, {tb.broadcast_to(tb.reshape(ix, ir), full),
                                      tb.broadcast_to(iota(c, K, c.dtype_of(idx), kr), full)});
  // data as [.., 1, K, ..]: its axis moved to the new position.
  Dims dperm_shape = e;
  dperm_shape[axis] = 1;
  dperm_shape.insert(dperm_shape.begin() + axis + 1, K);
  const UOp* dv = tb.reshape(d, dperm_shape);
  Scalar dt = c.dtype_of(data);
  if (dt == Scalar::Bool) dv = tb.cast(dv, Scalar::UInt8);
  const UOp* picked = tb.alu(Op::WHERE, {hit, tb.broadcast_to(dv, full), m.k(dv, 0)});
  const UOp* y = tb.reshape(tb.reduce(picked, ReduceOp::Add, {axis + 1}), is);
  if (dt == Scalar::Bool) y = tb.cast(y, Scalar::Bool);
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status one_hot(NodeContext& c) {
  ONNX_ASSIGN(const UOp* idx, c.in(0));
  ONNX_ASSIGN(double depth_v, c.scalar(1));
  ONNX_ASSIGN(const UOp* values, c.in(2));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const int64_t depth = static_cast<int64_t>(depth_v);
  if (depth <= 0) return c.invalid("depth must be positive");
  if (c.shape_of(values).size() != 1 || c.shape_of(values)[0] != 2) return c.invalid("values must be [off, on]");
  const Dims is = c.shape_of(idx);
  const int64_t r = static_cast<int64_t>(is.size()) + 1;
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", -1), r));
  // Indices compared as float64 after wrapping negatives (float indices are allowed).
  const UOp* ix = m.cast(idx, Scalar::Float64);
  ix = m.where(m.lt(ix, m.k(ix, 0)), m.add(ix, m.k(ix, static_cast<double>(depth))), ix);
  if (idx->dtype().is_float()) ix = m.tb().alu(Op::TRUNC, {ix});
  Dims ir = is;
  ir.insert(ir.begin() + axis, 1);
  Dims kr(r, 1);
  kr[axis] = depth;
  Dims full = is;
  full.insert(full.begin() + axis, depth);
  const UOp* hit = tb.alu(Op::CMPEQ, {tb.broadcast_to(tb.reshape(ix, ir), full),
                                      tb.broadcast_to(iota(c, depth, Scalar::Float64, kr), full)});
  const UOp* off = tb.reshape(slice_axis(tb, values, 0, 0, 1, 1), {});
  const UOp* on = tb.reshape(slice_axis(tb, values, 0, 1, 2, 1), {});
  c.out(0, tb.alu(Op::WHERE, {hit, tb.broadcast_to(on, full), tb.broadcast_to(off, full)}));
  return absl::OkStatus();
}

// Moves `axis` of x to the end (a permute); returns the permutation's inverse in `back`.
const UOp* axis_to_last(TensorBuilder& tb, const UOp* x, int64_t axis, std::vector<int64_t>& back) {
  const int64_t r = static_cast<int64_t>(tb.shape(x).size());
  std::vector<int64_t> perm;
  for (int64_t a = 0; a < r; ++a)
    if (a != axis) perm.push_back(a);
  perm.push_back(axis);
  back.assign(r, 0);
  for (int64_t i = 0; i < r; ++i) back[perm[i]] = i;
  return tb.permute(x, perm);
}

// Negative indices wrapped: idx < 0 ? idx + n : idx.
const UOp* wrap_index(Math& m, const UOp* idx, int64_t n) {
  return m.where(m.lt(idx, m.k(idx, 0)), m.add(idx, m.k(idx, static_cast<double>(n))), idx);
}

// TopK: each element's rank along the axis is the number of elements that come before it
// (larger, or equal and at a lower index; smaller for largest=0), and output k is the
// element of rank k: pairwise comparisons and sums, no sort.
absl::Status top_k(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  int64_t K;
  if (c.opset() < 10) {
    K = c.attr_int("k", -1);
  } else {
    ONNX_ASSIGN(std::vector<int64_t> kv, c.ints(1));
    if (kv.size() != 1) return c.invalid("K must hold one value");
    K = kv[0];
  }
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims xs = c.shape_of(x);
  const int64_t r = static_cast<int64_t>(xs.size());
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", -1), r));
  const int64_t n = xs[axis];
  if (K <= 0) return c.unsupported("K = 0 (empty tensors are not supported)");
  if (K > n) return c.invalid(cat("K = ", K, " is larger than the axis (", n, ")"));
  const bool largest = c.attr_int("largest", 1) != 0;
  std::vector<int64_t> back;
  const UOp* xt = axis_to_last(tb, x, axis, back);
  Dims lead = tb.shape(xt);
  lead.pop_back();
  auto shaped = [&](std::initializer_list<int64_t> tail) {
    Dims d = lead;
    d.insert(d.end(), tail);
    return d;
  };
  const Dims pair = shaped({n, n});  // [..., i, j]
  const UOp* xi = tb.broadcast_to(tb.reshape(xt, shaped({n, 1})), pair);
  const UOp* xj = tb.broadcast_to(tb.reshape(xt, shaped({1, n})), pair);
  Dims ir(lead.size(), 1), jr = ir;
  ir.push_back(n), ir.push_back(1);
  jr.push_back(1), jr.push_back(n);
  const UOp* ii = tb.broadcast_to(iota(c, n, Scalar::Int64, ir), pair);
  const UOp* jj = tb.broadcast_to(iota(c, n, Scalar::Int64, jr), pair);
  const UOp* before = m.or_(largest ? m.lt(xi, xj) : m.lt(xj, xi), m.and_(m.eq(xj, xi), m.lt(jj, ii)));
  const int64_t la = static_cast<int64_t>(lead.size());
  const UOp* rank = tb.reduce(m.cast(before, Scalar::Int64), ReduceOp::Add, {la + 1});  // [..., n, 1]
  Dims kr(lead.size() + 1, 1);
  kr.push_back(K);
  const Dims sel_shape = shaped({n, K});
  const UOp* hit = m.eq(tb.broadcast_to(rank, sel_shape), tb.broadcast_to(iota(c, K, Scalar::Int64, kr), sel_shape));
  Dims out_t = shaped({K});
  std::vector<int64_t> out_perm = back;
  if (c.wants(0)) {
    const UOp* xv = tb.broadcast_to(tb.reshape(xt, shaped({n, 1})), sel_shape);
    Scalar dt = c.dtype_of(x);
    if (dt == Scalar::Bool) return c.invalid("X must be numeric");
    const UOp* v = tb.reduce(m.where(hit, xv, m.k(xv, 0)), ReduceOp::Add, {la});
    c.out(0, tb.permute(tb.reshape(v, out_t), out_perm));
  }
  if (c.wants(1)) {
    Dims nr(lead.size(), 1);
    nr.push_back(n), nr.push_back(1);
    const UOp* iv = tb.broadcast_to(iota(c, n, Scalar::Int64, nr), sel_shape);
    const UOp* v = tb.reduce(m.where(hit, iv, m.k(iv, 0)), ReduceOp::Add, {la});
    c.out(1, tb.permute(tb.reshape(v, out_t), out_perm));
  }
  return absl::OkStatus();
}

// The `axis` attribute of Compress and Unique, or, without one, axis 0 of x flattened
// (x and its shape xs are replaced).
absl::StatusOr<int64_t> axis_or_flattened(NodeContext& c, const UOp*& x, Dims& xs) {
  if (c.has_attr("axis")) return c.axis(c.attr_int("axis", 0), static_cast<int64_t>(xs.size()));
  x = c.tb().reshape(x, {numel_of(xs)});
  xs = {numel_of(xs)};
  return 0;
}

// Compress: the condition decides the output's shape, so it is needed at import; the kept
// positions are then a gather.
absl::Status compress(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(HostTensor cond, c.constant(1));
  Dims xs = c.shape_of(x);
  ONNX_ASSIGN(int64_t axis, axis_or_flattened(c, x, xs));
  if (cond.numel() > xs[axis]) return c.invalid("condition is longer than the axis");
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < cond.numel(); ++i)
    if (cond.get(i).to_double() != 0) keep.push_back(i);
  if (keep.empty()) return c.unsupported("nothing kept (empty tensors are not supported)");
  ONNX_ASSIGN(HostTensor idx, c.zeros(Scalar::Int64, {static_cast<int64_t>(keep.size())}));
  for (size_t i = 0; i < keep.size(); ++i) idx.set(static_cast<int64_t>(i), ConstValue::Int(keep[i]));
  ONNX_ASSIGN(const UOp* y, gather(c, x, host_constant(c, std::move(idx)), axis));
  c.out(0, y);
  return absl::OkStatus();
}

// The flat row-major position into dims `d` of the index tuples in the last axis of `idx`
// ([..., m] -> [...], int64), negative entries wrapped per dim.
const UOp* flat_index(NodeContext& c, const UOp* idx, const Dims& d) {
  TensorBuilder& tb = c.tb();
  Math m(tb);
  Dims is = tb.shape(idx);
  const int64_t q = static_cast<int64_t>(is.size()) - 1, mm = is.back();
  Dims lead(is.begin(), is.end() - 1);
  const UOp* ix = m.cast(idx, Scalar::Int64);
  const UOp* acc = nullptr;
  int64_t stride = 1;
  for (int64_t t = mm - 1; t >= 0; --t) {
    const UOp* col = tb.reshape(slice_axis(tb, ix, q, t, t + 1, 1), lead);
    col = wrap_index(m, col, d[t]);
    const UOp* term = stride == 1 ? col : m.mul(col, m.k(col, static_cast<double>(stride)));
    acc = acc ? m.add(acc, term) : term;
    stride *= d[t];
  }
  return acc;
}

// GatherND: data [B..., P..., R...] with batch_dims B; indices [B..., Q..., m] pick data[b,
// idx] -> [B..., Q..., R...]. The m-tuples become flat positions into P and one-hot rows.
absl::Status gather_nd(NodeContext& c) {
  ONNX_ASSIGN(const UOp* data, c.in(0));
  ONNX_ASSIGN(const UOp* idx, c.in(1));
  if (!idx->dtype().is_int()) return c.invalid("indices must be integers");
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims ds = c.shape_of(data), is = c.shape_of(idx);
  const int64_t b = c.attr_int("batch_dims", 0);
  const int64_t q = static_cast<int64_t>(is.size()), r = static_cast<int64_t>(ds.size());
  if (q < 1 || b < 0 || b >= q || b >= r) return c.invalid("batch_dims must be less than both ranks");
  const int64_t mm = is.back();
  if (mm < 1 || b + mm > r) return c.invalid("the index tuples are longer than data's rank allows");
  for (int64_t a = 0; a < b; ++a)
    if (ds[a] != is[a]) return c.invalid("batch dims of data and indices differ");
  const Dims bd(ds.begin(), ds.begin() + b), pd(ds.begin() + b, ds.begin() + b + mm), rd(ds.begin() + b + mm, ds.end());
  const Dims qd(is.begin() + b, is.end() - 1);
  const int64_t B = numel_of(bd), P = numel_of(pd), R = numel_of(rd), Q = numel_of(qd);
  const UOp* flat = tb.reshape(flat_index(c, idx, pd), {B, Q, 1, 1});
  const UOp* hit = m.eq(flat, iota(c, P, Scalar::Int64, {1, 1, P, 1}));
  const UOp* dv = tb.reshape(data, {B, 1, P, R});
  Scalar dt = c.dtype_of(data);
  if (dt == Scalar::Bool) dv = tb.cast(dv, Scalar::UInt8);
  const Dims full = {B, Q, P, R};
  const UOp* y = tb.reduce(m.where(tb.broadcast_to(hit, full), tb.broadcast_to(dv, full), m.k(dv, 0)), ReduceOp::Add, {2});
  if (dt == Scalar::Bool) y = tb.cast(y, Scalar::Bool);
  Dims out = bd;
  out.insert(out.end(), qd.begin(), qd.end());
  out.insert(out.end(), rd.begin(), rd.end());
  c.out(0, tb.reshape(y, out));
  return absl::OkStatus();
}

// Scatter core shared by ScatterElements and ScatterND. hit [J, P, 1] says which of J
// updates lands on which of P positions; upd [J, 1, R]; data [P, R]. Returns [P, R].
absl::StatusOr<const UOp*> scatter_core(NodeContext& c, const UOp* data, const UOp* hit, const UOp* upd,
                                        const std::string& reduction) {
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims hs = tb.shape(hit), us = tb.shape(upd);
  const int64_t J = hs[0], P = hs[1], R = us[2];
  const Dims full = {J, P, R};
  const UOp* h = tb.broadcast_to(hit, full);
  const UOp* u = tb.broadcast_to(upd, full);
  Scalar dt = c.dtype_of(data);
  const bool is_bool = dt == Scalar::Bool;
  if (is_bool) {
    if (reduction != "none") return c.unsupported(cat("reduction '", reduction, "' on bool"));
    u = tb.cast(u, Scalar::UInt8);
    data = tb.cast(data, Scalar::UInt8);
  }
  const UOp* any = tb.reshape(tb.reduce(m.cast(hit, Scalar::UInt8), ReduceOp::Max, {0}), {P, 1});
  any = tb.broadcast_to(m.ne(any, m.k(any, 0)), {P, R});
  const UOp* y;
  if (reduction == "none") {
    // The last update to a position wins (the reference's loop order).
    const UOp* jj = tb.broadcast_to(iota(c, J, Scalar::Int64, {J, 1, 1}), full);
    const UOp* last = tb.reduce(m.where(h, jj, m.k(jj, -1)), ReduceOp::Max, {0});
    const UOp* pick = m.and_(h, m.eq(jj, tb.broadcast_to(last, full)));
    y = tb.reshape(tb.reduce(m.where(pick, u, m.k(u, 0)), ReduceOp::Add, {0}), {P, R});
  } else {
    ReduceOp op;
    if (reduction == "add") op = ReduceOp::Add;
    else if (reduction == "mul") op = ReduceOp::Mul;
    else if (reduction == "max") op = ReduceOp::Max;
    else if (reduction == "min") op = ReduceOp::Min;
    else return c.invalid(cat("reduction '", reduction, "'"));
    const UOp* ident = tb.full(dt, reduce_identity(op, dt), full);
    y = tb.reshape(tb.reduce(m.where(h, u, ident), op, {0}), {P, R});
    Op comb = op == ReduceOp::Add ? Op::ADD : op == ReduceOp::Mul ? Op::MUL : op == ReduceOp::Max ? Op::MAX : Op::MIN;
    y = tb.alu(comb, {data, y});
  }
  y = m.where(any, y, data);
  if (is_bool) y = tb.cast(y, Scalar::Bool);
  return y;
}

absl::Status scatter_elements(NodeContext& c) {
  ONNX_ASSIGN(const UOp* data, c.in(0));
  ONNX_ASSIGN(const UOp* idx, c.in(1));
  ONNX_ASSIGN(const UOp* upd, c.in(2));
  if (!idx->dtype().is_int()) return c.invalid("indices must be integers");
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims ds = c.shape_of(data), is = c.shape_of(idx);
  const int64_t r = static_cast<int64_t>(ds.size());
  if (c.shape_of(upd) != is) return c.invalid("updates and indices differ in shape");
  if (static_cast<int64_t>(is.size()) != r) return c.invalid("data and indices differ in rank");
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", 0), r));
  for (int64_t a = 0; a < r; ++a)
    if (is[a] > ds[a]) return c.invalid("indices larger than data");
  // Positions of data as flat row-major numbers; each update's target is its own position
  // with the axis coordinate replaced by its index.
  Dims strides(r, 1);
  for (int64_t a = r - 2; a >= 0; --a) strides[a] = strides[a + 1] * ds[a + 1];
  const UOp* ix = wrap_index(m, m.cast(idx, Scalar::Int64), ds[axis]);
  const UOp* target = m.mul(ix, m.k(ix, static_cast<double>(strides[axis])));
  for (int64_t a = 0; a < r; ++a) {
    if (a == axis) continue;
    Dims sh(r, 1);
    sh[a] = is[a];
    const UOp* io = iota(c, is[a], Scalar::Int64, sh);
    target = m.add(target, tb.broadcast_to(m.mul(io, m.k(io, static_cast<double>(strides[a]))), is));
  }
  const int64_t J = numel_of(is), P = numel_of(ds);
  const UOp* hit = m.eq(tb.reshape(target, {J, 1, 1}), iota(c, P, Scalar::Int64, {1, P, 1}));
  ONNX_ASSIGN(const UOp* y, scatter_core(c, tb.reshape(data, {P, 1}), hit, tb.reshape(upd, {J, 1, 1}),
                                          c.attr_string("reduction", "none")));
  c.out(0, tb.reshape(y, ds));
  return absl::OkStatus();
}

absl::Status scatter_nd(NodeContext& c) {
  ONNX_ASSIGN(const UOp* data, c.in(0));
  ONNX_ASSIGN(const UOp* idx, c.in(1));
  ONNX_ASSIGN(const UOp* upd, c.in(2));
  if (!idx->dtype().is_int()) return c.invalid("indices must be integers");
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims ds = c.shape_of(data), is = c.shape_of(idx), us = c.shape_of(upd);
  const int64_t mm = is.empty() ? 0 : is.back();
  if (mm < 1 || mm > static_cast<int64_t>(ds.size())) return c.invalid("the index tuples do not fit data's rank");
  const Dims pd(ds.begin(), ds.begin() + mm), rd(ds.begin() + mm, ds.end()), qd(is.begin(), is.end() - 1);
  Dims want = qd;
  want.insert(want.end(), rd.begin(), rd.end());
  if (us != want) return c.invalid("updates must be indices.shape[:-1] + data.shape[m:]");
  const int64_t P = numel_of(pd), R = numel_of(rd), J = numel_of(qd);
  const UOp* hit = m.eq(tb.reshape(flat_index(c, idx, pd), {J, 1, 1}), iota(c, P, Scalar::Int64, {1, P, 1}));
  ONNX_ASSIGN(const UOp* y, scatter_core(c, tb.reshape(data, {P, R}), hit, tb.reshape(upd, {J, 1, R}),
                                          c.attr_string("reduction", "none")));
  c.out(0, tb.reshape(y, ds));
  return absl::OkStatus();
}

// Einsum: every operand's repeated letters reduced to their diagonal, all operands laid out
// over the letters of the whole equation and multiplied, the letters absent from the
// output summed away, the rest permuted into the output's order.
absl::Status einsum(NodeContext& c) {
  std::string eq;
  for (char ch : c.attr_string("equation", ""))
    if (ch != ' ') eq += ch;
  ONNX_ASSIGN(std::vector<const UOp*> xs, all_inputs(c));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    size_t q = lhs.find(',', p);
    terms.push_back(lhs.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (terms.size() != xs.size()) return c.invalid("the equation and the inputs differ in number");
  // Ellipsis: the dims it stands for become letters '0'.. (right-aligned, broadcast).
  size_t ell = 0;
  for (size_t t = 0; t < terms.size(); ++t) {
    size_t pos = terms[t].find("...");
    if (pos == std::string::npos) continue;
    const size_t named = terms[t].size() - 3;
    const size_t rank = tb.shape(xs[t]).size();
    if (rank < named) return c.invalid("an operand has fewer dims than its letters");
    ell = std::max(ell, rank - named);
  }
  if (ell > 10) return c.unsupported("more than 10 ellipsis dims");
  std::string ell_letters;
  for (size_t i = 0; i < ell; ++i) ell_letters += static_cast<char>('0' + i);
  std::vector<std::string> sub(terms.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    size_t pos = terms[t].find("...");
    if (pos == std::string::npos) {
      sub[t] = terms[t];
    } else {
      const size_t k = tb.shape(xs[t]).size() - (terms[t].size() - 3);
      sub[t] = terms[t].substr(0, pos) + ell_letters.substr(ell - k) + terms[t].substr(pos + 3);
    }
    if (sub[t].size() != tb.shape(xs[t]).size()) return c.invalid(cat("term '", terms[t], "' does not match its operand's rank"));
  }
  std::string out;
  if (arrow != std::string::npos) {
    std::string rhs = eq.substr(arrow + 2);
    size_t pos = rhs.find("...");
    out = pos == std::string::npos ? rhs : rhs.substr(0, pos) + ell_letters + rhs.substr(pos + 3);
  } else {
    // Implicit: the ellipsis dims, then the letters used once, alphabetically.
    std::map<char, int> count;
    for (const std::string& s : sub)
      for (char ch : s)
        if (!(ch >= '0' && ch <= '9')) ++count[ch];
    out = ell_letters;
    for (auto& [ch, n] : count)
      if (n == 1) out += ch;
  }
  // All letters: output first, then the summed ones.
  std::string all = out;
  for (const std::string& s : sub)
    for (char ch : s)
      if (all.find(ch) == std::string::npos) all += ch;
  std::map<char, int64_t> size;
  std::vector<const UOp*> laid;
  for (size_t t = 0; t < sub.size(); ++t) {
    const UOp* x = xs[t];
    std::string s = sub[t];
    // Diagonals: a letter at i and again at j keeps x[.., i = j, ..] (mask and sum over j).
    for (size_t i = 0; i < s.size(); ++i) {
      size_t j;
      while ((j = s.find(s[i], i + 1)) != std::string::npos) {
        Dims xsh = tb.shape(x);
        if (xsh[i] != xsh[j]) return c.invalid(cat("letter '", s[i], "' has two sizes in one term"));
        const int64_t n = xsh[i];
        Dims ai(xsh.size(), 1), aj(xsh.size(), 1);
        ai[i] = n, aj[j] = n;
        const UOp* eye = m.eq(tb.broadcast_to(iota(c, n, Scalar::Int64, ai), xsh), tb.broadcast_to(iota(c, n, Scalar::Int64, aj), xsh));
        x = tb.reduce(m.where(eye, x, m.k(x, 0)), ReduceOp::Add, {static_cast<int64_t>(j)});
        Dims ns = xsh;
        ns.erase(ns.begin() + static_cast<long>(j));
        x = tb.reshape(x, ns);
        s.erase(j, 1);
      }
    }
    const Dims xsh = tb.shape(x);
    for (size_t i = 0; i < s.size(); ++i) {
      auto it = size.find(s[i]);
      if (it == size.end()) size[s[i]] = xsh[i];
      else if (it->second == 1) it->second = xsh[i];
      else if (xsh[i] != 1 && xsh[i] != it->second) return c.invalid(cat("letter '", s[i], "' has two sizes"));
    }
    // Permute to the order of `all`, then reshape with 1 for the letters it lacks.
    std::vector<int64_t> perm;
    Dims shape;
    for (char ch : all) {
      size_t p = s.find(ch);
      if (p != std::string::npos) perm.push_back(static_cast<int64_t>(p)), shape.push_back(xsh[p]);
      else shape.push_back(1);
    }
    laid.push_back(tb.reshape(tb.permute(x, perm), shape));
  }
  Dims full;
  for (char ch : all) full.push_back(size[ch]);
  const UOp* prod = nullptr;
  for (const UOp* x : laid) {
    const UOp* xb = tb.broadcast_to(x, full);
    prod = prod ? m.mul(prod, xb) : xb;
  }
  Dims out_shape(full.begin(), full.begin() + static_cast<long>(out.size()));
  if (all.size() > out.size()) {
    std::vector<int64_t> axes;
    for (size_t i = out.size(); i < all.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    prod = tb.reshape(tb.reduce(prod, ReduceOp::Add, axes), out_shape);
  }
  c.out(0, prod);
  return absl::OkStatus();
}

// ReverseSequence: the lengths decide which positions move, so they are needed at import;
// each batch entry is then a gather along the time axis.
absl::Status reverse_sequence(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(std::vector<int64_t> lens, c.ints(1));
  TensorBuilder& tb = c.tb();
  const Dims xs = c.shape_of(x);
  const int64_t ta = c.attr_int("time_axis", 0), ba = c.attr_int("batch_axis", 1);
  if (xs.size() < 2 || !((ta == 0 && ba == 1) || (ta == 1 && ba == 0))) return c.invalid("time_axis and batch_axis must be 0 and 1");
  const int64_t T = xs[ta], B = xs[ba];
  if (static_cast<int64_t>(lens.size()) != B) return c.invalid("sequence_lens must have one value per batch entry");
  std::vector<const UOp*> parts;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = lens[b];
    if (L < 0 || L > T) return c.invalid(cat("sequence length ", L, " is outside [0, ", T, "]"));
    ONNX_ASSIGN(HostTensor idx, c.zeros(Scalar::Int64, {T}));
    for (int64_t t = 0; t < T; ++t) idx.set(t, ConstValue::Int(t < L ? L - 1 - t : t));
    const UOp* xb = slice_axis(tb, x, ba, b, b + 1, 1);
    ONNX_ASSIGN(const UOp* g, gather(c, xb, host_constant(c, std::move(idx)), ta));
    parts.push_back(g);
  }
  c.out(0, concat(tb, parts, ba));
  return absl::OkStatus();
}

// NonZero: the output's shape is the input's count of non-zeros, so the input is needed at
// import; the result is a constant.
absl::Status non_zero(NodeContext& c) {
  ONNX_ASSIGN(HostTensor x, c.constant(0));
  const Dims xs = x.shape;
  const int64_t r = std::max<int64_t>(1, static_cast<int64_t>(xs.size()));
  std::vector<int64_t> hits;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (x.get(i).to_double() != 0) hits.push_back(i);
  if (hits.empty()) return c.unsupported("no non-zero element (empty tensors are not supported)");
  const int64_t n = static_cast<int64_t>(hits.size());
  ONNX_ASSIGN(HostTensor t, c.zeros(Scalar::Int64, {r, n}));
  for (int64_t j = 0; j < n; ++j) {
    int64_t rem = hits[j];
    for (int64_t a = static_cast<int64_t>(xs.size()) - 1; a >= 0; --a) {
      t.set(a * n + j, ConstValue::Int(rem % xs[a]));
      rem /= xs[a];
    }
  }
  c.out_constant(0, std::move(t));
  return absl::OkStatus();
}

// Unique: which slices are distinct decides every output's shape, so the input is needed at
// import. Y is gathered from X on the device; indices, inverse_indices and counts are
// constants.
absl::Status unique(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(HostTensor xv, c.constant(0));
  Dims xs = c.shape_of(x);
  ONNX_ASSIGN(int64_t axis, axis_or_flattened(c, x, xs));
  const int64_t n = xs[axis];
  const int64_t inner = numel_of(Dims(xs.begin() + axis + 1, xs.end())), outer = numel_of(Dims(xs.begin(), xs.begin() + axis));
  // Slice k as a key: its values in row-major order (outer, inner).
  std::vector<std::vector<double>> keys(n);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) keys[k].push_back(xv.get((o * n + k) * inner + i).to_double());
  std::vector<int64_t> first;  // first occurrence of each distinct key
  std::vector<int64_t> group(n);
  for (int64_t k = 0; k < n; ++k) {
    int64_t g = -1;
    for (size_t u = 0; u < first.size(); ++u)
      if (keys[first[u]] == keys[k]) g = static_cast<int64_t>(u);
    if (g < 0) g = static_cast<int64_t>(first.size()), first.push_back(k);
    group[k] = g;
  }
  std::vector<int64_t> order(first.size());
  for (size_t u = 0; u < order.size(); ++u) order[u] = static_cast<int64_t>(u);
  if (c.attr_int("sorted", 1) != 0)
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[first[a]] < keys[first[b]]; });
  std::vector<int64_t> pos(order.size());
  for (size_t p = 0; p < order.size(); ++p) pos[order[p]] = static_cast<int64_t>(p);
  const int64_t u = static_cast<int64_t>(order.size());
  ONNX_ASSIGN(HostTensor idx, c.zeros(Scalar::Int64, {u}));
  ONNX_ASSIGN(HostTensor counts, c.zeros(Scalar::Int64, {u}));
  ONNX_ASSIGN(HostTensor inv, c.zeros(Scalar::Int64, {n}));
  for (int64_t p = 0; p < u; ++p) idx.set(p, ConstValue::Int(first[order[p]]));
  for (int64_t k = 0; k < n; ++k) {
    inv.set(k, ConstValue::Int(pos[group[k]]));
    counts.set(pos[group[k]], ConstValue::Int(counts.get(pos[group[k]]).to_int() + 1));
  }
  if (c.wants(0)) {
    ONNX_ASSIGN(const UOp* y, gather(c, x, host_constant(c, idx), axis));
    c.out(0, y);
  }
  if (c.wants(1)) c.out_constant(1, idx);
  if (c.wants(2)) c.out_constant(2, inv);
  if (c.wants(3)) c.out_constant(3, counts);
  return absl::OkStatus();
}

// Det: Leibniz's sum over permutations of the last two axes' elements (small matrices).
absl::Status det(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims xs = c.shape_of(x);
  const size_t r = xs.size();
  if (r < 2 || xs[r - 1] != xs[r - 2]) return c.invalid("X must be [..., M, M]");
  const int64_t M = xs[r - 1];
  if (M > 5) return c.unsupported(cat("matrices larger than 5x5 (", M, "x", M, ")"));
  const Dims lead(xs.begin(), xs.end() - 2);
  const UOp* xw = m.cast(x, Scalar::Float64);
  auto elem = [&](int64_t i, int64_t j) {
    std::vector<int64_t> b(r, 0), e = xs;
    b[r - 2] = i, e[r - 2] = i + 1, b[r - 1] = j, e[r - 1] = j + 1;
    return tb.reshape(tb.shrink(xw, b, e), lead);
  };
  std::vector<int64_t> p(M);
  for (int64_t i = 0; i < M; ++i) p[i] = i;
  const UOp* acc = nullptr;
  do {
    int inversions = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = i + 1; j < M; ++j)
        if (p[i] > p[j]) ++inversions;
    const UOp* term = elem(0, p[0]);
    for (int64_t i = 1; i < M; ++i) term = m.mul(term, elem(i, p[i]));
    if (!acc) acc = inversions % 2 ? m.neg(term) : term;
    else acc = inversions % 2 ? m.sub(acc, term) : m.add(acc, term);
  } while (std::next_permutation(p.begin(), p.end()));
  c.out(0, m.cast(acc, c.dtype_of(x)));
  return absl::OkStatus();
}

// --- RNN, GRU, LSTM: unrolled over the (static) sequence, one matmul per step for the
// recurrence; the input projections of every step are one matmul up front.

enum class RnnKind { Rnn, Gru, Lstm };

absl::Status recurrent(NodeContext& c, RnnKind kind) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* W, c.in(1));
  ONNX_ASSIGN(const UOp* R, c.in(2));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const int64_t G = kind == RnnKind::Rnn ? 1 : kind == RnnKind::Gru ? 3 : 4;
  const int64_t layout = c.attr_int("layout", 0);
  if (layout != 0 && layout != 1) return c.invalid("layout must be 0 or 1");
  if (layout == 1) x = tb.permute(x, {1, 0, 2});
  const Dims xs = c.shape_of(x), wsh = c.shape_of(W);
  if (xs.size() != 3 || wsh.size() != 3) return c.invalid("X and W must have rank 3");
  const int64_t S = xs[0], B = xs[1], I = xs[2], D = wsh[0];
  const int64_t H = c.attr_int("hidden_size", wsh[1] / G);
  const std::string dir = c.attr_string("direction", "forward");
  if ((dir == "bidirectional") != (D == 2) || (dir != "forward" && dir != "reverse" && dir != "bidirectional"))
    return c.invalid(cat("direction '", dir, "' with ", D, " direction(s) of weights"));
  if (wsh[1] != G * H || wsh[2] != I || c.shape_of(R) != Dims{D, G * H, H}) return c.invalid("W / R do not match hidden_size");
  if (kind == RnnKind::Lstm && c.attr_int("input_forget", 0) != 0) return c.unsupported("input_forget");
  // Every step is unrolled into the graph: a sequence as long as a declared shape can say
  // would make the graph without bound before any limit saw it.
  constexpr int64_t kMaxUnrolledSteps = int64_t{1} << 14;
  if (S > kMaxUnrolledSteps || S * D > kMaxUnrolledSteps)
    return c.unsupported(cat("a sequence of ", S, " steps in ", D, " direction(s): at most ", kMaxUnrolledSteps,
                             " steps are unrolled"));
  if (c.has(4)) {
    ONNX_ASSIGN(std::vector<int64_t> lens, c.ints(4));
    for (int64_t l : lens)
      if (l != S) return c.unsupported("sequence_lens shorter than the sequence");
  }
  // Activations: f, g (and h for LSTM) per direction.
  std::vector<std::string> acts;
  for (const auto& s : c.attr(std::string("activations")) ? c.attr("activations")->strings()
                                                         : google::protobuf::RepeatedPtrField<std::string>())
    acts.push_back(s);
  const size_t per = kind == RnnKind::Rnn ? 1 : kind == RnnKind::Gru ? 2 : 3;
  if (acts.empty()) {
    for (int64_t d = 0; d < D; ++d) {
      if (kind == RnnKind::Rnn) acts.push_back("Tanh");
      else if (kind == RnnKind::Gru) acts.insert(acts.end(), {"Sigmoid", "Tanh"});
      else acts.insert(acts.end(), {"Sigmoid", "Tanh", "Tanh"});
    }
  }
  if (acts.size() != per * static_cast<size_t>(D)) return c.invalid("activations must list one set per direction");
  if (c.has_attr("activation_alpha") || c.has_attr("activation_beta"))
    return c.unsupported("activation_alpha / activation_beta");
  for (const std::string& a : acts)
    if (a != "Sigmoid" && a != "Tanh" && a != "Relu") return c.unsupported(cat("activation '", a, "'"));
  auto act = [&](const std::string& a, const UOp* v) -> const UOp* {
    if (a == "Sigmoid") return m.sigmoid(v);
    if (a == "Tanh") return m.tanh(v);
    return m.max(v, m.k(v, 0));
  };
  const bool has_clip = c.has_attr("clip");
  const double clip = c.attr_float("clip", 0);
  auto clipped = [&](const UOp* v) { return has_clip ? m.min(m.max(v, m.k(v, -clip)), m.k(v, clip)) : v; };
  const UOp* Bias = nullptr;
  if (c.has(3)) {
    ONNX_ASSIGN(Bias, c.in(3));
  }
  const UOp* h0 = nullptr;
  const UOp* c0 = nullptr;
  const UOp* P = nullptr;
  if (c.has(5)) {
    ONNX_ASSIGN(h0, c.in(5));
  }
  if (kind == RnnKind::Lstm && c.has(6)) {
    ONNX_ASSIGN(c0, c.in(6));
  }
  if (kind == RnnKind::Lstm && c.has(7)) {
    ONNX_ASSIGN(P, c.in(7));
  }
  const bool lbr = kind == RnnKind::Gru && c.attr_int("linear_before_reset", 0) != 0;
  auto row = [&](const UOp* t, int64_t d, int64_t from, int64_t len) {  // t[d, from:from+len] of a [D, n]
    return tb.reshape(tb.shrink(t, {d, from}, {d + 1, from + len}), {1, len});
  };
  auto cols = [&](const UOp* t, int64_t g) {  // gate g of a [B, G*H]
    return tb.shrink(t, {0, g * H}, {B, (g + 1) * H});
  };
  std::vector<std::vector<const UOp*>> ys(D);
  std::vector<const UOp*> hs(D), cs(D);
  for (int64_t d = 0; d < D; ++d) {
    const bool rev = dir == "reverse" || d == 1;
    const std::string* a = &acts[per * d];
    const UOp* Wd = tb.reshape(tb.shrink(W, {d, 0, 0}, {d + 1, G * H, I}), {G * H, I});
    const UOp* Rd = tb.reshape(tb.shrink(R, {d, 0, 0}, {d + 1, G * H, H}), {G * H, H});
    const UOp* Rt = tb.permute(Rd, {1, 0});
    // X W^T + Wb for every step: [S*B, G*H].
    const UOp* xw = tb.matmul(tb.reshape(x, {S * B, I}), tb.permute(Wd, {1, 0}));
    const UOp* wb = nullptr;
    const UOp* rb = nullptr;
    if (Bias) {
      wb = row(Bias, d, 0, G * H);
      rb = row(Bias, d, G * H, G * H);
      xw = m.add(xw, wb);
    }
    const UOp* h = h0 ? tb.reshape(tb.shrink(h0, {d, 0, 0}, {d + 1, B, H}), {B, H}) : tb.full(c.dtype_of(x), 0.0, {B, H});
    const UOp* cell = c0 ? tb.reshape(tb.shrink(c0, {d, 0, 0}, {d + 1, B, H}), {B, H}) : tb.full(c.dtype_of(x), 0.0, {B, H});
    ys[d].assign(S, nullptr);
    for (int64_t step = 0; step < S; ++step) {
      const int64_t t = rev ? S - 1 - step : step;
      const UOp* xt = tb.shrink(xw, {t * B, 0}, {(t + 1) * B, G * H});
      const UOp* hr = tb.matmul(h, Rt);  // [B, G*H]
      if (rb) hr = m.add(hr, rb);
      if (kind == RnnKind::Rnn) {
        h = act(a[0], clipped(m.add(xt, hr)));
      } else if (kind == RnnKind::Gru) {
        const UOp* z = act(a[0], clipped(m.add(cols(xt, 0), cols(hr, 0))));
        const UOp* r = act(a[0], clipped(m.add(cols(xt, 1), cols(hr, 1))));
        const UOp* Rh = tb.shrink(Rt, {0, 2 * H}, {H, 3 * H});
        const UOp* hh;
        if (lbr) {
          hh = m.add(cols(xt, 2), m.mul(r, cols(hr, 2)));
        } else {
          const UOp* rh = tb.matmul(m.mul(r, h), Rh);
          if (rb) rh = m.add(rh, tb.shrink(rb, {0, 2 * H}, {1, 3 * H}));
          hh = m.add(cols(xt, 2), rh);
        }
        hh = act(a[1], clipped(hh));
        h = m.add(m.mul(m.sub(m.k(z, 1), z), hh), m.mul(z, h));
      } else {
        const UOp* gi = m.add(cols(xt, 0), cols(hr, 0));
        const UOp* go = m.add(cols(xt, 1), cols(hr, 1));
        const UOp* gf = m.add(cols(xt, 2), cols(hr, 2));
        const UOp* gc = m.add(cols(xt, 3), cols(hr, 3));
        if (P) {
          gi = m.add(gi, m.mul(row(P, d, 0, H), cell));
          gf = m.add(gf, m.mul(row(P, d, 2 * H, H), cell));
        }
        const UOp* it = act(a[0], clipped(gi));
        const UOp* ft = act(a[0], clipped(gf));
        const UOp* ct = act(a[1], clipped(gc));
        cell = m.add(m.mul(ft, cell), m.mul(it, ct));
        if (P) go = m.add(go, m.mul(row(P, d, H, H), cell));
        const UOp* ot = act(a[0], clipped(go));
        h = m.mul(ot, act(a[2], cell));
      }
      // Each step's state is realized: unrealized, step t's state is an expression of
      // every step before it (the LSTM cell is elementwise all the way back), and whatever
      // reads all steps (Y, fused into a next layer's input projection) holds the whole
      // unrolled chain in one kernel, past --max-kernel-ops at a few dozen steps.
      h = tb.contiguous(h);
      if (kind == RnnKind::Lstm) cell = tb.contiguous(cell);
      ys[d][t] = h;
    }
    hs[d] = h;
    cs[d] = cell;
  }
  auto stack_dirs = [&](const std::vector<const UOp*>& v) {
    std::vector<const UOp*> parts;
    for (const UOp* p : v) parts.push_back(tb.reshape(p, {1, B, H}));
    return concat(tb, parts, 0);  // [D, B, H]
  };
  if (c.wants(0)) {
    std::vector<const UOp*> steps;
    for (int64_t t = 0; t < S; ++t) {
      std::vector<const UOp*> per_dir;
      for (int64_t d = 0; d < D; ++d) per_dir.push_back(ys[d][t]);
      steps.push_back(tb.reshape(stack_dirs(per_dir), {1, D, B, H}));
    }
    const UOp* y = concat(tb, steps, 0);  // [S, D, B, H]
    if (layout == 1) y = tb.permute(y, {2, 0, 1, 3});
    c.out(0, y);
  }
  auto state_out = [&](const std::vector<const UOp*>& v) {
    const UOp* s = stack_dirs(v);
    return layout == 1 ? tb.permute(s, {1, 0, 2}) : s;
  };
  if (c.wants(1)) c.out(1, state_out(hs));
  if (kind == RnnKind::Lstm && c.wants(2)) c.out(2, state_out(cs));
  return absl::OkStatus();
}

// MaxUnpool: X's values written at the flat positions of I (as MaxPool's Indices give
// them) into zeros of the output shape.
absl::Status max_unpool(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* idx, c.in(1));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims xs = c.shape_of(x);
  if (xs.size() < 3 || c.shape_of(idx) != xs) return c.invalid("X and I must be [N, C, D...] of one shape");
  const size_t sp = xs.size() - 2;
  // Indices are positions in the inferred shape; an output_shape input pads that at the
  // ends (as the reference does).
  Dims kernel = c.attr_ints("kernel_shape"), strides = c.attr_ints("strides"), pads = c.attr_ints("pads");
  if (kernel.size() != sp) return c.invalid("kernel_shape must have one value per spatial axis");
  if (strides.empty()) strides.assign(sp, 1);
  if (pads.empty()) pads.assign(2 * sp, 0);
  Dims out = {xs[0], xs[1]};
  for (size_t i = 0; i < sp; ++i) out.push_back((xs[2 + i] - 1) * strides[i] - pads[i] - pads[sp + i] + kernel[i]);
  Dims final_shape = out;
  if (c.has(2)) {
    ONNX_ASSIGN(final_shape, c.ints(2));
    if (final_shape.size() != xs.size()) return c.invalid("output_shape must have one value per dim");
    for (size_t i = 0; i < xs.size(); ++i)
      if (final_shape[i] < out[i]) return c.unsupported("output_shape smaller than the inferred shape");
  }
  const int64_t J = numel_of(xs), Pn = numel_of(out);
  const UOp* hit = m.eq(tb.reshape(m.cast(idx, Scalar::Int64), {J, 1, 1}), iota(c, Pn, Scalar::Int64, {1, Pn, 1}));
  ONNX_ASSIGN(const UOp* y, scatter_core(c, tb.full(c.dtype_of(x), 0.0, {Pn, 1}), hit, tb.reshape(x, {J, 1, 1}), "none"));
  y = tb.reshape(y, out);
  if (final_shape != out) {
    std::vector<int64_t> b(out.size(), 0), e(out.size(), 0);
    for (size_t i = 0; i < out.size(); ++i) e[i] = final_shape[i] - out[i];
    y = tb.pad(y, b, e);
  }
  c.out(0, y);
  return absl::OkStatus();
}

}  // namespace

void register_indexing(Registry& r) {
  r["Gather"] = {gather_op, {"axis"}};
  r["GatherElements"] = {gather_elements, {"axis"}};
  r["OneHot"] = {one_hot, {"axis"}};
  r["TopK"] = {top_k, {"axis", "k", "largest", "sorted"}};
  r["Compress"] = {compress, {"axis"}};
  r["GatherND"] = {gather_nd, {"batch_dims"}};
  r["ScatterElements"] = {scatter_elements, {"axis", "reduction"}};
  r["Scatter"] = {scatter_elements, {"axis"}};
  r["ScatterND"] = {scatter_nd, {"reduction"}};
  r["Einsum"] = {einsum, {"equation"}};
  r["ReverseSequence"] = {reverse_sequence, {"batch_axis", "time_axis"}};
  r["NonZero"] = {non_zero, {}};
  r["Unique"] = {unique, {"axis", "sorted"}};
  r["Det"] = {det, {}};
  r["MaxUnpool"] = {max_unpool, {"kernel_shape", "pads", "strides"}};
  const std::vector<std::string> rnn = {"activation_alpha", "activation_beta", "activations", "clip", "direction",
                                        "hidden_size", "layout"};
  r["RNN"] = {[](NodeContext& c) { return recurrent(c, RnnKind::Rnn); }, rnn};
  std::vector<std::string> gru = rnn, lstm = rnn;
  gru.push_back("linear_before_reset");
  lstm.push_back("input_forget");
  r["GRU"] = {[](NodeContext& c) { return recurrent(c, RnnKind::Gru); }, gru};
  r["LSTM"] = {[](NodeContext& c) { return recurrent(c, RnnKind::Lstm); }, lstm};
}

const Registry& registry() {
  static const Registry* r = [] {
    auto* reg = new Registry;
    register_elementwise(*reg);
    register_activations(*reg);
    register_shape_ops(*reg);
    register_reductions(*reg);
    register_matmul_conv(*reg);
    register_normalization(*reg);
    register_resize(*reg);
    register_quantized(*reg);
    register_indexing(*reg);
    register_losses(*reg);
    return reg;
  }();
  return *r;
}

}  // namespace uop::onnx_import
