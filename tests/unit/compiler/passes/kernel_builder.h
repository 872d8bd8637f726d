// Kernel-level graphs for the pass tests, built node by node the way a client may send
// them (compiler/PIPELINE.md "Kernel-level semantics"): PARAMs, RANGEs numbered in the
// order they are made, INDEX / LOAD / STORE, REDUCE, and the SINK[kernel] over the stores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "compiler/ir/uop.h"

namespace uop::testing {

struct KernelBuilder {
  Graph g;
  int next_axis = 0;

  const UOp* param(int64_t slot, DType elem, int64_t size) {
    return g.make(Op::PARAM, elem.ptr_to(AddrSpace::Global, size), {}, ParamArg{slot, size});
  }
  const UOp* range(const UOp* end, AxisType type = AxisType::Loop) {
    return g.make(Op::RANGE, dtypes::index, {end}, RangeArg{next_axis++, type, false});
  }
  const UOp* range(int64_t end, AxisType type = AxisType::Loop) { return range(g.idx(end), type); }
  const UOp* var(const char* name, int64_t lo, int64_t hi) {
    return g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{name, lo, hi});
  }
  const UOp* i32(int64_t v) { return g.cnst_int(dtypes::int32, v); }
  const UOp* f32(double v) { return g.cnst(dtypes::float32, v); }
  const UOp* ix(int64_t v) { return g.idx(v); }
  const UOp* alu(Op op, const UOp* a, const UOp* b) { return g.alu(op, {a, b}); }
  const UOp* to_index(const UOp* x) { return g.make(Op::CAST, dtypes::index, {x}); }
  const UOp* lt(const UOp* a, const UOp* b) { return alu(Op::CMPLT, a, b); }
  const UOp* all(const UOp* a, const UOp* b) { return alu(Op::AND, a, b); }
  // lo < x < hi
  const UOp* between(int64_t lo, const UOp* x, int64_t hi) {
    const UOp* k = x->dtype().is_index() ? ix(lo) : g.cnst_int(x->dtype(), lo);
    const UOp* m = x->dtype().is_index() ? ix(hi) : g.cnst_int(x->dtype(), hi);
    return all(lt(k, x), lt(x, m));
  }
  const UOp* load(const UOp* buf, const UOp* i, const UOp* gate = nullptr) {
    DType t{buf->dtype().scalar};
    if (!gate) return g.make(Op::LOAD, t, {buf, g.make(Op::INDEX, t, {buf, i})});
    return g.make(Op::LOAD, t, {buf, g.make(Op::INDEX, t, {buf, i, gate}), g.cnst_int(t, 0)});
  }
  const UOp* store(const UOp* buf, const UOp* i, const UOp* v, std::vector<const UOp*> ranges) {
    DType t{buf->dtype().scalar};
    std::vector<const UOp*> src{g.make(Op::INDEX, t, {buf, i}), v};
    src.insert(src.end(), ranges.begin(), ranges.end());
    return g.make(Op::STORE, dtypes::void_, src);
  }
  // REDUCE(op, v) over `ranges` (they close there).
  const UOp* reduce(ReduceOp op, const UOp* v, std::vector<const UOp*> ranges) {
    std::vector<const UOp*> src{v};
    src.insert(src.end(), ranges.begin(), ranges.end());
    return g.make(Op::REDUCE, v->dtype(), src, ReduceOpArg{op});
  }
  const UOp* sink(std::initializer_list<const UOp*> stores) {
    return g.make(Op::SINK, dtypes::void_, stores, KernelInfoArg{true, "probe"});
  }
};

// Kernels several pass and backend tests take apart.

// out[i] = reduce(op) over r of in[K i + r] (rows x K, float32): a contiguous reduce loop.
inline const UOp* row_reduce(KernelBuilder& k, ReduceOp op, int64_t rows, int64_t K) {
  const UOp* out = k.param(0, dtypes::float32, rows);
  const UOp* in = k.param(1, dtypes::float32, rows * K);
  const UOp* i = k.range(rows);
  const UOp* r = k.range(K, AxisType::Reduce);
  return k.sink({k.store(out, i, k.reduce(op, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(K)), r)), {r}), {i})});
}

// C[m, n] = sum over k of f32(A[m, k]) * f32(B[k, n]), A and B of `in`, C float32. With
// `same_side`, B is read at (k, m) instead, so both operands move with m.
inline const UOp* matmul(KernelBuilder& k, DType in, int64_t M, int64_t N, int64_t K, bool same_side = false) {
  const UOp* c = k.param(0, dtypes::float32, M * N);
  const UOp* a = k.param(1, in, M * K);
  const UOp* b = k.param(2, in, K * (same_side ? M : N));
  const UOp* m = k.range(M);
  const UOp* n = k.range(N);
  const UOp* r = k.range(K, AxisType::Reduce);
  const UOp* av = k.g.make(Op::CAST, dtypes::float32, {k.load(a, k.alu(Op::ADD, k.alu(Op::MUL, m, k.ix(K)), r))});
  const UOp* bi = same_side ? k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(M)), m) : k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(N)), n);
  const UOp* bv = k.g.make(Op::CAST, dtypes::float32, {k.load(b, bi)});
  const UOp* sum = k.reduce(ReduceOp::Add, k.alu(Op::MUL, av, bv), {r});
  return k.sink({k.store(c, k.alu(Op::ADD, k.alu(Op::MUL, m, k.ix(N)), n), sum, {m, n})});
}

// What a pass made: the nodes of `op` under `root` (in toposort order), and how many
// nodes `pred` holds for.
inline std::vector<const UOp*> nodes_of(const UOp* root, Op op) {
  std::vector<const UOp*> out;
  for (const UOp* u : toposort(root))
    if (u->op() == op) out.push_back(u);
  return out;
}
inline int count_of(const UOp* root, const std::function<bool(const UOp*)>& pred) {
  int n = 0;
  for (const UOp* u : toposort(root)) n += pred(u);
  return n;
}

// A RANGE's constant trip count; -1 for a variable one.
inline int64_t trip_of(const UOp* r) { return r->src(0)->const_value() ? r->src(0)->const_value()->to_int() : -1; }
// The trip counts of the RANGEs of `type` under `root`, in ascending order.
inline std::vector<int64_t> trips_of(const UOp* root, AxisType type) {
  std::vector<int64_t> out;
  for (const UOp* r : nodes_of(root, Op::RANGE))
    if (r->arg_as<RangeArg>().type == type) out.push_back(trip_of(r));
  std::sort(out.begin(), out.end());
  return out;
}

// a * s + b, as index arithmetic.
inline const UOp* affine(KernelBuilder& k, const UOp* a, int64_t s, const UOp* b) {
  return k.alu(Op::ADD, k.alu(Op::MUL, a, k.ix(s)), b);
}

// How conv3x3 reads its window: from an (H + 2) x (H + 2) padded input (realized, as
// uopd's own kernels read it), or from the H x H input under a gate (0 <= y + u - 1 < H
// and likewise x) on the load itself, or as the tinygrad bridge reads it: the gated load
// with its linear index also clamped into the buffer, min(max(i, 0), last), so not affine
// (expand looks through the clamp where the unclamped index is proven).
enum class ConvRead { Padded, Gated, Clamped };

// out[c, y, x] = sum over k, u, v of in[k, y + u, x + v] * w[c, k, u, v]: C output
// channels, K input channels, an H x H output (slots 0, 1, 2), of `dt` (int32: sums the
// interpreter and any schedule agree on exactly); the input as `read` says.
inline const UOp* conv3x3(KernelBuilder& k, int64_t C, int64_t K, int64_t H, DType dt = dtypes::int32,
                          ConvRead read = ConvRead::Padded) {
  const int64_t P = read == ConvRead::Padded ? H + 2 : H;
  const UOp* out = k.param(0, dt, C * H * H);
  const UOp* in = k.param(1, dt, K * P * P);
  const UOp* w = k.param(2, dt, C * K * 9);
  const UOp* c = k.range(C);
  const UOp* y = k.range(H);
  const UOp* x = k.range(H);
  const UOp* ic = k.range(K, AxisType::Reduce);
  const UOp* u = k.range(3, AxisType::Reduce);
  const UOp* v = k.range(3, AxisType::Reduce);
  const UOp* yy = k.alu(Op::ADD, y, u);  // the row in the padded input
  const UOp* xx = k.alu(Op::ADD, x, v);
  const UOp* read_in = nullptr;
  if (read == ConvRead::Padded) {
    read_in = k.load(in, affine(k, affine(k, ic, P, yy), P, xx));
  } else {
    const UOp* gate = k.all(k.between(0, yy, H + 1), k.between(0, xx, H + 1));
    const UOp* at_in = affine(k, affine(k, ic, H, k.alu(Op::SUB, yy, k.ix(1))), H, k.alu(Op::SUB, xx, k.ix(1)));
    if (read == ConvRead::Gated) {
      read_in = k.load(in, at_in, gate);
    } else {
      read_in = k.load(in, k.alu(Op::MIN, k.alu(Op::MAX, at_in, k.ix(0)), k.ix(K * H * H - 1)), gate);
    }
  }
  const UOp* at_w = affine(k, affine(k, affine(k, c, K, ic), 3, u), 3, v);
  const UOp* sum = k.reduce(ReduceOp::Add, k.alu(Op::MUL, read_in, k.load(w, at_w)), {ic, u, v});
  return k.sink({k.store(out, affine(k, affine(k, c, H, y), H, x), sum, {c, y, x})});
}

}  // namespace uop::testing
