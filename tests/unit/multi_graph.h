// Multi-device tensor graphs built by hand for the tests (compiler/ir/README.md
// "Multi-device"): inputs on named devices, MULTI of shards or replicas, MSELECT, COPY,
// ALLREDUCE and the tensor ops over them, with each node's shape tracked and each input's
// data kept (the interpreter's inputs).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/uop.h"
#include "compiler/support/strings.h"

namespace uop::testing {

inline std::vector<std::string> devices(int n) {
  std::vector<std::string> d;
  for (int i = 0; i < n; ++i) d.push_back(cat("CPU:", i));
  return d;
}

// Shard sizes of `dim` over n devices: as even as possible, the first ones larger.
inline std::vector<int64_t> splits(int64_t dim, int n) {
  std::vector<int64_t> s;
  for (int i = 0; i < n; ++i) s.push_back(dim / n + (i < dim % n ? 1 : 0));
  return s;
}

// Builds multi-device tensor graphs by hand, tracking shapes, and keeps the input data.
class MultiGraph {
 public:
  explicit MultiGraph(Graph& g) : g_(g) {}

  Graph& g() { return g_; }
  const std::vector<int64_t>& shape(const UOp* u) const { return shapes_.at(u); }
  const absl::flat_hash_map<const UOp*, HostTensor>& inputs() const { return inputs_; }

  const UOp* device(std::vector<std::string> d) { return g_.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{std::move(d)}); }

  // An input on `dev` holding `data` (any shape: the BUFFER is flat, viewed as data.shape).
  const UOp* input(const HostTensor& data, const std::string& dev) {
    const int64_t n = data.numel();
    const UOp* unique = g_.make(Op::UNIQUE, dtypes::void_, {}, IntArg{next_unique_++});
    const UOp* buf = g_.make(Op::BUFFER, DType(data.dtype), {unique, device({dev})}, BufferArg{n});
    HostTensor flat = data;
    flat.shape = {n};
    inputs_[buf] = flat;
    shapes_[buf] = {n};
    return reshape(buf, data.shape);
  }
  // `whole` cut along `axis` over the devices (one input per device), as a MULTI.
  const UOp* sharded(const HostTensor& whole, int64_t axis, const std::vector<std::string>& devs) {
    std::vector<const UOp*> parts;
    int64_t begin = 0;
    for (size_t i = 0; i < devs.size(); ++i) {
      const int64_t size = splits(whole.shape[axis], static_cast<int>(devs.size()))[i];
      HostTensor part = slice(whole, axis, begin, size);
      begin += size;
      parts.push_back(input(part, devs[i]));
    }
    return multi(parts, axis);
  }
  // The same data on every device.
  const UOp* replicated(const HostTensor& whole, const std::vector<std::string>& devs) {
    std::vector<const UOp*> parts;
    for (const std::string& d : devs) parts.push_back(input(whole, d));
    return multi(parts, -1);
  }
  const UOp* multi(const std::vector<const UOp*>& parts, int64_t axis) {
    std::vector<int64_t> s = shape(parts[0]);
    if (axis >= 0) {
      s[axis] = 0;
      for (const UOp* p : parts) s[axis] += shape(p)[axis];
    }
    return shaped(g_.make(Op::MULTI, parts[0]->dtype(), parts, IntArg{axis}), s);
  }
  const UOp* mselect(const UOp* m, int64_t i, std::vector<int64_t> s) {
    return shaped(g_.make(Op::MSELECT, m->dtype(), {m}, IntArg{i}), std::move(s));
  }
  const UOp* copy(const UOp* x, const std::string& dev) {
    return shaped(g_.make(Op::COPY, x->dtype(), {x, device({dev})}), shape(x));
  }
  const UOp* allreduce(const UOp* m, ReduceOp op, const std::vector<std::string>& devs, std::vector<int64_t> s) {
    return shaped(g_.make(Op::ALLREDUCE, m->dtype(), {m, device(devs)}, ReduceOpArg{op}), std::move(s));
  }

  const UOp* reshape(const UOp* x, std::vector<int64_t> s) {
    if (shape(x) == s) return x;
    return shaped(g_.make(Op::RESHAPE, x->dtype(), {x, operand(s)}), s);
  }
  const UOp* expand(const UOp* x, std::vector<int64_t> s) {
    if (shape(x) == s) return x;
    return shaped(g_.make(Op::EXPAND, x->dtype(), {x, operand(s)}), s);
  }
  const UOp* permute(const UOp* x, std::vector<int64_t> perm) {
    std::vector<int64_t> s;
    for (int64_t a : perm) s.push_back(shape(x)[a]);
    return shaped(g_.make(Op::PERMUTE, x->dtype(), {x}, IntsArg{perm}), s);
  }
  const UOp* pad(const UOp* x, std::vector<int64_t> b, std::vector<int64_t> e) {
    std::vector<int64_t> s = shape(x);
    for (size_t i = 0; i < s.size(); ++i) s[i] += b[i] + e[i];
    return shaped(g_.make(Op::PAD, x->dtype(), {x, operand(b), operand(e)}), s);
  }
  const UOp* shrink(const UOp* x, std::vector<int64_t> b, std::vector<int64_t> e) {
    std::vector<int64_t> s;
    for (size_t i = 0; i < b.size(); ++i) s.push_back(e[i] - b[i]);
    return shaped(g_.make(Op::SHRINK, x->dtype(), {x, operand(b), operand(e)}), s);
  }
  const UOp* flip(const UOp* x, std::vector<bool> axes) {
    return shaped(g_.make(Op::FLIP, x->dtype(), {x}, BoolsArg{std::move(axes)}), shape(x));
  }
  const UOp* reduce(const UOp* x, ReduceOp op, std::vector<int64_t> axes) {
    std::vector<int64_t> s = shape(x);
    for (int64_t a : axes) s[a] = 1;
    return shaped(g_.make(Op::REDUCE_AXIS, x->dtype(), {x}, ReduceAxisArg{op, axes}), s);
  }
  const UOp* alu(Op op, std::initializer_list<const UOp*> src) {
    const UOp* u = g_.alu(op, src);
    return shaped(u, shape(*(op == Op::WHERE ? src.begin() + 1 : src.begin())));
  }
  // A device-less constant broadcast to `s`.
  const UOp* full(Scalar dt, double v, std::vector<int64_t> s) {
    const UOp* c = shaped(g_.cnst(DType(dt), ConstValue::Float(v)), {});
    std::vector<int64_t> ones(s.size(), 1);
    return expand(reshape(c, ones), s);
  }
  const UOp* cast(const UOp* x, Scalar to) { return shaped(g_.make(Op::CAST, DType(to), {x}), shape(x)); }
  const UOp* sink(const std::vector<const UOp*>& outs) { return g_.make(Op::SINK, dtypes::void_, outs); }

  static HostTensor slice(const HostTensor& h, int64_t axis, int64_t begin, int64_t size) {
    std::vector<int64_t> s = h.shape;
    s[axis] = size;
    HostTensor out = HostTensor::zeros(h.dtype, s);
    std::vector<int64_t> c(s.size(), 0);
    for (int64_t i = 0; i < out.numel(); ++i) {
      std::vector<int64_t> src = c;
      src[axis] += begin;
      int64_t f = 0;
      for (size_t k = 0; k < src.size(); ++k) f = f * h.shape[k] + src[k];
      out.set_bits(i, h.get_bits(f));
      for (size_t k = c.size(); k-- > 0;) {
        if (++c[k] < s[k]) break;
        c[k] = 0;
      }
    }
    return out;
  }

 private:
  const UOp* shaped(const UOp* u, std::vector<int64_t> s) {
    shapes_[u] = std::move(s);
    return u;
  }
  const UOp* operand(const std::vector<int64_t>& dims) {
    std::vector<ConstValue> v;
    for (int64_t d : dims) v.push_back(ConstValue::Int(d));
    return g_.make(Op::VCONST, dtypes::index.vec(static_cast<uint32_t>(dims.size())), {}, VConstArg{v});
  }

  Graph& g_;
  int64_t next_unique_ = 0;
  absl::flat_hash_map<const UOp*, std::vector<int64_t>> shapes_;
  absl::flat_hash_map<const UOp*, HostTensor> inputs_;
};

}  // namespace uop::testing
