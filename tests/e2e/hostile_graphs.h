// Graphs a hostile (or careless) client sends, shared by the e2e tests of the defences
// against them: kernel-level graphs built tersely, a gather whose gate holds for indices
// far outside its buffers once its arithmetic wraps, any of them as a CALL, a kernel that never ends, and a Run
// whose output is far larger than its inputs. (Compile bombs are in
// tests/unit/compiler/bomb_graphs.h.)
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/ir/uop.h"

namespace uop::testing {

// Kernel-level graphs, built tersely.
struct Kernel {
  Graph g;
  int64_t axes = 0;
  const UOp* param(int64_t slot, Scalar s, int64_t size) {
    return g.make(Op::PARAM, DType(s).ptr_to(AddrSpace::Global, size), {}, ParamArg{slot, size});
  }
  const UOp* range(int64_t end) { return g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{axes++, AxisType::Loop}); }
  const UOp* index(const UOp* buf, const UOp* i) { return g.make(Op::INDEX, DType(buf->dtype().scalar), {buf, i}); }
  const UOp* load(const UOp* buf, const UOp* i) { return g.make(Op::LOAD, DType(buf->dtype().scalar), {buf, index(buf, i)}); }
  const UOp* store(const UOp* buf, const UOp* i, const UOp* v, std::vector<const UOp*> ranges = {}) {
    std::vector<const UOp*> src{index(buf, i), v};
    src.insert(src.end(), ranges.begin(), ranges.end());
    return g.make(Op::STORE, dtypes::void_, src);
  }
  const UOp* custom(DType d, std::string text, std::vector<const UOp*> src) {
    return g.make(Op::CUSTOM, d, src, StrArg{std::move(text)});
  }
  const UOp* kernel(std::vector<const UOp*> stores) { return g.make(Op::SINK, dtypes::void_, stores, KernelInfoArg{true, "k"}); }
};

// out[0] = sum of in[0] * r for r < 2^63 - 1: in bounds everywhere, and endless.
struct EndlessKernel : Kernel {
  const UOp* root;
  const UOp* in;
  EndlessKernel() {
    const UOp* out = param(0, Scalar::Float32, 1);
    in = param(1, Scalar::Float32, 1);
    const UOp* r = range(INT64_MAX);
    const UOp* term = g.alu(Op::MUL, {load(in, g.idx(0)), g.make(Op::CAST, dtypes::float32, {r})});
    const UOp* sum = g.make(Op::REDUCE, dtypes::float32, {term, r}, ReduceOpArg{ReduceOp::Add});
    root = kernel({store(out, g.idx(0), sum)});
  }
};

// The buffers of a Gathered kernel hold this many values each.
inline constexpr int64_t kGatherSize = 16;

// out[r] = data[idx[r]] (a read) or data[idx[r]] = out[r] (a write), for r < 16, under
// gate(idx[r]). With a gate that holds only through wrapping arithmetic (see
// wrapping_add_gate), idx reaches far outside data: what the bounds proof must refuse.
struct Gathered {
  Graph g;
  const UOp *out, *data, *idx, *root;
  Names names;

  template <typename Gate>
  Gathered(bool write, Gate gate) {
    constexpr int64_t n = kGatherSize;
    DType f = dtypes::float32, i = dtypes::int32;
    out = g.make(Op::PARAM, f.ptr_to(AddrSpace::Global, n), {}, ParamArg{0, n});
    data = g.make(Op::PARAM, f.ptr_to(AddrSpace::Global, n), {}, ParamArg{1, n});
    idx = g.make(Op::PARAM, i.ptr_to(AddrSpace::Global, n), {}, ParamArg{2, n});
    const UOp* r = g.make(Op::RANGE, dtypes::index, {g.idx(n)}, RangeArg{0, AxisType::Loop, false});
    const UOp* v = g.make(Op::LOAD, i, {idx, g.make(Op::INDEX, i, {idx, r})});
    const UOp* wild = g.make(Op::INDEX, f, {data, g.make(Op::CAST, dtypes::index, {v}), gate(g, v)});
    const UOp* mine = g.make(Op::INDEX, f, {out, r});
    const UOp* st = write ? g.make(Op::STORE, dtypes::void_, {wild, g.make(Op::LOAD, f, {out, mine}), r})
                          : g.make(Op::STORE, dtypes::void_, {mine, g.make(Op::LOAD, f, {data, wild, g.cnst(f, 0.0)}), r});
    root = g.make(Op::SINK, dtypes::void_, {st}, KernelInfoArg{true, write ? "overwrite" : "read"});
    names = {{"out", out}, {"data", data}, {"idx", idx}};
  }
};

// A kernel-level graph of one CALL of `kernel` (a SINK over PARAMs in slots 0..n-1, as
// the kernels above): outer PARAMs of the kernel's own types bound in slot order, or of
// `sizes` where given (a client binding buffers that do not fit), each named as `names`
// named the kernel's. What a Run of several kernels sends (tinygrad's JIT does), so every
// defence must hold for a kernel that comes so as for one sent alone.
struct Called {
  const UOp* root;
  Names names;
  Called(Graph& g, const UOp* kernel, const Names& kernel_names, std::vector<int64_t> sizes = {}) {
    std::vector<const UOp*> args{kernel};
    for (size_t slot = 0; slot < kernel_names.size(); ++slot) {
      const UOp* inner = nullptr;
      for (const auto& [name, p] : kernel_names)
        if (p->arg_as<ParamArg>().slot == static_cast<int64_t>(slot)) inner = p;
      const int64_t size = slot < sizes.size() ? sizes[slot] : inner->arg_as<ParamArg>().size;
      const UOp* outer = g.make(Op::PARAM, DType(inner->dtype().scalar).ptr_to(AddrSpace::Global, size), {},
                                ParamArg{static_cast<int64_t>(slot), size});
      for (const auto& [name, p] : kernel_names)
        if (p == inner) names.emplace_back(name, outer);
      args.push_back(outer);
    }
    root = g.make(Op::SINK, dtypes::void_, {g.make(Op::CALL, dtypes::void_, args, CallInfoArg{})});
  }
};

// lo < x < hi, in x's dtype.
inline const UOp* between(Graph& g, int64_t lo, const UOp* x, int64_t hi) {
  return g.alu(Op::AND, {g.alu(Op::CMPLT, {g.cnst_int(x->dtype(), lo), x}), g.alu(Op::CMPLT, {x, g.cnst_int(x->dtype(), hi)})});
}

// The gates that hold, through wrapping int32 arithmetic, for indices gigabytes away:
// -1 < idx + INT32_MIN < 4 (idx near INT32_MIN), -1 < idx * INT32_MIN < 4 (any even idx).
inline const UOp* wrapping_add_gate(Graph& g, const UOp* v) {
  return between(g, -1, g.alu(Op::ADD, {v, g.cnst_int(dtypes::int32, INT32_MIN)}), 4);
}
inline const UOp* wrapping_mul_gate(Graph& g, const UOp* v) {
  return between(g, -1, g.alu(Op::MUL, {v, g.cnst_int(dtypes::int32, INT32_MIN)}), 4);
}
// The honest gate, -1 < idx < 16: indices outside the buffer are gated off and read 0.
inline const UOp* sound_gate(Graph& g, const UOp* v) { return between(g, -1, v, kGatherSize); }

// An int32 index buffer for a Gathered kernel: `v`, then zeros.
inline HostTensor gather_indices(std::initializer_list<int64_t> v) {
  std::vector<ConstValue> c;
  for (int64_t x : v) c.push_back(ConstValue::Int(x));
  while (c.size() < static_cast<size_t>(kGatherSize)) c.push_back(ConstValue::Int(0));
  return HostTensor::of(Scalar::Int32, {kGatherSize}, c);
}

// A Run whose output is 2^log2 float32 values: x + x, x broadcast.
struct BigOutput {
  Graph g;
  const UOp* root;
  const UOp* x;
  explicit BigOutput(int log2) {
    TensorBuilder tb(g);
    const UOp* in = tb.input(Scalar::Float32, {1});
    x = tb.buffer_of(in);
    const UOp* big = tb.expand(tb.reshape(in, {1, 1}), {int64_t{1} << (log2 / 2), int64_t{1} << (log2 - log2 / 2)});
    root = tb.sink({tb.alu(Op::ADD, {big, big})});
  }
};

}  // namespace uop::testing
