#include "compiler/passes/gemm_tiles.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
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

std::string shape_misfit(const GemmTile& t, DType stage) {
  const char* what = t.tensor_cores ? "a warp's tile WM x WN = " : "a thread's block TM x TN = ";
  if (t.bm < 1 || t.bn < 1 || t.bk < 1 || t.tm < 1 || t.tn < 1 || t.bm % t.tm || t.bn % t.tn)
    return cat(what, t.tm, " x ", t.tn, " must divide the block's tile BM x BN = ", t.bm, " x ", t.bn);
  if (t.tensor_cores && (t.tm % 16 || t.tn % 8 || t.bk % 16))
    return cat("a warp's tile (", t.tm, " x ", t.tn, ") is whole 16 x 8 mma tiles and BK (", t.bk, ") whole 16-deep steps");
  const int64_t T = t.threads();
  if (T < 32 || T > 1024) return cat(T, " threads per block, not 32 .. 1024");
  if ((t.bm * t.bk) % T || (t.bn * t.bk) % T)
    return cat("the tiles of A (", t.bm, " x ", t.bk, ") and B (", t.bk, " x ", t.bn,
               ") are not whole loads for each of the ", T, " threads");
  const int64_t lanes = t.tensor_cores ? t.tm * t.tn / 32 : t.tm * t.tn;
  if (lanes > 256) return cat(lanes, " accumulators per thread, at most 256");
  const int64_t bytes = 2 * t.bk * (t.bm + t.bn) * stage.itemsize();
  if (bytes > kMaxSharedBytes) return cat(bytes, " bytes of shared memory per block, over ", kMaxSharedBytes);
  return "";
}

std::optional<MatmulMatch> match(const UOp* kernel, const GemmTile& t, std::string* why) {
  std::string first;
  auto mt = match_matmul(kernel, [&](const MatmulMatch& m) {
    std::string w = misfit(m, t);
    if (w.empty() && t.tensor_cores) {
      const UOp* a = tensor_core_operand(m.a, m.reduce->dtype());
      const UOp* b = tensor_core_operand(m.b, m.reduce->dtype());
      if (!a || !b || a->dtype() != b->dtype()) w = "the operands are not both float16 or both bfloat16";
    }
    if (first.empty()) first = w;
    return w.empty();
  });
  if (!mt) {
    *why = first.empty() ? "the kernel is no float matmul (STORE of f(REDUCE(Add, a * b)) with a moving with one output "
                           "loop, b with another)"
                         : first;
    return std::nullopt;
  }
  if (t.tensor_cores) {
    mt->a = tensor_core_operand(mt->a, mt->reduce->dtype());
    mt->b = tensor_core_operand(mt->b, mt->reduce->dtype());
  }
  *why = shape_misfit(t, t.tensor_cores ? mt->a->dtype() : mt->reduce->dtype());
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

std::string GemmTile::str() const {
  return cat(tensor_cores ? "tc_tile(" : "tile(", bm, ",", bn, ",", bk, ",", tm, ",", tn, ")");
}

std::string gemm_tile_misfit(const UOp* kernel, const GemmTile& tile) {
  std::string why;
  match(kernel, tile, &why);
  return why;
}

absl::StatusOr<const UOp*> tile_gemm(Graph& g, const UOp* kernel, const GemmTile& t) {
  std::string why;
  auto mt = match(kernel, t, &why);
  if (!mt) return absl::InvalidArgumentError(cat(t.str(), ": ", why));
  const int64_t N = const_end(mt->n), M = const_end(mt->m), K = const_end(mt->k);
  // Thread (or, on the tensor cores, warp) tiles across and down the block's tile.
  const int64_t TX = t.bn / t.tn, TY = t.bm / t.tm, T = t.threads();
  const DType dt = mt->reduce->dtype();
  const DType st = mt->a->dtype();  // what shared memory holds: the operands' dtype
  int64_t id = 0;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::RANGE) id = std::max(id, u->arg_as<RangeArg>().axis_id + 1);
  // Ids order the dims for gpu_dims: the larger, the earlier (x before y before z).
  auto range = [&](int64_t end, int64_t axis, AxisType type) {
    return g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{id + axis, type, true});
  };
  const UOp* gn = range(N / t.bn, 10, AxisType::Global);
  const UOp* gm = range(M / t.bm, 9, AxisType::Global);
  // Plain: threadIdx.x = tx, threadIdx.y = ty. Tensor cores: threadIdx.x = the lane,
  // threadIdx.y = the warp, which is (ty, tx) = (warp / TX, warp % TX).
  const UOp* lane = t.tensor_cores ? range(32, 7, AxisType::Local) : nullptr;
  const UOp* warp = t.tensor_cores ? range(TX * TY, 6, AxisType::Local) : nullptr;
  const UOp* tx = t.tensor_cores ? nullptr : range(TX, 7, AxisType::Local);
  const UOp* ty = t.tensor_cores ? nullptr : range(TY, 6, AxisType::Local);
  const UOp* kt = range(K / t.bk, 5, AxisType::Reduce);
  const UOp* kk = range(t.tensor_cores ? t.bk / 16 : t.bk, 4, AxisType::Reduce);
  auto add = [&](const UOp* a, const UOp* b) { return g.alu(Op::ADD, {a, b}); };
  auto mul = [&](const UOp* a, int64_t c) { return g.alu(Op::MUL, {a, g.idx(c)}); };
  const UOp* tid = t.tensor_cores ? add(mul(warp, 32), lane) : add(mul(ty, TX), tx);
  if (t.tensor_cores) {
    tx = g.alu(Op::MOD, {warp, g.idx(TX)});
    ty = g.alu(Op::IDIV, {warp, g.idx(TX)});
  }
  const UOp* buf = g.alu(Op::MOD, {kt, g.idx(2)});

  // The cooperative loads of one operand's tile (rows of the block's own loop `own`,
  // `width` of them, by BK) into a buffer laid out [2][BK][width].
  auto stage = [&](const UOp* operand, const UOp* own, const UOp* block, int64_t width, int64_t local_id,
                   std::vector<const UOp*>* stores) {
    const UOp* smem = g.make(Op::DEFINE_LOCAL, st.ptr_to(AddrSpace::Local, 2 * t.bk * width), {}, IntArg{local_id});
    const bool k_fastest = walks(operand, mt->k) || !walks(operand, own);
    for (int64_t u = 0; u < width * t.bk / T; ++u) {
      const UOp* e = add(tid, g.idx(T * u));
      const UOp* ox = k_fastest ? g.alu(Op::IDIV, {e, g.idx(t.bk)}) : g.alu(Op::MOD, {e, g.idx(width)});
      const UOp* kx = k_fastest ? g.alu(Op::MOD, {e, g.idx(t.bk)}) : g.alu(Op::IDIV, {e, g.idx(width)});
      const UOp* v = substitute(g, operand, {{own, add(mul(block, width), ox)}, {mt->k, add(mul(kt, t.bk), kx)}});
      const UOp* at = add(add(mul(buf, t.bk * width), mul(kx, width)), ox);
      stores->push_back(g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, st, {smem, at}), v}));
    }
    return smem;
  };
  std::vector<const UOp*> staged;
  const UOp* as = stage(mt->a, mt->m, gm, t.bm, 0, &staged);
  const UOp* bs = stage(mt->b, mt->n, gn, t.bn, 1, &staged);
  const UOp* bar = g.make(Op::BARRIER, dtypes::void_, staged);
  // Element (k, i) of a staged tile, i along its width, k the step's k (kk's offset added).
  auto read = [&](const UOp* smem, int64_t width, const UOp* k, const UOp* i) {
    const UOp* at = add(add(mul(buf, t.bk * width), mul(k, width)), i);
    return g.make(Op::LOAD, st, {smem, g.make(Op::INDEX, st, {g.make(Op::AFTER, smem->dtype(), {smem, bar}), at})});
  };
  std::vector<const UOp*> stores;
  auto store = [&](const UOp* value, const UOp* m, const UOp* n) {
    absl::flat_hash_map<const UOp*, const UOp*> at = {{mt->reduce, value}, {mt->m, m}, {mt->n, n}};
    stores.push_back(g.make(Op::STORE, dtypes::void_,
                            {substitute(g, mt->store->src(0), at), substitute(g, mt->store->src(1), at)}));
  };
  if (!t.tensor_cores) {
    std::vector<const UOp*> av, bv, rows, cols;
    for (int64_t i = 0; i < t.tm; ++i) av.push_back(read(as, t.bm, kk, add(ty, g.idx(i * TY))));
    for (int64_t j = 0; j < t.tn; ++j) bv.push_back(read(bs, t.bn, kk, add(tx, g.idx(j * TX))));
    for (int64_t i = 0; i < t.tm; ++i)
      for (int64_t j = 0; j < t.tn; ++j) rows.push_back(av[i]), cols.push_back(bv[j]);
    // One vector product, lane i TN + j = a_i * b_j: lower_reduce accumulates a product
    // with a fused multiply-add (MULACC), one per lane.
    const DType vt = dt.vec(static_cast<uint32_t>(t.tm * t.tn));
    const UOp* prod = g.alu(Op::MUL, {g.make(Op::VECTORIZE, vt, rows), g.make(Op::VECTORIZE, vt, cols)});
    const UOp* acc = g.make(Op::REDUCE, vt, {prod, kt, kk}, ReduceOpArg{ReduceOp::Add});
    for (int64_t i = 0; i < t.tm; ++i)
      for (int64_t j = 0; j < t.tn; ++j)
        store(g.make(Op::GEP, dt, {acc}, IntsArg{{i * t.tn + j}}), add(add(mul(gm, t.bm), ty), g.idx(i * TY)),
              add(add(mul(gn, t.bn), tx), g.idx(j * TX)));
  } else {
    // The warp's (WM / 16) x (WN / 8) mma tiles, each in PTX's m16n8k16 fragment layout
    // (tensor_cores.h): lane = 4 grp + tig holds A rows grp, grp + 8 at k 2 tig + {0, 1, 8, 9},
    // B column grp at the same k, C rows grp, grp + 8 at columns 2 tig, 2 tig + 1.
    const UOp* grp = g.alu(Op::IDIV, {lane, g.idx(4)});
    const UOp* tig = g.alu(Op::MOD, {lane, g.idx(4)});
    const UOp* k0 = add(mul(kk, 16), mul(tig, 2));
    const UOp* m0 = add(mul(ty, t.tm), grp);  // the warp's first row in the block's tile, + grp
    const UOp* n0 = mul(tx, t.tn);            // its first column
    const int64_t TI = t.tm / 16, TJ = t.tn / 8;
    std::vector<const UOp*> afrag, bfrag, mmas;
    for (int64_t i = 0; i < TI; ++i) {
      std::vector<const UOp*> a;
      for (int64_t e = 0; e < 8; ++e)
        a.push_back(read(as, t.bm, add(k0, g.idx((e & 1) + 8 * (e >> 2))), add(m0, g.idx(16 * i + 8 * ((e >> 1) & 1)))));
      afrag.push_back(g.make(Op::VECTORIZE, DType(st.scalar, 8), a));
    }
    for (int64_t j = 0; j < TJ; ++j) {
      std::vector<const UOp*> b;
      for (int64_t e = 0; e < 4; ++e)
        b.push_back(read(bs, t.bn, add(k0, g.idx((e & 1) + 8 * (e >> 1))), add(add(n0, grp), g.idx(8 * j))));
      bfrag.push_back(g.make(Op::VECTORIZE, DType(st.scalar, 4), b));
    }
    WmmaArg wa = tensor_core_wmma(st.scalar);
    const DType f4 = dtypes::float32.vec(4);
    const UOp* zero = g.make(Op::VCONST, f4, {}, VConstArg{{ConstValue::Float(0.0)}});
    for (int64_t i = 0; i < TI; ++i)
      for (int64_t j = 0; j < TJ; ++j) mmas.push_back(g.make(Op::WMMA, f4, {afrag[i], bfrag[j], zero}, wa));
    // One accumulator of 4 lanes per mma tile; gpu_dims folds acc + CAT(WMMA(a, b, 0), ...)
    // into CAT(WMMA(a, b, acc's lanes), ...), the tensor cores accumulating in place.
    const DType vt = dtypes::float32.vec(static_cast<uint32_t>(4 * TI * TJ));
    const UOp* v = mmas.size() == 1 ? mmas[0] : g.make(Op::CAT, vt, mmas);
    const UOp* acc = g.make(Op::REDUCE, vt, {v, kt, kk}, ReduceOpArg{ReduceOp::Add});
    for (int64_t i = 0; i < TI; ++i)
      for (int64_t j = 0; j < TJ; ++j)
        for (int64_t e = 0; e < 4; ++e) {
          const UOp* r = g.make(Op::GEP, dtypes::float32, {acc}, IntsArg{{4 * (i * TJ + j) + e}});
          if (dt != dtypes::float32) r = g.make(Op::CAST, dt, {r});
          store(r, add(add(mul(gm, t.bm), m0), g.idx(16 * i + 8 * (e >> 1))),
                add(add(add(mul(gn, t.bn), n0), mul(tig, 2)), g.idx(8 * j + (e & 1))));
        }
  }
  absl::flat_hash_map<const UOp*, const UOp*> batch_dims;
  std::vector<const UOp*> closes = matmul_batch_loops(g, *mt, id + 8, &batch_dims);
  for (const UOp* r : t.tensor_cores ? std::vector<const UOp*>{gm, gn, warp, lane} : std::vector<const UOp*>{gm, gn, ty, tx})
    closes.push_back(r);
  std::vector<const UOp*> end{g.make(Op::GROUP, dtypes::void_, stores)};
  end.insert(end.end(), closes.begin(), closes.end());
  const UOp* body = substitute(g, g.make(Op::END, dtypes::void_, end), batch_dims);
  return g.make(Op::SINK, kernel->dtype(), {body}, kernel->arg());
}

}  // namespace uop
