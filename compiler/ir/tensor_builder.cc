#include "compiler/ir/tensor_builder.h"

#include <algorithm>
#include <cassert>

#include "compiler/ir/eval.h"

namespace uop {

TensorBuilder::TensorBuilder(Graph& g, std::string device)
    : g_(g), device_(g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{std::move(device)}})) {}

int64_t TensorBuilder::numel(const UOp* x) const {
  int64_t n = 1;
  for (int64_t d : shape(x)) n *= d;
  return n;
}

const UOp* TensorBuilder::shaped(const UOp* u, std::vector<int64_t> shape) {
  shapes_[u] = std::move(shape);
  return u;
}

const UOp* TensorBuilder::shape_operand(const std::vector<int64_t>& dims) {
  std::vector<ConstValue> v;
  for (int64_t d : dims) v.push_back(ConstValue::Int(d));
  return g_.make(Op::VCONST, dtypes::index.vec(static_cast<uint32_t>(dims.size())), {}, VConstArg{v});
}

const UOp* TensorBuilder::input(Scalar dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const UOp* unique = g_.make(Op::UNIQUE, dtypes::void_, {}, IntArg{next_unique_++});
  const UOp* buf = shaped(g_.make(Op::BUFFER, DType(dtype), {unique, device_}, BufferArg{n}), {n});
  const UOp* x = reshape(buf, std::move(shape));
  buffers_[x] = buf;
  return x;
}

const UOp* TensorBuilder::full(Scalar dtype, ConstValue v, std::vector<int64_t> shape) {
  const UOp* c = shaped(g_.cnst(DType(dtype), v), {});
  return broadcast_to(c, shape);
}

const UOp* TensorBuilder::reshape(const UOp* x, std::vector<int64_t> shape) {
  if (this->shape(x) == shape) return x;
  return shaped(g_.make(Op::RESHAPE, x->dtype(), {x, shape_operand(shape)}), shape);
}

const UOp* TensorBuilder::expand(const UOp* x, std::vector<int64_t> shape) {
  if (this->shape(x) == shape) return x;
  return shaped(g_.make(Op::EXPAND, x->dtype(), {x, shape_operand(shape)}), shape);
}

const UOp* TensorBuilder::permute(const UOp* x, std::vector<int64_t> axes) {
  std::vector<int64_t> out;
  for (int64_t a : axes) out.push_back(shape(x)[a]);
  return shaped(g_.make(Op::PERMUTE, x->dtype(), {x}, IntsArg{axes}), out);
}

const UOp* TensorBuilder::pad(const UOp* x, std::vector<int64_t> begins, std::vector<int64_t> ends) {
  std::vector<int64_t> out = shape(x);
  for (size_t i = 0; i < out.size(); ++i) out[i] += begins[i] + ends[i];
  return shaped(g_.make(Op::PAD, x->dtype(), {x, shape_operand(begins), shape_operand(ends)}), out);
}

const UOp* TensorBuilder::shrink(const UOp* x, std::vector<int64_t> begins, std::vector<int64_t> ends) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < begins.size(); ++i) out.push_back(ends[i] - begins[i]);
  return shaped(g_.make(Op::SHRINK, x->dtype(), {x, shape_operand(begins), shape_operand(ends)}), out);
}

const UOp* TensorBuilder::flip(const UOp* x, std::vector<bool> axes) {
  return shaped(g_.make(Op::FLIP, x->dtype(), {x}, BoolsArg{axes}), shape(x));
}

const UOp* TensorBuilder::reduce(const UOp* x, ReduceOp op, std::vector<int64_t> axes) {
  std::vector<int64_t> out = shape(x);
  for (int64_t a : axes) out[a] = 1;
  return shaped(g_.make(Op::REDUCE_AXIS, x->dtype(), {x}, ReduceAxisArg{op, axes}), out);
}

const UOp* TensorBuilder::contiguous(const UOp* x) {
  return shaped(g_.make(Op::CONTIGUOUS, x->dtype(), {x}), shape(x));
}

const UOp* TensorBuilder::broadcast_to(const UOp* x, const std::vector<int64_t>& to) {
  const auto& s = shape(x);
  assert(s.size() <= to.size() && "cannot broadcast to a lower rank");
  std::vector<int64_t> padded(to.size() - s.size(), 1);
  padded.insert(padded.end(), s.begin(), s.end());
  return expand(reshape(x, padded), to);
}

const UOp* TensorBuilder::alu(Op op, std::initializer_list<const UOp*> src) {
  std::vector<int64_t> out;
  for (const UOp* s : src) {
    const auto& sh = shape(s);
    if (sh.size() > out.size()) out.insert(out.begin(), sh.size() - out.size(), 1);
    for (size_t i = 0; i < sh.size(); ++i) {
      int64_t& o = out[out.size() - sh.size() + i];
      assert((o == 1 || sh[i] == 1 || o == sh[i]) && "shapes do not broadcast");
      if (o == 1) o = sh[i];
    }
  }
  std::vector<const UOp*> b;
  for (const UOp* s : src) b.push_back(broadcast_to(s, out));
  return shaped(g_.alu(op, b), out);
}

const UOp* TensorBuilder::cast(const UOp* x, Scalar to) {
  return shaped(g_.make(Op::CAST, DType(to), {x}), shape(x));
}

const UOp* TensorBuilder::bitcast(const UOp* x, Scalar to) {
  return shaped(g_.make(Op::BITCAST, DType(to), {x}), shape(x));
}

const UOp* TensorBuilder::matmul(const UOp* a, const UOp* b) {
  std::vector<int64_t> sa = shape(a), sb = shape(b);
  assert(sa.size() >= 2 && sa.size() == sb.size() && sa.back() == sb[sb.size() - 2]);
  size_t r = sa.size();
  int64_t m = sa[r - 2], k = sa[r - 1], n = sb[r - 1];
  std::vector<int64_t> batch(sa.begin(), sa.end() - 2);
  auto with = [&](std::initializer_list<int64_t> tail) {
    std::vector<int64_t> v = batch;
    v.insert(v.end(), tail);
    return v;
  };
  const UOp* ae = expand(reshape(a, with({m, k, 1})), with({m, k, n}));
  const UOp* be = expand(reshape(b, with({1, k, n})), with({m, k, n}));
  const UOp* prod = alu(Op::MUL, {ae, be});
  return reshape(reduce(prod, ReduceOp::Add, {static_cast<int64_t>(r - 1)}), with({m, n}));
}

const UOp* TensorBuilder::sink(std::initializer_list<const UOp*> outputs) {
  return sink(std::vector<const UOp*>(outputs));
}

const UOp* TensorBuilder::sink(const std::vector<const UOp*>& outputs) {
  return g_.make(Op::SINK, dtypes::void_, outputs);
}

}  // namespace uop
