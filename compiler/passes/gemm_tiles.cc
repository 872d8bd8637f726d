#include "compiler/passes/gemm_tiles.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/value_range.h"
#include "compiler/passes/expand.h"
#include "compiler/passes/loop_schedule.h"
#include "compiler/passes/tensor_cores.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

// Shared memory a block may use without opting in to more (every sm_80+ GPU has 48 KiB).
constexpr int64_t kMaxSharedBytes = 48 * 1024;

// Why the tile does not fit a matmul of these extents ("" when it does).
std::string misfit(const MatmulMatch& mt, const GemmTile& t) {
  const int64_t M = const_end(mt.m), N = const_end(mt.n), K = const_end(mt.k);
  if (M % t.bm || N % t.bn || K % t.bk)
    return cat("the tile ", t.bm, " x ", t.bn, " x ", t.bk, " does not divide the matmul's M x N x K = ", M, " x ", N,
               " x ", K);
  if (M / t.bm > 65535) return cat(M / t.bm, " row blocks do not fit blockIdx.y (65535)");
  return "";
}

std::string shape_misfit(const GemmTile& t, DType acc) {
  if (t.bm < 1 || t.bn < 1 || t.bk < 1 || t.tm < 1 || t.tn < 1 || t.bm % t.tm || t.bn % t.tn)
    return cat("a thread's block TM x TN = ", t.tm, " x ", t.tn, " must divide the block's tile BM x BN = ", t.bm, " x ",
               t.bn);
  const int64_t T = t.threads();
  if (T < 32 || T > 1024) return cat((t.bm / t.tm), " x ", (t.bn / t.tn), " = ", T, " threads per block, not 32 .. 1024");
  if ((t.bm * t.bk) % T || (t.bn * t.bk) % T)
    return cat("the tiles of A (", t.bm, " x ", t.bk, ") and B (", t.bk, " x ", t.bn,
               ") are not whole loads for each of the ", T, " threads");
  if (t.tm * t.tn > 256) return cat(t.tm * t.tn, " accumulators per thread, at most 256");
  const int64_t bytes = 2 * t.bk * (t.bm + t.bn) * acc.itemsize();
  if (bytes > kMaxSharedBytes) return cat(bytes, " bytes of shared memory per block, over ", kMaxSharedBytes);
  return "";
}

std::optional<MatmulMatch> match(const UOp* kernel, const GemmTile& t, std::string* why) {
  std::string first;
  auto mt = match_matmul(kernel, [&](const MatmulMatch& m) {
    std::string w = misfit(m, t);
    if (first.empty()) first = w;
    return w.empty();
  });
  if (!mt) {
    *why = first.empty() ? "the kernel is no float matmul (STORE of f(REDUCE(Add, a * b)) with a moving with one output "
                           "loop, b with another)"
                         : first;
    return std::nullopt;
  }
  *why = shape_misfit(t, mt->reduce->dtype());
  if (!why->empty()) return std::nullopt;
  return mt;
}

// Whether some load of `x` walks memory along `r` (coefficient 1).
bool walks(const UOp* x, const UOp* r) {
  for (const UOp* u : toposort(x))
    if (u->op() == Op::LOAD && u->src(1)->op() == Op::INDEX && u->src(1)->num_src() >= 2 &&
        affine_coeff(u->src(1)->src(1), r) == 1)
      return true;
  return false;
}

}  // namespace

std::string gemm_tile_misfit(const UOp* kernel, const GemmTile& tile) {
  std::string why;
  match(kernel, tile, &why);
  return why;
}

absl::StatusOr<const UOp*> tile_gemm(Graph& g, const UOp* kernel, const GemmTile& t) {
  std::string why;
  auto mt = match(kernel, t, &why);
  if (!mt) return absl::InvalidArgumentError(cat("tile(", t.bm, ",", t.bn, ",", t.bk, ",", t.tm, ",", t.tn, "): ", why));
  const int64_t N = const_end(mt->n), M = const_end(mt->m), K = const_end(mt->k);
  const int64_t TX = t.bn / t.tn, TY = t.bm / t.tm, T = TX * TY;
  const DType dt = mt->reduce->dtype();
  int64_t id = 0;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::RANGE) id = std::max(id, u->arg_as<RangeArg>().axis_id + 1);
  // Ids order the dims for gpu_dims: the larger, the earlier (x before y before z).
  auto range = [&](int64_t end, int64_t axis, AxisType type) {
    return g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{id + axis, type, true});
  };
  const UOp* gn = range(N / t.bn, 10, AxisType::Global);
  const UOp* gm = range(M / t.bm, 9, AxisType::Global);
  const UOp* tx = range(TX, 7, AxisType::Local);
  const UOp* ty = range(TY, 6, AxisType::Local);
  const UOp* kt = range(K / t.bk, 5, AxisType::Reduce);
  const UOp* kk = range(t.bk, 4, AxisType::Reduce);
  auto add = [&](const UOp* a, const UOp* b) { return g.alu(Op::ADD, {a, b}); };
  auto mul = [&](const UOp* a, int64_t c) { return g.alu(Op::MUL, {a, g.idx(c)}); };
  const UOp* tid = add(mul(ty, TX), tx);
  const UOp* buf = g.alu(Op::MOD, {kt, g.idx(2)});

  // The cooperative loads of one operand's tile (rows of the block's own loop `own`,
  // `width` of them, by BK) into a buffer laid out [2][BK][width].
  auto stage = [&](const UOp* operand, const UOp* own, const UOp* block, int64_t width, int64_t local_id,
                   std::vector<const UOp*>* stores) {
    const UOp* smem = g.make(Op::DEFINE_LOCAL, dt.ptr_to(AddrSpace::Local, 2 * t.bk * width), {}, IntArg{local_id});
    const bool k_fastest = walks(operand, mt->k) || !walks(operand, own);
    for (int64_t u = 0; u < width * t.bk / T; ++u) {
      const UOp* e = add(tid, g.idx(T * u));
      const UOp* ox = k_fastest ? g.alu(Op::IDIV, {e, g.idx(t.bk)}) : g.alu(Op::MOD, {e, g.idx(width)});
      const UOp* kx = k_fastest ? g.alu(Op::MOD, {e, g.idx(t.bk)}) : g.alu(Op::IDIV, {e, g.idx(width)});
      const UOp* v = substitute(g, operand, {{own, add(mul(block, width), ox)}, {mt->k, add(mul(kt, t.bk), kx)}});
      const UOp* at = add(add(mul(buf, t.bk * width), mul(kx, width)), ox);
      stores->push_back(g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, dt, {smem, at}), v}));
    }
    return smem;
  };
  std::vector<const UOp*> staged;
  const UOp* as = stage(mt->a, mt->m, gm, t.bm, 0, &staged);
  const UOp* bs = stage(mt->b, mt->n, gn, t.bn, 1, &staged);
  const UOp* bar = g.make(Op::BARRIER, dtypes::void_, staged);
  auto read = [&](const UOp* smem, int64_t width, const UOp* at) {
    const UOp* i = add(add(mul(buf, t.bk * width), mul(kk, width)), at);
    return g.make(Op::LOAD, dt, {smem, g.make(Op::INDEX, dt, {g.make(Op::AFTER, smem->dtype(), {smem, bar}), i})});
  };
  std::vector<const UOp*> av, bv, rows, cols;
  for (int64_t i = 0; i < t.tm; ++i) av.push_back(read(as, t.bm, add(ty, g.idx(i * TY))));
  for (int64_t j = 0; j < t.tn; ++j) bv.push_back(read(bs, t.bn, add(tx, g.idx(j * TX))));
  for (int64_t i = 0; i < t.tm; ++i)
    for (int64_t j = 0; j < t.tn; ++j) rows.push_back(av[i]), cols.push_back(bv[j]);
  // One vector product, lane i TN + j = a_i * b_j: lower_reduce accumulates a product
  // with a fused multiply-add (MULACC), one per lane.
  const DType vt = dt.vec(static_cast<uint32_t>(t.tm * t.tn));
  const UOp* prod = g.alu(Op::MUL, {g.make(Op::VECTORIZE, vt, rows), g.make(Op::VECTORIZE, vt, cols)});
  const UOp* acc = g.make(Op::REDUCE, vt, {prod, kt, kk}, ReduceOpArg{ReduceOp::Add});

  std::vector<const UOp*> stores;
  for (int64_t i = 0; i < t.tm; ++i)
    for (int64_t j = 0; j < t.tn; ++j) {
      const UOp* r = g.make(Op::GEP, dt, {acc}, IntsArg{{i * t.tn + j}});
      absl::flat_hash_map<const UOp*, const UOp*> at = {{mt->reduce, r},
                                                        {mt->m, add(add(mul(gm, t.bm), ty), g.idx(i * TY))},
                                                        {mt->n, add(add(mul(gn, t.bn), tx), g.idx(j * TX))}};
      stores.push_back(g.make(Op::STORE, dtypes::void_,
                              {substitute(g, mt->store->src(0), at), substitute(g, mt->store->src(1), at)}));
    }
  // One batch loop becomes blockIdx.z; any others stay serial loops (outermost).
  std::vector<const UOp*> closes;
  absl::flat_hash_map<const UOp*, const UOp*> batch_dims;
  ValueRange vr;
  for (const UOp* r : mt->batch) {
    if (batch_dims.empty() && vr.vmax(r->src(0)) <= 65535) {
      const UOp* z = g.make(Op::RANGE, r->dtype(), r->src(), RangeArg{id + 8, AxisType::Global, true});
      batch_dims[r] = z;
      closes.push_back(z);
    } else {
      closes.push_back(r);
    }
  }
  for (const UOp* r : {gm, gn, ty, tx}) closes.push_back(r);
  std::vector<const UOp*> end{g.make(Op::GROUP, dtypes::void_, stores)};
  end.insert(end.end(), closes.begin(), closes.end());
  const UOp* body = substitute(g, g.make(Op::END, dtypes::void_, end), batch_dims);
  return g.make(Op::SINK, kernel->dtype(), {body}, kernel->arg());
}

}  // namespace uop
