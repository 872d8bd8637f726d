// gpu_dims: parallel ranges -> SPECIAL (see gpu_dims.h). One walk over the kernel in
// topological order rebuilds every node from its rebuilt sources, with four exceptions:
// a mapped RANGE becomes its expression over SPECIALs, an END of a mapped range becomes
// its body, an AFTER drops mapped ranges from its dependencies (a SPECIAL orders nothing),
// and a STORE to a kernel argument gets the tail gate of a clamped split.
#include "compiler/passes/gpu_dims.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

bool is_thread_axis(AxisType t) { return t == AxisType::Local || t == AxisType::GroupReduce || t == AxisType::Warp; }

const UOp* special(Graph& g, std::string_view name, const UOp* end) {
  return g.make(Op::SPECIAL, dtypes::index, {end}, StrArg{std::string(name)});
}

// A VCONST / CONST whose every lane is zero: the accumulator input of a fresh WMMA.
bool is_zero(const UOp* u) {
  if (const ConstValue* c = u->const_value()) return c->bits() == 0;
  if (u->op() != Op::VCONST) return false;
  for (const ConstValue& v : u->arg_as<VConstArg>().values)
    if (v.bits() != 0) return false;
  return true;
}

const UOp* buffer_of(const UOp* index) {
  const UOp* b = index->src(0);
  while (b->op() == Op::AFTER) b = b->src(0);
  return b;
}

}  // namespace

absl::StatusOr<const UOp*> map_gpu_dims(Graph& g, const UOp* kernel, int max_threads) {
  const std::vector<const UOp*> order = toposort(kernel);
  std::vector<const UOp*> grid, block;
  for (const UOp* u : order) {
    if (u->op() != Op::RANGE) continue;
    AxisType t = u->arg_as<RangeArg>().type;
    if (t == AxisType::Global) grid.push_back(u);
    else if (is_thread_axis(t)) block.push_back(u);
  }
  auto by_id_desc = [](const UOp* a, const UOp* b) {
    return a->arg_as<RangeArg>().axis_id > b->arg_as<RangeArg>().axis_id;
  };
  std::sort(grid.begin(), grid.end(), by_id_desc);
  std::sort(block.begin(), block.end(), by_id_desc);
  if (grid.size() > 3 || block.size() > 3)
    return absl::InternalError(cat("gpu_dims: ", grid.size(), " Global and ", block.size(),
                                   " thread ranges; at most three of each"));
  int64_t threads = 1;
  for (const UOp* r : block) {
    const ConstValue* c = r->src(0)->const_value();
    if (!c || c->to_int() < 1 || c->to_int() > 1024)
      return absl::InternalError("gpu_dims: a thread range needs a constant extent in 1 .. 1024");
    threads *= c->to_int();
  }
  if (threads > 1024) return absl::InternalError(cat("gpu_dims: ", threads, " threads per block, over 1024"));

  static constexpr const char* kGrid[] = {"blockIdx.x", "blockIdx.y", "blockIdx.z"};
  static constexpr const char* kBlock[] = {"threadIdx.x", "threadIdx.y", "threadIdx.z"};
  absl::flat_hash_map<const UOp*, const UOp*> repl;  // mapped RANGE -> its expression
  for (size_t i = 0; i < block.size(); ++i) repl[block[i]] = special(g, kBlock[i], block[i]->src(0));

  // blockIdx.x split into blocks of L threads, when no thread range uses the block.
  const UOp* split = nullptr;  // the split range
  const UOp* tail_gate = nullptr;
  for (size_t i = 0; i < grid.size(); ++i) {
    const UOp* r = grid[i];
    const UOp* n = r->src(0);
    if (i > 0 || !block.empty() || max_threads < 2) {
      repl[r] = special(g, kGrid[i], n);
      continue;
    }
    const ConstValue* c = n->const_value();
    const int64_t N = c ? c->to_int() : -1;
    int64_t L = 0;
    bool exact = false;
    if (c && N >= 1 && N <= max_threads) {
      L = N, exact = true;  // one block
    } else if (c && N > max_threads) {
      for (int64_t l = max_threads; l >= 32 && !L; l /= 2)
        if (N % l == 0) L = l, exact = true;
    }
    if (!L) {
      if (c && N < 1) {  // nothing to run: an empty grid
        repl[r] = special(g, kGrid[i], n);
        continue;
      }
      L = 1;
      while (L * 2 <= max_threads) L *= 2;
    }
    const UOp* t = special(g, kBlock[0], g.idx(L));
    if (exact) {
      const UOp* b = special(g, kGrid[0], c ? g.idx(N / L) : g.alu(Op::IDIV, {n, g.idx(L)}));
      repl[r] = L == N ? t : g.alu(Op::ADD, {g.alu(Op::MUL, {b, g.idx(L)}), t});
      continue;
    }
    // ceil(N / L) blocks (not (N + L - 1) / L, which overflows for N near 2^63); the last
    // one's extra threads repeat index N - 1 and write nothing.
    const UOp* blocks = c ? g.idx(N / L + (N % L != 0)) : g.alu(Op::IDIV, {g.alu(Op::ADD, {n, g.idx(L - 1)}), g.idx(L)});
    const UOp* b = special(g, kGrid[0], blocks);
    const UOp* flat = g.alu(Op::ADD, {g.alu(Op::MUL, {b, g.idx(L)}), t});
    const UOp* last = c ? g.idx(N - 1) : g.alu(Op::SUB, {n, g.idx(1)});
    repl[r] = g.alu(Op::MIN, {flat, last});
    split = r;
    tail_gate = g.alu(Op::CMPLT, {flat, n});
  }

  // Which nodes the clamped range reaches: their stores get the tail gate.
  absl::flat_hash_set<const UOp*> reaches;
  if (split)
    for (const UOp* u : order) {
      if (u == split) reaches.insert(u);
      else
        for (const UOp* s : u->src())
          if (reaches.contains(s)) {
            reaches.insert(u);
            break;
          }
    }

  absl::flat_hash_map<const UOp*, const UOp*> done;
  std::vector<const UOp*> src;
  for (const UOp* u : order) {
    if (auto it = repl.find(u); it != repl.end()) {
      done[u] = it->second;
      continue;
    }
    if (u->op() == Op::END && repl.contains(u->src(1))) {
      if (u->num_src() != 2) return absl::InternalError("gpu_dims: END closing several ranges (run lower_reduce first)");
      done[u] = done.at(u->src(0));
      continue;
    }
    src.clear();
    for (size_t i = 0; i < u->num_src(); ++i) {
      const UOp* s = u->src(i);
      if (u->op() == Op::AFTER && i > 0 && repl.contains(s)) continue;  // a SPECIAL orders nothing
      src.push_back(done.at(s));
    }
    if (u->op() == Op::STORE && split && reaches.contains(u) && u->src(0)->op() == Op::INDEX &&
        buffer_of(u->src(0))->op() == Op::PARAM) {
      const UOp* idx = src[0];
      std::vector<const UOp*> isrc(idx->src().begin(), idx->src().end());
      if (isrc.size() > 2 && isrc.back()->dtype() == dtypes::bool_) isrc.back() = g.alu(Op::AND, {isrc.back(), tail_gate});
      else isrc.push_back(tail_gate);
      src[0] = g.make(Op::INDEX, idx->dtype(), isrc, idx->arg());
    }
    // acc + WMMA(a, b, 0) -> WMMA(a, b, acc): the tensor cores accumulate in place.
    // acc + CAT(WMMA(a0, b0, 0), WMMA(a1, b1, 0), ...) -> CAT(WMMA(a0, b0, acc[0..3]), ...):
    // a warp's several mma tiles in one accumulator (gemm_tiles.h).
    if (u->op() == Op::ADD && u->dtype().is_vector()) {
      auto fresh = [](const UOp* m) { return m->op() == Op::WMMA && m->num_src() == 3 && is_zero(m->src(2)); };
      for (int w = 0; w < 2; ++w) {
        const UOp* m = src[w];
        if (fresh(m) && m->dtype() == u->dtype()) {
          done[u] = g.make(Op::WMMA, m->dtype(), {m->src(0), m->src(1), src[1 - w]}, m->arg());
          break;
        }
        if (m->op() != Op::CAT || m->dtype() != u->dtype() ||
            !std::all_of(m->src().begin(), m->src().end(), [&](const UOp* x) { return fresh(x); }))
          continue;
        std::vector<const UOp*> parts;
        int64_t lane = 0;
        for (const UOp* x : m->src()) {
          std::vector<int64_t> lanes;
          for (uint32_t l = 0; l < x->dtype().count; ++l) lanes.push_back(lane++);
          const UOp* c = g.make(Op::GEP, x->dtype(), {src[1 - w]}, IntsArg{lanes});
          parts.push_back(g.make(Op::WMMA, x->dtype(), {x->src(0), x->src(1), c}, x->arg()));
        }
        done[u] = g.make(Op::CAT, u->dtype(), parts);
        break;
      }
      if (done.contains(u)) continue;
    }
    done[u] = g.replace_src(u, src);
  }
  return done.at(kernel);
}

}  // namespace uop
