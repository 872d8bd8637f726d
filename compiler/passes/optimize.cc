#include "compiler/passes/optimize.h"

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "compiler/ir/value_range.h"
#include "compiler/passes/expand.h"
#include "compiler/support/status_macros.h"

namespace uop {
namespace {

// The lanes for a loop of n iterations and vectors of w lanes: w when it divides n; else a
// divisor of n above w / 2 (no mask, nearly full vectors); else w with the tail masked
// where the loop may be masked (can_mask), the largest divisor of n below w where not;
// n itself when it is shorter than w. 0: no split.
int64_t lanes_for(int64_t n, int64_t w, bool maskable) {
  if (n % w == 0) return w;
  for (int64_t d = w - 1; d > w / 2; --d)
    if (n % d == 0) return d;
  if (n < w) return n >= 2 ? n : 0;
  if (maskable) return w;
  for (int64_t d = w / 2; d >= 2; --d)
    if (n % d == 0) return d;
  return 0;
}

// The lanes of a vector axis of n iterations in a register tile: the largest power of two
// up to `most` that divides n (1: none). An odd-sized vector is split by LLVM into
// pieces and shuffles (a 3x3 convolution ran 3 to 5 times slower with 7 or 14 lanes than
// with 4 or 8), and a masked tail clamps the index, which makes each lane's load a
// scalar one.
int64_t pow2_lanes(int64_t n, int64_t most) {
  int64_t l = 1;
  while (2 * l <= most && n > 0 && n % (2 * l) == 0) l *= 2;
  return l;
}

// The coefficient of axis `a` in each index the kernel's reductions load (0: the load
// does not read it; -1: not affine in it): what each operand of a tile shares.
struct Operands {
  std::vector<const UOp*> idx;  // the index of every LOAD under a REDUCE
  bool gated = false;           // some of those loads are gated (a window read through a pad)
  // Whether some load's index is gated or clamped and so not affine in some of `axes`
  // (clamped into its buffer, as the tinygrad bridge reads a padded window). An index
  // that is not affine only through divisions and remainders by constants (weights stored
  // in blocks of output channels, conv_weights in compiler/onnx) is read as plainly as an
  // affine one.
  bool irregular(const std::vector<const UOp*>& axes) const {
    if (gated) return true;
    for (const UOp* i : idx) {
      bool clamped = false;
      for (const UOp* u : toposort(i)) clamped |= u->op() == Op::MIN || u->op() == Op::MAX || u->op() == Op::WHERE;
      if (!clamped) continue;
      for (const UOp* r : axes)
        if (!affine_coeff(i, r)) return true;
    }
    return false;
  }
  int64_t coeff(size_t load, const UOp* r) const {
    auto c = affine_coeff(idx[load], r);
    return c ? *c : -1;
  }
};

Operands reduced_loads(const UOp* kernel) {
  Operands o;
  absl::flat_hash_set<const UOp*> seen;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() != Op::REDUCE) continue;
    for (const UOp* x : toposort(u->src(0)))
      if (x->op() == Op::LOAD && x->src(1)->op() == Op::INDEX && x->src(1)->num_src() >= 2 && seen.insert(x).second) {
        o.idx.push_back(x->src(1)->src(1));
        o.gated |= x->src(1)->num_src() >= 3;
      }
  }
  return o;
}

// The axes (indices into `axis_of`) a REDUCE's value varies over: its own ranges and
// every range its operands read, without looking inside the REDUCEs among them.
std::vector<size_t> scope_axes(const UOp* reduce, const absl::flat_hash_map<const UOp*, size_t>& axis_of) {
  std::vector<size_t> scope;
  absl::flat_hash_set<const UOp*> seen{reduce};
  std::vector<const UOp*> todo(reduce->src().begin(), reduce->src().end());
  while (!todo.empty()) {
    const UOp* u = todo.back();
    todo.pop_back();
    if (!seen.insert(u).second) continue;
    if (auto at = axis_of.find(u); at != axis_of.end()) scope.push_back(at->second);
    if (u->op() == Op::REDUCE) continue;
    for (const UOp* s : u->src()) todo.push_back(s);
  }
  std::sort(scope.begin(), scope.end());
  return scope;
}

// The kernel as heuristic_schedule sees it, and the schedule it has chosen so far: each
// axis's trip count (its largest, for a variable one) and whether it is Upcast, and the
// order the STORE closes the output axes in, kept as the steps would leave them.
struct Plan {
  const UOp* store = nullptr;
  const UOp* idx = nullptr;              // the STORE's linear index
  std::vector<const UOp*> axes;          // schedule_axes: the kernel's, then the splits'
  std::vector<int64_t> trip;
  std::vector<bool> upcast;
  std::vector<int64_t> store_order;      // output axes, outermost first
  std::vector<bool> maskable;            // can_mask, per axis of the kernel
  size_t outputs = 0;                    // axes 0 .. outputs-1 are the STORE's
  bool reduces = false;
  // Per REDUCE of the kernel: the axes its value varies over (its own and those its
  // operands read, not looking inside the REDUCEs it uses: each of those is its own
  // entry), and its innermost own loop (-1: none is an axis).
  struct Reduction {
    const UOp* op;
    std::vector<size_t> scope;
    int64_t inner = -1;
  };
  std::vector<Reduction> reductions;
  int64_t width = 0;                     // lanes of one vector register, 0: no upcasting
  Operands ops;                          // what the reductions load
  LoopSchedule out;

  void split(int64_t a, int64_t f) {
    if (a < 0 || f < 2) return;
    out.steps.push_back(LoopStep{.kind = LoopStep::Kind::Split, .axis = a, .factor = f, .type = AxisType::Upcast});
    trip[a] = (trip[a] + f - 1) / f;
    trip.push_back(f);
    upcast.push_back(true);
    auto at = std::find(store_order.begin(), store_order.end(), a);
    if (at != store_order.end()) store_order.insert(at + 1, static_cast<int64_t>(trip.size()) - 1);
  }
  void outermost(int64_t a) {
    std::vector<int64_t> order{a};
    for (int64_t b : store_order)
      if (b != a) order.push_back(b);
    if (order == store_order) return;
    store_order = order;
    out.steps.push_back(LoopStep{.kind = LoopStep::Kind::Reorder, .order = order});
  }
  bool contiguous(int64_t a) const { return idx && affine_coeff(idx, axes[a]) == 1; }
  int64_t lanes(int64_t a, int64_t w) const { return lanes_for(trip[a], w, maskable[a]); }
};

// The output loop whose lanes are contiguous in memory: the innermost one the width
// divides, else the innermost contiguous one. -1 when none has two iterations.
int64_t lane_axis(const Plan& p) {
  int64_t any = -1;
  for (size_t i = p.outputs; i-- > 0;) {
    int64_t n = const_end(p.axes[i]);
    if (!p.contiguous(static_cast<int64_t>(i)) || n < 2) continue;
    if (n % p.width == 0) return static_cast<int64_t>(i);
    if (any < 0) any = static_cast<int64_t>(i);
  }
  return any;
}

// A gated lane loop (a pad's) gets a gated tail too: MobileNetV2's pads of 58 and 114
// columns ran at 2 and 6 lanes, the largest divisors.
void elementwise(Plan& p, const OptimizeOptions&) {
  int64_t a = lane_axis(p);
  if (a >= 0) p.split(a, lanes_for(p.trip[a], p.width, true));
}

// The lanes of a tile of accumulators one register file holds: `registers` vector
// registers, eight unless told.
int64_t tile_budget(const Plan& p, const OptimizeOptions& o, int64_t registers = 8) {
  return std::min<int64_t>(o.max_lanes, registers * p.width);
}

// A matmul's tile of accumulators: half the vector registers, the rest for the operands
// in flight; 16 of AVX-512's 32 (a 1024 x 1024 fp32 matmul ran 2 to 2.5 times faster with
// 8 x 32 accumulators than with 4 x 32), 8 of AVX2's 16.
int64_t matmul_budget(const Plan& p, const OptimizeOptions& o) { return tile_budget(p, o, (o.vector_bits >= 512 ? 32 : 16) / 2); }

// Outputs and a reduction whose operands share lanes: a matmul (C[i, j] = A[i, k] B[k, j]),
// a convolution (out[c, y, x] = in[k, y + u, x + v] w[c, k, u, v], the padded input
// realized), attention's P V. A register tile of accumulators: vector lanes along `a`,
// the output loop the STORE writes contiguously (B's columns, the output width), and
// rows along `b`, an output loop that the operands read along `a` do not read (A's rows,
// the output channels): each vector loaded along `a` is reused by every row, each value
// of the other operand (a weight) by every lane. Where `a` gives fewer than half a vector
// (a 28- or 14-wide feature map), a second output loop those operands read (the output
// height) fills it, so that each weight loaded still serves a whole vector. The rows take
// what is left of the tile, up to 32.
void register_tile(Plan& p, const OptimizeOptions& o, int64_t a, const std::vector<size_t>& along, int64_t b) {
  const int64_t n = p.trip[a];
  // A window reduction (several reduce loops: a convolution) takes at most 8 lanes along
  // the width and gives the rest to the channels: a 128-wide 3x3 convolution ran 4.8
  // times faster with 16 channels x 8 columns than with 4 x 32 (the matmul's tile then).
  // With AVX-512 its tile is 256 lanes, half the register file like a matmul's, the map's
  // part of it a whole vector of pixels, the channels the rest: ResNet-18's 3x3
  // convolutions ran 1.1 to 1.7 times faster on 56 x 56 and 28 x 28 maps with 16 channels
  // x 16 pixels than with 16 x 8. With AVX2 (16 registers) half the register file is 64
  // lanes where the window's loads are plain and affine (the padded input realized): on a
  // Zen 3, schedule search found 8 channels x 8 pixels 2.4 times faster than 16 x 8 for
  // ResNet-18's 64-channel 56 x 56 convolution and 1.8 to 2.6 times faster than 16 x 8 or
  // 32 x 8 for a U-Net's 16- to 64-channel ones. A window read through gated or clamped
  // loads (the tinygrad bridge's kernels read their padded input so) keeps 256 lanes,
  // twice the register file, accumulators LLVM keeps beside the loads: there 32 channels x
  // 8 pixels ran 2.3 times faster than 8 x 8.
  const bool window = p.axes.size() > p.outputs + 1;
  const bool wide_window = window && (o.vector_bits >= 512 || p.ops.irregular(p.axes));
  const int64_t budget = wide_window ? tile_budget(p, o, 256 / p.width) : matmul_budget(p, o), w = p.width;
  const int64_t fill_to = window ? w : w / 2;
  int64_t cl = window                                     ? pow2_lanes(n, std::min<int64_t>(w, 8))
               : n % (2 * w) == 0 && 2 * w <= budget ? 2 * w
                                                     : pow2_lanes(n, w);
  int64_t s = -1, sl = 1;
  // The filling loop: the innermost other output loop the operands read along `a` read,
  // for up to `to` / cl lanes (a power of two dividing it, or with a masked tail).
  auto fill = [&](int64_t to, bool masked) {
    for (size_t i = p.outputs; i-- > 0;) {
      const int64_t ii = static_cast<int64_t>(i);
      if (ii == a || ii == b || p.trip[i] < 2) continue;
      bool read = false;
      for (size_t l : along) read |= p.ops.coeff(l, p.axes[i]) != 0;
      const int64_t f = !read ? 1 : !masked ? pow2_lanes(p.trip[i], to / cl) : p.maskable[i] ? std::min(to / cl, p.trip[i]) : 1;
      if (f >= 2) {
        s = ii, sl = f;
        return;
      }
    }
  };
  if (cl < fill_to) fill(fill_to, false);
  // A small map of odd sides (ResNet's and MobileNet's 7 x 7, 14 x 14) has no power of two
  // to fill half a vector with, so each gathered weight served one or two pixels: there
  // the width takes 4 lanes and the height what the tile's pixels still lack, their tails
  // masked (a 3x3 convolution of 512 channels on 7 x 7 ran 4.7 times faster with 32
  // channels x 4 x 2 pixels, on 14 x 14 1.3 times with 32 x 2 x 4, than with the unmasked
  // 32 x 1 and 32 x 2 x 2; MobileNet's 1x1 convolutions on 7 x 7, 4 to 10 times; with
  // AVX-512, 16 x 4 x 4 ran 1.1 to 1.3 times faster than 32 x 4 x 2 on ResNet's 7 x 7 and
  // 14 x 14 convolutions, the kernels alone, once their window reads were contiguous).
  // What they lack is half a vector, a whole one for a window reduction, so that each
  // vector holds one channel's pixels and each weight is one broadcast: with AVX2, where a
  // vector was half one channel's pixels and half the next's, 8 channels x 2 x 4 pixels
  // ran ResNet-18's 3x3 convolutions on 14 x 14 and 28 x 28 1.05 to 1.4 times faster than
  // 16 x 2 x 2 and 16 x 4 (uop bench p50, alternating).
  if (cl * sl < fill_to && p.maskable[a] && n > cl) {
    cl = std::max(cl, std::min<int64_t>(4, n));  // never fewer lanes than the power of two gave
    if (cl * sl < fill_to && s < 0) fill(fill_to, true);
  }
  const int64_t bl = b >= 0 ? pow2_lanes(p.trip[b], std::min<int64_t>(32, budget / (cl * sl))) : 1;
  // Rows first, then the filling loop, then the lanes: lane = (row * sl + fill) * cl +
  // column, each row a run of contiguous lanes.
  p.split(b, bl);
  p.split(s, sl);
  p.split(a, cl);
  // One reduction loop (a matmul): the column-panel loop outermost, so that each panel
  // of B stays in cache while every row block of A streams past it. A window reduction
  // (a convolution): the output loop of most iterations outermost, the map's rows where
  // it has more than the channel blocks, so that the few input rows one output row reads
  // stay in cache while every channel block passes over them (a 56 x 56 3x3 convolution
  // ran 2.6 times faster so than channel blocks outermost).
  if (!window) {
    if (bl >= 2 && cl >= 2) p.outermost(a);
    return;
  }
  int64_t most = p.store_order[0];
  for (int64_t x : p.store_order)
    if (!p.upcast[x] && p.trip[x] > p.trip[most]) most = x;
  p.outermost(most);
}

// Outputs and a reduction whose operands read every output loop: a depthwise convolution
// (out[c, y, x] = in[c, y + u, x + v] w[c, u, v]), a pool, a reduction over a non-innermost
// axis (out[j] = sum_i x[i, j]). No lane's load serves another, so the tile is the
// contiguous output loop's vector (2 vectors where they divide it, else a power of two,
// filled from a second loop the loads read where that is under a vector), and up to 4
// independent rows of another output loop for the adds in flight; the small window
// loops stay inner loops of constant trip count, which LLVM unrolls.
void window_tile(Plan& p, const OptimizeOptions& o, int64_t a) {
  const int64_t budget = tile_budget(p, o), w = p.width;
  const int64_t n = p.trip[a];
  int64_t cl = n % (2 * w) == 0 && 2 * w <= budget ? 2 * w : pow2_lanes(n, w);
  if (cl < 2 && p.maskable[a]) cl = p.lanes(a, w);  // an odd kept axis: a masked tail
  int64_t s = -1, sl = 1, r = -1, rl = 1;
  for (size_t i = p.outputs; i-- > 0;) {
    const int64_t ii = static_cast<int64_t>(i);
    if (ii == a || p.trip[i] < 2) continue;
    if (s < 0 && cl < w) {
      if (int64_t f = pow2_lanes(p.trip[i], w / cl); f >= 2) {
        s = ii, sl = f;
        continue;
      }
    }
    if (r < 0) {
      if (int64_t f = pow2_lanes(p.trip[i], std::min<int64_t>(4, budget / (cl * sl))); f >= 2) r = ii, rl = f;
    }
  }
  p.split(r, rl);
  p.split(s, sl);
  p.split(a, cl);
}

// Outputs and reductions whose operands are contiguous along each one's innermost reduce
// loop and not along the output (Q K^T, a matmul with a transposed operand, a sum over
// the innermost axis, the matrix-vector products of a recurrent cell's gates): vector
// lanes along each reduce loop, folded once after it, and a tile of up to 4 x 4 outputs
// around them (each a row of lanes) so that one operand's vector serves several dot
// products, as many accumulators as a matmul's tile: 4 x 2 with AVX2's 16 registers, 4 x 4
// with AVX-512's 32 (a training step's 128 x 1024 x 1024 dH = dY W^T ran 1.32 times
// faster so than with 4 x 2, schedule search's pick on an AMD EPYC). Sibling reductions
// (a GRU step's three gates, each W_g h over 128) run one after another, so they share
// the tile's budget rather than divide it; a GRU step ran 4.6 times faster so than with
// its 128 outputs as 32-lane vectors gathering each weight column.
bool dot_tile(Plan& p, const OptimizeOptions& o) {
  const int64_t budget = matmul_budget(p, o), w = p.width;
  std::vector<std::pair<int64_t, int64_t>> splits;  // (reduce loop, lanes), once each
  int64_t rl = w;                                   // the fewest lanes of any
  for (const Plan::Reduction& red : p.reductions) {
    const int64_t r = red.inner;
    if (r < 0) return false;
    // A reduction nested in another's body (reading its loop) would multiply their lanes.
    for (const Plan::Reduction& other : p.reductions)
      if (other.inner != r && std::find(red.scope.begin(), red.scope.end(), static_cast<size_t>(other.inner)) != red.scope.end())
        return false;
    for (const UOp* x : toposort(red.op->src(0)))
      if (x->op() == Op::LOAD && x->src(1)->op() == Op::INDEX && x->src(1)->num_src() >= 2) {
        auto c = affine_coeff(x->src(1)->src(1), p.axes[static_cast<size_t>(r)]);
        if (!c || *c != 1) return false;
      }
    const int64_t l = pow2_lanes(p.trip[r], w);
    if (l < std::max<int64_t>(4, w / 2)) return false;
    if (std::find_if(splits.begin(), splits.end(), [&](auto& s) { return s.first == r; }) == splits.end())
      splits.emplace_back(r, l);
    rl = std::min(rl, l);
  }
  if (splits.empty()) return false;
  int64_t j = -1, jl = 1, i = -1, il = 1;
  for (size_t x = p.outputs; x-- > 0;) {
    const int64_t xx = static_cast<int64_t>(x);
    if (j < 0) {
      if (int64_t f = pow2_lanes(p.trip[x], std::min<int64_t>(4, budget / rl)); f >= 2) j = xx, jl = f;
    } else if (i < 0) {
      // Counted in registers: a dot's lanes fill at least one.
      const int64_t regs = budget / w, per_dot = (rl + w - 1) / w;
      if (int64_t f = pow2_lanes(p.trip[x], std::min<int64_t>(4, regs / (jl * per_dot))); f >= 2) i = xx, il = f;
    }
  }
  p.split(i, il);
  p.split(j, jl);
  for (auto [r, l] : splits) p.split(r, l);
  return true;
}

// Outputs and a reduction: which tile its operands share (above).
void tiled_reduction(Plan& p, const OptimizeOptions& o) {
  const int64_t a = lane_axis(p);
  std::vector<size_t> along;  // the operands read along a
  bool contiguous = false;
  if (a >= 0)
    for (size_t l = 0; l < p.ops.idx.size(); ++l)
      if (int64_t c = p.ops.coeff(l, p.axes[static_cast<size_t>(a)]); c != 0) {
        along.push_back(l);
        contiguous |= c == 1;
      }
  if ((a < 0 || !contiguous) && dot_tile(p, o)) return;
  if (a < 0) return;
  int64_t b = -1;  // the innermost output loop that nothing read along a reads
  for (size_t i = p.outputs; i-- > 0 && b < 0;) {
    if (static_cast<int64_t>(i) == a || p.trip[i] < 2) continue;
    bool read = false;
    for (size_t l : along) read |= p.ops.coeff(l, p.axes[i]) != 0;
    if (!read) b = static_cast<int64_t>(i);
  }
  if (b >= 0) register_tile(p, o, a, along, b);
  else window_tile(p, o, a);
}

// No output loop: the reduce loop's lanes become vector accumulators.
void full_reduction(Plan& p, const OptimizeOptions& o) {
  const int64_t a = static_cast<int64_t>(p.axes.size()) - 1;  // the innermost reduce loop
  const int64_t n = const_end(p.axes[a]);
  if (n < 2 || !p.reduces) return;
  for (int64_t m : {4, 2, 1}) {
    int64_t w = std::min<int64_t>(m * p.width, o.max_lanes);
    if (n % w == 0) return p.split(a, w);
  }
  p.split(a, p.lanes(a, std::min<int64_t>(p.width, o.max_lanes)));
}

// The scalar or vector iterations the kernel runs, as its loops stand after the splits:
// the STORE's loops, plus, per REDUCE, those loops times the loops of its scope. Sibling
// reductions add (three matrix-vector products of 128 fused into one kernel are 3 x 128
// iterations per output vector, not 128 cubed); a REDUCE nested in another's body and
// reading its loop has that loop in its own scope, so nesting multiplies. With `lanes`,
// an Upcast loop's lanes count too.
__int128 iterations(const Plan& p, bool lanes = false) {
  constexpr __int128 kCap = __int128{1} << 62;
  auto product = [&](auto&& axes) {
    __int128 w = 1;
    for (size_t i : axes)
      if (lanes || !p.upcast[i]) w = std::min<__int128>(w * std::max<int64_t>(p.trip[i], 1), kCap);
    return w;
  };
  std::vector<size_t> outs;  // the STORE's loops: the kernel's and the splits' of them
  for (int64_t i : p.store_order) outs.push_back(static_cast<size_t>(i));
  const __int128 per_output = product(outs);
  __int128 work = per_output;
  for (const Plan::Reduction& r : p.reductions) {
    std::vector<size_t> inner;
    for (size_t i : r.scope)
      if (i >= p.outputs) inner.push_back(i);
    work = std::min<__int128>(work + std::min<__int128>(per_output * product(inner), kCap), kCap);
  }
  return work;
}

// The outermost output loop on threads, if the whole kernel is worth several: its vector
// iterations, or for an elementwise kernel its elements (a vector iteration of one is a
// load and a store; MobileNetV2's pad of 144 x 58 x 58, 4 x 16 lanes a row, ran 1 thread
// with vector iterations counted). Where that
// loop has under 8 iterations (a convolution's output channels, 64 / 16 lanes) and
// another output loop has more (the map's height), that one is moved outermost first, so
// that a machine with more cores than 4 still has a task for each.
void threads(Plan& p, const OptimizeOptions& o) {
  if (p.store_order.empty()) return;
  if (iterations(p, !p.reduces) < o.min_parallel_work) return;
  int64_t a = p.store_order[0];
  if (!p.upcast[a] && p.trip[a] < 8) {
    int64_t best = a;
    for (int64_t b : p.store_order)
      if (!p.upcast[b] && p.trip[b] > p.trip[best]) best = b;
    if (best != a) p.outermost(best);
    a = best;
  }
  if (p.upcast[a] || p.trip[a] < 2) return;
  p.out.steps.push_back(LoopStep{.kind = LoopStep::Kind::Thread, .axis = a});
}

// A reduce loop that a load's index divides or takes a remainder of: r with
// (s r + q) / c or (s r + q) % c in some index, c a multiple of s by f = c / gcd(c, s)
// from 2 to 16 that divides r's trip count (a channel shuffle's (k % 2) * C + k / 2, read
// by the next 1x1 convolution). Split by f into Upcast lanes, r = f a + b, the index is
// affine in a and b once simplified, so the loads are plain vector loads rather than a
// division and a gather per lane: ShuffleNet's 1x1 convolutions over shuffled channels
// ran 3 to 4 times faster so, schedule search's pick. Appended after the tile, whose
// lanes it doubles, where those stay within the limit.
void index_split(Plan& p, const OptimizeOptions& o) {
  int64_t lanes = 1;
  for (size_t i = 0; i < p.trip.size(); ++i)
    if (p.upcast[i]) lanes *= std::max<int64_t>(p.trip[i], 1);
  for (const UOp* idx : p.ops.idx)
    for (const UOp* u : toposort(idx)) {
      if ((u->op() != Op::IDIV && u->op() != Op::MOD) || u->src(1)->op() != Op::CONST) continue;
      const int64_t c = u->src(1)->const_value()->to_int();
      if (c < 2) continue;
      for (size_t a = p.outputs; a < p.axes.size(); ++a) {
        if (p.upcast[a]) continue;
        auto coeff = affine_coeff(u->src(0), p.axes[a]);
        if (!coeff || *coeff <= 0) continue;
        const int64_t f = c / std::gcd(c, *coeff);
        if (f < 2 || f > 16 || p.trip[a] % f != 0 || lanes * f > o.max_lanes) continue;
        p.split(static_cast<int64_t>(a), f);
        return;
      }
    }
}

}  // namespace

ScheduleLimits cpu_schedule_limits(const OptimizeOptions& opts) {
  ScheduleLimits l;
  l.output_types = {AxisType::Loop, AxisType::Upcast};
  l.reduce_types = {AxisType::Reduce, AxisType::Upcast};
  l.thread = true;
  l.max_lanes = opts.max_lanes;
  return l;
}

LoopSchedule heuristic_schedule(const UOp* kernel, const OptimizeOptions& opts) {
  Plan p;
  p.axes = schedule_axes(kernel);
  if (p.axes.empty()) return {};
  p.store = kernel->src(0);
  p.idx = p.store->src(0)->num_src() >= 2 ? p.store->src(0)->src(1) : nullptr;
  p.ops = reduced_loads(kernel);
  ValueRange vr;
  for (const UOp* r : p.axes) {
    p.maskable.push_back(can_mask(kernel, r));
    p.trip.push_back(vr.vmax(r->src(0)));
    p.upcast.push_back(r->arg_as<RangeArg>().type == AxisType::Upcast);
  }
  // A CUSTOM op is a call of a C function on scalars (llvm_cpu.custom): a kernel with one
  // gets no vector lanes, whatever its trip counts.
  bool custom = false;
  absl::flat_hash_map<const UOp*, size_t> axis_of;
  for (size_t i = 0; i < p.axes.size(); ++i) axis_of[p.axes[i]] = i;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() == Op::REDUCE && u->num_src() > 1) {
      p.reduces = true;
      Plan::Reduction r{.op = u, .scope = scope_axes(u, axis_of)};
      for (const UOp* s : u->src().subspan(1))
        if (auto at = axis_of.find(s); at != axis_of.end()) r.inner = std::max(r.inner, static_cast<int64_t>(at->second));
      p.reductions.push_back(std::move(r));
    }
    if (u->op() == Op::CUSTOM || u->op() == Op::CUSTOMI) custom = true;
  }
  for (const UOp* u : p.store->src().subspan(2))
    if (u->op() == Op::RANGE) p.store_order.push_back(static_cast<int64_t>(p.outputs++));

  const DType vt = p.store->src(1)->dtype();
  p.width = opts.vector_bits / (8 * std::max(vt.itemsize(), 1));
  if (p.width >= 2 && p.idx && !vt.is_bool() && !custom) {
    if (!p.reduces) elementwise(p, opts);
    else if (p.outputs > 0) tiled_reduction(p, opts);
    else full_reduction(p, opts);
  }
  threads(p, opts);
  if (p.width >= 2 && p.idx && p.reduces && !vt.is_bool() && !custom) index_split(p, opts);
  return p.out;
}

absl::StatusOr<const UOp*> optimize_cpu(Graph& g, const UOp* kernel, const OptimizeOptions& opts,
                                        std::string_view schedule, std::string* applied) {
  LoopSchedule s;
  if (schedule.empty()) {
    s = heuristic_schedule(kernel, opts);
  } else {
    ASSIGN_OR_RETURN(s, parse_loop_schedule(schedule));
  }
  ASSIGN_OR_RETURN(const UOp* k, apply_schedule(g, kernel, s, cpu_schedule_limits(opts)));
  if (applied) *applied = s.str();
  return k;
}

}  // namespace uop
