#include "compiler/passes/tensor_cores.h"

#include <algorithm>
#include <optional>

#include "compiler/support/strings.h"

#include "compiler/ir/value_range.h"
#include "compiler/passes/loop_schedule.h"

namespace uop {
namespace {

bool depends_on(const UOp* x, const UOp* r) {
  for (const UOp* u : toposort(x))
    if (u == r) return true;
  return false;
}

bool has_range(const UOp* x) {
  for (const UOp* u : toposort(x))
    if (u->op() == Op::RANGE || u->op() == Op::SPECIAL) return true;
  return false;
}

bool narrow(DType d) { return d == dtypes::float16 || d == dtypes::bfloat16; }

}  // namespace

const UOp* tensor_core_operand(const UOp* x, DType acc) {
  if (narrow(x->dtype()) && x->dtype() == acc) return x;
  if (acc == dtypes::float32 && x->op() == Op::CAST && narrow(x->src(0)->dtype())) return x->src(0);
  return nullptr;
}

WmmaArg tensor_core_wmma(Scalar in) {
  WmmaArg wa;
  wa.name = in == Scalar::Float16 ? kWmmaF16 : kWmmaBF16;
  wa.n = 8, wa.m = 16, wa.k = 16;
  wa.dtype_in = in;
  wa.dtype_out = Scalar::Float32;
  wa.device = "CUDA";
  wa.threads = 32;
  return wa;
}

namespace {

}  // namespace

std::optional<MatmulMatch> match_matmul(const UOp* kernel, const std::function<bool(const MatmulMatch&)>& fits) {
  if (!(kernel->op() == Op::SINK && kernel->num_src() == 1 && kernel->src(0)->op() == Op::STORE)) return std::nullopt;
  MatmulMatch mt{};
  mt.store = kernel->src(0);
  if (mt.store->src(0)->op() != Op::INDEX) return std::nullopt;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::REDUCE) {
      if (mt.reduce) return std::nullopt;
      mt.reduce = u;
    }
  const UOp* r = mt.reduce;
  if (!r || r->num_src() != 2 || r->arg_as<ReduceOpArg>().op != ReduceOp::Add || r->src(0)->op() != Op::MUL ||
      !r->dtype().is_float() || r->dtype().is_vector())
    return std::nullopt;
  mt.k = r->src(1);
  if (mt.k->op() != Op::RANGE || const_end(mt.k) <= 0) return std::nullopt;
  const UOp* x = r->src(0)->src(0);
  const UOp* y = r->src(0)->src(1);
  if (!depends_on(x, mt.k) || !depends_on(y, mt.k)) return std::nullopt;
  std::vector<const UOp*> outs;
  for (const UOp* o : mt.store->src().subspan(2)) {
    if (o->op() != Op::RANGE || has_range(o->src(0))) return std::nullopt;
    outs.push_back(o);
  }
  // Each operand owns the one output loop the other does not read.
  auto own = [&](const UOp* p, const UOp* q) -> const UOp* {
    const UOp* found = nullptr;
    for (const UOp* o : outs)
      if (depends_on(p, o) && !depends_on(q, o)) {
        if (found) return nullptr;
        found = o;
      }
    return found;
  };
  for (int swap = 0; swap < 2; ++swap) {
    const UOp* pa = swap ? y : x;
    const UOp* pb = swap ? x : y;
    const UOp* m = own(pa, pb);
    const UOp* n = own(pb, pa);
    if (!m || !n || const_end(m) <= 0 || const_end(n) <= 0) continue;
    mt.a = pa, mt.b = pb, mt.m = m, mt.n = n;
    mt.batch.clear();
    for (const UOp* o : outs)
      if (o != m && o != n) mt.batch.push_back(o);
    if (fits(mt)) return mt;
  }
  return std::nullopt;
}

namespace {

// A matmul the tensor cores take: narrow operands (or their exact widenings), M % 16,
// N % 8, K % 16 == 0, and M / 16 blocks that fit blockIdx.y.
std::optional<MatmulMatch> match(const UOp* kernel) {
  auto mt = match_matmul(kernel, [](const MatmulMatch& m) {
    const DType acc = m.reduce->dtype();
    if (acc != dtypes::float32 && !narrow(acc)) return false;
    const UOp* a = tensor_core_operand(m.a, acc);
    const UOp* b = tensor_core_operand(m.b, acc);
    const int64_t M = const_end(m.m), N = const_end(m.n), K = const_end(m.k);
    return a && b && a->dtype() == b->dtype() && M % 16 == 0 && N % 8 == 0 && K % 16 == 0 && M / 16 <= 65535;
  });
  if (!mt) return std::nullopt;
  mt->a = tensor_core_operand(mt->a, mt->reduce->dtype());
  mt->b = tensor_core_operand(mt->b, mt->reduce->dtype());
  return mt;
}

}  // namespace

std::vector<const UOp*> matmul_batch_loops(Graph& g, const MatmulMatch& mt, int64_t z_id,
                                           absl::flat_hash_map<const UOp*, const UOp*>* batch_dims) {
  std::vector<const UOp*> closes;
  ValueRange vr;
  for (const UOp* r : mt.batch) {
    if (batch_dims->empty() && vr.vmax(r->src(0)) <= 65535) {
      const UOp* z = g.make(Op::RANGE, r->dtype(), r->src(), RangeArg{z_id, AxisType::Global, true});
      (*batch_dims)[r] = z;
      closes.push_back(z);
    } else {
      closes.push_back(r);
    }
  }
  return closes;
}

bool fits_tensor_cores(const UOp* kernel) { return match(kernel).has_value(); }

int64_t tensor_core_warps(const UOp* kernel) {
  auto mt = match(kernel);
  if (!mt) return 0;
  const int64_t tiles_n = const_end(mt->n) / 8;
  return tiles_n % 4 == 0 ? 4 : tiles_n % 2 == 0 ? 2 : 1;
}

absl::StatusOr<const UOp*> use_tensor_cores(Graph& g, const UOp* kernel, int64_t warps) {
  auto mt = match(kernel);
  if (!mt) return kernel;
  const int64_t M = const_end(mt->m), N = const_end(mt->n), K = const_end(mt->k);
  const int64_t W = warps > 0 ? warps : tensor_core_warps(kernel);  // warps per block
  if (!(W == 1 || W == 2 || W == 4) || (N / 8) % W != 0)
    return absl::InvalidArgumentError(cat("tensor cores: ", W, " warps per block do not divide the ", N / 8,
                                          " tiles of 8 columns (1, 2 or 4 warps)"));
  int64_t id = 0;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::RANGE) id = std::max(id, u->arg_as<RangeArg>().axis_id + 1);
  // Ids order the dims for gpu_dims: the larger, the earlier (x before y before z).
  auto range = [&](int64_t end, int64_t axis, AxisType t) {
    return g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{id + axis, t, true});
  };
  const UOp* gn = range(N / (8 * W), 10, AxisType::Global);
  const UOp* gm = range(M / 16, 9, AxisType::Global);
  const UOp* lane = range(32, 7, AxisType::Local);
  const UOp* w = range(W, 6, AxisType::Local);
  const UOp* kk = range(K / 16, 5, AxisType::Reduce);
  auto add = [&](const UOp* a, const UOp* b) { return g.alu(Op::ADD, {a, b}); };
  auto mul = [&](const UOp* a, int64_t c) { return g.alu(Op::MUL, {a, g.idx(c)}); };
  const UOp* grp = g.alu(Op::IDIV, {lane, g.idx(4)});
  const UOp* tig = g.alu(Op::MOD, {lane, g.idx(4)});
  const UOp* m0 = add(mul(gm, 16), grp);
  const UOp* n0 = mul(add(mul(gn, W), w), 8);
  const UOp* k0 = add(mul(kk, 16), mul(tig, 2));

  std::vector<const UOp*> a, b;
  for (int64_t i = 0; i < 8; ++i)
    a.push_back(substitute(g, mt->a, {{mt->m, add(m0, g.idx(8 * ((i >> 1) & 1)))},
                                      {mt->k, add(k0, g.idx((i & 1) + 8 * (i >> 2)))}}));
  for (int64_t i = 0; i < 4; ++i)
    b.push_back(substitute(g, mt->b, {{mt->k, add(k0, g.idx((i & 1) + 8 * (i >> 1)))}, {mt->n, add(n0, grp)}}));
  const Scalar in = mt->a->dtype().scalar;
  WmmaArg wa = tensor_core_wmma(in);
  wa.upcast_a = {{id + 5, 8}};
  wa.upcast_b = {{id + 5, 4}};
  wa.upcast_c = {{id + 10, 4}};
  wa.reduce_axes = {{id + 5, 16}};
  const DType f4 = dtypes::float32.vec(4);
  const UOp* zero = g.make(Op::VCONST, f4, {}, VConstArg{{ConstValue::Float(0.0)}});
  const UOp* mma = g.make(Op::WMMA, f4,
                          {g.make(Op::VECTORIZE, DType(in, 8), a), g.make(Op::VECTORIZE, DType(in, 4), b), zero}, wa);
  const UOp* acc = g.make(Op::REDUCE, f4, {mma, kk}, ReduceOpArg{ReduceOp::Add});

  std::vector<const UOp*> stores;
  const DType rt = mt->reduce->dtype();
  for (int64_t i = 0; i < 4; ++i) {
    const UOp* r = g.make(Op::GEP, dtypes::float32, {acc}, IntsArg{{i}});
    if (rt != dtypes::float32) r = g.make(Op::CAST, rt, {r});
    absl::flat_hash_map<const UOp*, const UOp*> at = {{mt->reduce, r},
                                                      {mt->m, add(m0, g.idx(8 * (i >> 1)))},
                                                      {mt->n, add(add(n0, mul(tig, 2)), g.idx(i & 1))}};
    stores.push_back(g.make(Op::STORE, dtypes::void_, {substitute(g, mt->store->src(0), at), substitute(g, mt->store->src(1), at)}));
  }
  absl::flat_hash_map<const UOp*, const UOp*> batch_dims;
  std::vector<const UOp*> closes = matmul_batch_loops(g, *mt, id + 8, &batch_dims);
  for (const UOp* r : {gm, gn, w, lane}) closes.push_back(r);
  std::vector<const UOp*> end{g.make(Op::GROUP, dtypes::void_, stores)};
  end.insert(end.end(), closes.begin(), closes.end());
  const UOp* body = substitute(g, g.make(Op::END, dtypes::void_, end), batch_dims);
  return g.make(Op::SINK, kernel->dtype(), {body}, kernel->arg());
}

}  // namespace uop
