// libFuzzer target for the bounds proof (compiler/passes/bounds.h): the fuzz bytes choose a
// kernel-level graph with a gated index expression (loaded integers of every width,
// DEFINE_VARs, RANGEs of small and variable trip counts; ADD, SUB, MUL, IDIV, MOD, SHL,
// SHR, AND, MAX, MIN, NEG, CAST, WHERE, CMPLT, CMPNE; constants near the dtype limits),
// which is taken through the pipeline (plan_graph, then the CPU or the CUDA backend's lowering,
// whose last stage before linearize is the proof). For every kernel the proof accepts,
// every memory access of the IR it accepted (what is rendered) is evaluated under eval.h's
// wrapping semantics at many points of its free inputs: loaded values, variables and loop
// and launch indices, each over the values that matter for wrapping (the dtype's limits
// and their neighbours, small values, values derived from the kernel's constants, its
// range's ends), exhaustively where the points are few and sampled where they are not.
// The property: wherever an access executes (its loop indices inside their loops) and its
// gate holds, its index lies inside its buffer. A violation prints the kernel and the point
// and aborts.
//
// Built two ways: with -fsanitize=fuzzer under the 'fuzz' preset, and, with
// UOPD_FUZZ_REPLAY, as a plain program that runs a fixed-seed series of inputs (a bounded
// ctest run in every build) or writes such inputs as the fuzzer's seed corpus.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/printer.h"
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/backends/cuda/cuda_backend.h"
#include "compiler/pipeline.h"

// The oracle's own branches say nothing about the code under test, and thousands of them
// per input swamp libFuzzer's feature bookkeeping: they are not instrumented for coverage.
#if defined(__clang__)
#define UOP_NOT_COVERED __attribute__((no_sanitize("coverage")))
#else
#define UOP_NOT_COVERED
#endif

namespace {

using namespace uop;  // NOLINT: a test program

// Choices from the fuzz bytes; zeros once they run out.
class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t byte() { return pos_ < n_ ? d_[pos_++] : 0; }
  size_t pick(size_t n) { return n ? byte() % n : 0; }
  bool coin() { return byte() & 1; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }

 private:
  const uint8_t* d_;
  size_t n_, pos_ = 0;
};

constexpr Scalar kInts[] = {Scalar::Int8, Scalar::Int16, Scalar::Int32, Scalar::Int64, Scalar::UInt8,
                            Scalar::UInt16, Scalar::UInt32, Scalar::UInt64, Scalar::Index};

// Values of an integer type that wrapping arithmetic cares about: its limits and their
// neighbours, small values, powers of two and their neighbours.
UOP_NOT_COVERED std::vector<ConstValue> edge_values(Scalar t) {
  const int bits = scalar_bits(t);
  const bool sgn = scalar_is_signed_int(t);
  const uint64_t lo = sgn ? uint64_t{1} << (bits - 1) : 0;  // the lowest value's bits
  std::vector<uint64_t> raw;
  for (int d = 0; d < 3; ++d) raw.push_back(lo + d), raw.push_back(lo - 1 - d);  // min.., ..max
  for (int v = -3; v <= 3; ++v) raw.push_back(static_cast<uint64_t>(v));
  for (int k = 2; k < bits; k += 5) {
    uint64_t p = uint64_t{1} << k;
    raw.insert(raw.end(), {p, p - 1, p + 1, ~p + 1});
  }
  std::vector<ConstValue> out;
  for (uint64_t b : raw) {
    ConstValue v = cast_value(ConstValue::UInt(b), t);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

// Builds the kernel from the bytes.
struct Gen {
  Bytes& in;
  Graph& g;
  std::vector<const UOp*> params;  // by slot: 0 out, 1 data, then the integer inputs
  std::vector<const UOp*> ranges;
  int vars = 0;

  ConstValue constant(Scalar t) {
    switch (in.pick(4)) {
      case 0: return cast_value(ConstValue::Int(static_cast<int8_t>(in.byte())), t);
      case 1: {
        auto e = edge_values(t);
        return e[in.pick(e.size())];
      }
      case 2: return cast_value(ConstValue::UInt(in.u64()), t);
      default: return cast_value(ConstValue::Int(in.pick(9)), t);
    }
  }
  const UOp* cnst(Scalar t) { return g.cnst(DType{t}, constant(t)); }

  // A variable with bounds inside its dtype: a small trip count, or around its limits.
  const UOp* var(Scalar t) {
    const int bits = scalar_bits(t);
    const bool sgn = scalar_is_signed_int(t);
    const int64_t tmin = sgn ? (bits == 64 ? INT64_MIN : -(int64_t{1} << (bits - 1))) : 0;
    const int64_t tmax = bits == 64 ? INT64_MAX : sgn ? (int64_t{1} << (bits - 1)) - 1 : (int64_t{1} << bits) - 1;
    int64_t a, b;
    if (in.coin()) {
      a = static_cast<int64_t>(in.pick(3));
      b = a + static_cast<int64_t>(in.pick(9));
    } else {
      auto e = edge_values(t);
      a = e[in.pick(e.size())].to_int();
      if (in.coin()) b = e[in.pick(e.size())].to_int();
      else if (__builtin_add_overflow(a, static_cast<int64_t>(in.pick(17)), &b)) b = INT64_MAX;
    }
    a = std::clamp(a, tmin, tmax);
    b = std::clamp(b, tmin, tmax);
    if (a > b) std::swap(a, b);
    return g.make(Op::DEFINE_VAR, DType{t}, {}, DefineVarArg{"v" + std::to_string(vars++), a, b});
  }

  const UOp* range() {
    if (!ranges.empty() && (ranges.size() >= 3 || in.coin())) return ranges[in.pick(ranges.size())];
    const UOp* end;
    switch (in.pick(4)) {
      case 0: end = g.alu(Op::ADD, {var(Scalar::Index), g.idx(static_cast<int64_t>(in.pick(3)) - 1)}); break;
      case 1: end = var(Scalar::Index); break;
      default: end = g.idx(in.pick(9)); break;
    }
    // A later range may end where an earlier one is (a triangular nest).
    if (!ranges.empty() && in.pick(4) == 0) end = g.alu(Op::ADD, {ranges[in.pick(ranges.size())], g.idx(1)});
    const UOp* r = g.make(Op::RANGE, dtypes::index, {end}, RangeArg{static_cast<int64_t>(ranges.size()), AxisType::Loop, false});
    ranges.push_back(r);
    return r;
  }

  const UOp* load(Scalar t) {
    const UOp* p = nullptr;
    for (size_t i = 2; i < params.size(); ++i)
      if (params[i]->dtype().scalar == t && in.coin()) p = params[i];
    if (!p) {
      int64_t slot = static_cast<int64_t>(params.size());
      p = g.make(Op::PARAM, DType{t}.ptr_to(AddrSpace::Global, 4), {}, ParamArg{slot, 4});
      params.push_back(p);
    }
    const UOp* at = g.idx(in.pick(4));
    return g.make(Op::LOAD, DType{t}, {p, g.make(Op::INDEX, DType{t}, {p, at})});
  }

  const UOp* cast_to(const UOp* x, Scalar t) { return x->dtype().scalar == t ? x : g.make(Op::CAST, DType{t}, {x}); }

  const UOp* leaf(Scalar t) {
    switch (in.pick(6)) {
      case 0: case 1: return cnst(t);
      case 2: return load(t);
      case 3: return var(t);
      case 4: return cast_to(range(), t);
      default: return cast_to(load(kInts[in.pick(std::size(kInts))]), t);
    }
  }

  const UOp* expr(Scalar t, int depth) {
    if (depth <= 0 || in.pick(4) == 0) return leaf(t);
    static constexpr Op kOps[] = {Op::ADD, Op::SUB, Op::MUL, Op::IDIV, Op::MOD, Op::SHL, Op::SHR,
                                  Op::AND, Op::MAX, Op::MIN, Op::ADD, Op::MUL, Op::SUB};
    switch (in.pick(16)) {
      case 13: return cast_to(expr(kInts[in.pick(std::size(kInts))], depth - 1), t);
      case 14: return g.alu(Op::WHERE, {cond(depth - 1), expr(t, depth - 1), expr(t, depth - 1)});
      case 15: return g.make(Op::NEG, DType{t}, {expr(t, depth - 1)});
      default: {
        Op op = kOps[in.pick(std::size(kOps))];
        const UOp* a = expr(t, depth - 1);
        const UOp* b = in.coin() ? cnst(t) : expr(t, depth - 1);
        return g.alu(op, {a, b});
      }
    }
  }

  // A condition: comparisons of expressions of one dtype, some joined with AND.
  const UOp* cond(int depth) {
    if (depth > 0 && in.pick(3) == 0) return g.alu(Op::AND, {cond(depth - 1), cond(depth - 1)});
    Scalar t = kInts[in.pick(std::size(kInts))];
    const UOp* a = expr(t, depth);
    const UOp* b = in.coin() ? cnst(t) : expr(t, depth);
    if (in.coin()) std::swap(a, b);
    return g.alu(in.pick(4) == 0 ? Op::CMPNE : Op::CMPLT, {a, b});
  }
};

// The kernel the bytes describe: out[0] = data[idx] (under gate), or data[idx] = out[0]
// (under gate), for every value of the ranges the access reads.
const UOp* make_kernel(Bytes& in, Graph& g) {
  static constexpr int64_t kSizes[] = {1, 3, 4, 16, 100};
  const int64_t size = kSizes[in.pick(std::size(kSizes))];
  Gen gen{in, g};
  gen.params.push_back(g.make(Op::PARAM, dtypes::float32.ptr_to(AddrSpace::Global, 1), {}, ParamArg{0, 1}));
  gen.params.push_back(g.make(Op::PARAM, dtypes::float32.ptr_to(AddrSpace::Global, size), {}, ParamArg{1, size}));
  const UOp* data = gen.params[1];
  const int depth = 1 + static_cast<int>(in.pick(3));
  // The index: mostly of index dtype, around a loop index (affine or not), sometimes a
  // cast of any integer expression.
  const UOp* idx;
  switch (in.pick(3)) {
    case 0: idx = gen.cast_to(gen.expr(kInts[in.pick(std::size(kInts))], depth), Scalar::Index); break;
    case 1: idx = g.alu(Op::ADD, {g.alu(Op::MUL, {gen.range(), gen.cnst(Scalar::Index)}), gen.expr(Scalar::Index, depth)}); break;
    default: idx = gen.expr(Scalar::Index, depth); break;
  }
  const UOp* gate = in.pick(4) != 0 ? gen.cond(depth) : nullptr;
  std::vector<const UOp*> at{data, idx};
  if (gate) at.push_back(gate);
  const UOp* index = g.make(Op::INDEX, dtypes::float32, at);
  // Ranges the access reads, outermost first, closed by the STORE.
  std::vector<const UOp*> closes;
  for (const UOp* u : toposort(index))
    if (u->op() == Op::RANGE) closes.push_back(u);
  std::sort(closes.begin(), closes.end(),
            [](const UOp* a, const UOp* b) { return a->arg_as<RangeArg>().axis_id < b->arg_as<RangeArg>().axis_id; });
  std::vector<const UOp*> st;
  if (in.coin()) {
    const UOp* ld = gate ? g.make(Op::LOAD, dtypes::float32, {data, index, g.cnst(dtypes::float32, 0.0)})
                         : g.make(Op::LOAD, dtypes::float32, {data, index});
    st = {g.make(Op::INDEX, dtypes::float32, {gen.params[0], g.idx(0)}), ld};
  } else {
    st = {index, g.make(Op::LOAD, dtypes::float32, {gen.params[0], g.make(Op::INDEX, dtypes::float32, {gen.params[0], g.idx(0)})})};
  }
  st.insert(st.end(), closes.begin(), closes.end());
  const UOp* store = g.make(Op::STORE, dtypes::void_, st);
  return g.make(Op::SINK, dtypes::void_, {store}, KernelInfoArg{true, "fuzz"});
}

// --- the oracle: one access evaluated at many points ------------------------------------

int64_t buffer_size(const UOp* b) {
  switch (b->op()) {
    case Op::PARAM: return b->arg_as<ParamArg>().size;
    case Op::DEFINE_REG: return b->arg_as<DefineRegArg>().size;
    case Op::DEFINE_LOCAL: return b->dtype().size;
    case Op::AFTER: return buffer_size(b->src(0));
    default: return -1;
  }
}

struct Stats {
  uint64_t kernels = 0, accepted = 0, accesses = 0, points = 0, executed = 0;
} stats;

// The values an access's index and gate are computed from, in evaluation order, as a
// small program over positions; free inputs (LOAD values, DEFINE_VARs, RANGE / SPECIAL
// values) are chosen per point.
class Access {
 public:
  UOP_NOT_COVERED Access(const UOp* index, const std::vector<ConstValue>& constants) : index_(index) {
    const size_t n = index->num_src();
    gate_ = n > 2 && index->src(n - 1)->dtype().is_bool() ? index->src(n - 1) : nullptr;
    idx_ = index->src(1);
    const UOp* buf = index->src(0);
    size_ = buffer_size(buf);
    const UOp* base = buf;
    while (base->op() == Op::AFTER) base = base->src(0);
    uint32_t elem = base->dtype().ptr ? base->dtype().count : 1;
    width_ = std::max<int64_t>(index->dtype().count / std::max<uint32_t>(elem, 1), 1);
    // The cone over values, sources first; a LOAD is an input (its index is not followed).
    std::vector<const UOp*> stack{idx_}, post;
    if (gate_) stack.push_back(gate_);
    absl::flat_hash_map<const UOp*, bool> state;  // false: entered, true: done
    while (!stack.empty()) {
      const UOp* u = stack.back();
      auto it = state.find(u);
      if (it != state.end()) {
        if (!it->second) {
          it->second = true;
          post.push_back(u);
        }
        stack.pop_back();
        continue;
      }
      state[u] = false;
      for (const UOp* s : deps(u))
        if (!state.contains(s)) stack.push_back(s);
    }
    for (const UOp* u : post) {
      pos_[u] = nodes_.size();
      nodes_.push_back(u);
      lanes_.push_back(u->dtype().count);
    }
    ok_ = std::all_of(nodes_.begin(), nodes_.end(), [](const UOp* u) { return known(u); });
    for (const UOp* u : nodes_) {
      if (!is_input(u)) continue;
      std::vector<ConstValue> c;
      if (u->op() == Op::DEFINE_VAR) {
        using i128 = __int128;
        const auto& a = u->arg_as<DefineVarArg>();
        std::vector<i128> v = {a.min, i128{a.min} + 1, i128{a.max} - 1, a.max, a.min + (i128{a.max} - a.min) / 2};
        for (const ConstValue& k : constants)
          for (int d : {-1, 0, 1}) v.push_back(i128{k.to_int()} + d);
        for (i128 x : v)
          if (x >= a.min && x <= a.max) c.push_back(ConstValue::Int(static_cast<int64_t>(x)));
      } else if (u->op() == Op::LOAD) {
        // Loaded values wrap into their dtype: the constants, their negations and
        // neighbours, modulo 2^bits.
        c = edge_values(u->dtype().scalar);
        for (const ConstValue& k : constants)
          for (uint64_t d : {~uint64_t{0}, uint64_t{0}, uint64_t{1}})
            for (uint64_t x : {k.bits() + d, d - k.bits()}) c.push_back(cast_value(ConstValue::UInt(x), u->dtype().scalar));
      }
      std::sort(c.begin(), c.end(), [](ConstValue a, ConstValue b) { return a.bits() < b.bits(); });
      c.erase(std::unique(c.begin(), c.end()), c.end());
      choices_[u] = std::move(c);
    }
  }

  bool evaluable() const { return ok_ && size_ >= 0; }

  // Checks `points` points (all of them when there are fewer), aborting on a violation.
  UOP_NOT_COVERED void check(uint64_t seed, int points, const UOp* kernel) {
    // Per input: how many choices (a loop index: 7 positions in its range).
    std::vector<size_t> radix;
    uint64_t product = 1;
    for (const UOp* u : nodes_) {
      if (!is_input(u)) continue;
      size_t k = is_loop(u) ? 7 : std::max<size_t>(choices_.at(u).size(), 1);
      radix.push_back(k);
      product = product > uint64_t{1} << 40 ? product : product * k;
    }
    const bool exhaustive = product <= static_cast<uint64_t>(points);
    const uint64_t count = exhaustive ? product : static_cast<uint64_t>(points);
    std::mt19937_64 rng(seed);
    std::vector<size_t> pick(radix.size());
    std::vector<std::vector<ConstValue>> val(nodes_.size());
    for (uint64_t p = 0; p < count; ++p) {
      uint64_t rest = p;
      for (size_t i = 0; i < radix.size(); ++i) {
        pick[i] = exhaustive ? rest % radix[i] : rng() % radix[i];
        rest /= radix[i];
      }
      ++stats.points;
      if (!evaluate(pick, rng, val)) continue;  // the access does not execute there
      ++stats.executed;
      int64_t at = val[pos_.at(idx_)][0].to_int();
      const std::vector<ConstValue>* gate = gate_ ? &val[pos_.at(gate_)] : nullptr;
      for (int64_t lane = 0; lane < width_; ++lane) {
        // A per-lane gate says which elements are touched; a scalar one, all or none.
        bool on = !gate || (*gate)[std::min<size_t>(gate->size() == 1 ? 0 : lane, gate->size() - 1)].as_bool();
        if (on && (at < 0 || at > size_ - 1 - lane)) fail(kernel, at, lane, val);
      }
    }
  }

 private:
  static bool is_loop(const UOp* u) { return u->op() == Op::RANGE || u->op() == Op::SPECIAL; }
  static bool is_input(const UOp* u) { return is_loop(u) || u->op() == Op::DEFINE_VAR || u->op() == Op::LOAD; }
  static bool known(const UOp* u) {
    Op op = u->op();
    return is_input(u) || op == Op::CONST || op == Op::VCONST || op == Op::CAST || op == Op::BITCAST ||
           op == Op::VECTORIZE || op == Op::GEP || op == Op::BIND || is_alu(op);
  }
  // What a node's value is computed from: nothing for an input but a loop's end.
  static std::span<const UOp* const> deps(const UOp* u) {
    if (is_loop(u)) return u->src().subspan(0, 1);
    if (is_input(u) || u->op() == Op::BIND) return {};
    return u->src();
  }

  // Values of every node at the point `pick`; false where the access does not execute (a
  // loop index outside its loop, which is then empty).
  UOP_NOT_COVERED bool evaluate(const std::vector<size_t>& pick, std::mt19937_64& rng, std::vector<std::vector<ConstValue>>& val) {
    size_t input = 0;
    std::vector<ConstValue> args;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const UOp* u = nodes_[i];
      std::vector<ConstValue>& out = val[i];
      out.assign(lanes_[i], ConstValue());
      const Op op = u->op();
      if (is_loop(u)) {
        int64_t end = val[pos_.at(u->src(0))][0].to_int();
        if (end < 1) return false;
        size_t k = pick[input++];
        int64_t v = k < 3 ? static_cast<int64_t>(k) : k < 6 ? end - 1 - static_cast<int64_t>(k - 3)
                                                            : static_cast<int64_t>(rng() % static_cast<uint64_t>(end));
        out[0] = ConstValue::Int(std::clamp<int64_t>(v, 0, end - 1));
      } else if (is_input(u)) {
        const auto& c = choices_.at(u);
        size_t k = pick[input++];
        for (auto& lane : out) lane = c.empty() ? cast_value(ConstValue::Int(0), u->dtype().scalar) : c[k % c.size()];
      } else if (op == Op::CONST) {
        out[0] = *u->const_value();
      } else if (op == Op::VCONST) {
        const auto& v = u->arg_as<VConstArg>().values;
        for (size_t l = 0; l < out.size() && l < v.size(); ++l) out[l] = v[l];
      } else if (op == Op::BIND) {
        out[0] = *u->src(1)->const_value();
      } else if (op == Op::VECTORIZE) {
        for (size_t l = 0; l < out.size(); ++l) out[l] = val[pos_.at(u->src(l))][0];
      } else if (op == Op::GEP) {
        const auto& src = val[pos_.at(u->src(0))];
        const auto& lanes = u->arg_as<IntsArg>().values;
        for (size_t l = 0; l < out.size() && l < lanes.size(); ++l) out[l] = src.at(lanes[l]);
      } else {
        for (size_t l = 0; l < out.size(); ++l) {
          auto lane = [&](const UOp* s) {
            const auto& v = val[pos_.at(s)];
            return v[v.size() == 1 ? 0 : l];
          };
          std::optional<ConstValue> r;
          if (op == Op::CAST) r = cast_value(lane(u->src(0)), u->dtype().scalar);
          else if (op == Op::BITCAST) r = bitcast_value(lane(u->src(0)), u->src(0)->dtype().scalar, u->dtype().scalar);
          else {
            args.clear();
            for (const UOp* s : u->src()) args.push_back(lane(s));
            r = eval_alu(op, u->src(op == Op::WHERE ? 1 : 0)->dtype().scalar, args);
          }
          if (!r) {
            std::fprintf(stderr, "fuzz_bounds: eval.h does not define %s on the verified kernel\n", print_node(u).c_str());
            std::abort();
          }
          out[l] = *r;
        }
      }
    }
    return true;
  }

  [[noreturn]] void fail(const UOp* kernel, int64_t at, int64_t lane, const std::vector<std::vector<ConstValue>>& val) {
    const NodeIndex ix = index_by_toposort(kernel);
    std::fprintf(stderr, "fuzz_bounds: the proof accepted an access outside its buffer\n%s\nindex %lld (lane %lld) of %lld elements at:\n",
                 print_node(index_, &ix).c_str(), static_cast<long long>(at), static_cast<long long>(lane),
                 static_cast<long long>(size_));
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (is_input(nodes_[i]))
        std::fprintf(stderr, "  %s = %s\n", print_node(nodes_[i], &ix).c_str(), val[i].empty() ? "?" : val[i][0].str().c_str());
    std::fprintf(stderr, "kernel as proven:\n%s\n", print_tree(kernel).c_str());
    std::abort();
  }

  const UOp* index_;
  const UOp* idx_ = nullptr;
  const UOp* gate_ = nullptr;
  int64_t size_ = -1, width_ = 1;
  bool ok_ = false;
  std::vector<const UOp*> nodes_;
  std::vector<uint32_t> lanes_;
  absl::flat_hash_map<const UOp*, size_t> pos_;
  absl::flat_hash_map<const UOp*, std::vector<ConstValue>> choices_;
};

// Every access of a proven kernel, at up to `points` points each.
UOP_NOT_COVERED void check_kernel(const UOp* kernel, uint64_t seed, int points) {
  std::vector<ConstValue> constants;
  for (const UOp* u : toposort(kernel))
    if (const ConstValue* c = u->const_value(); c && c->kind() != ConstValue::Kind::Float) constants.push_back(*c);
  if (constants.size() > 24) constants.resize(24);
  for (const UOp* u : toposort(kernel)) {
    if (u->op() != Op::INDEX || buffer_size(u->src(0)) < 0) continue;
    Access a(u, constants);
    if (!a.evaluable()) continue;
    ++stats.accesses;
    a.check(seed++, points, kernel);
  }
}

uint64_t hash_bytes(const uint8_t* d, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ d[i]) * 1099511628211ull;
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  Bytes in(data, size);
  const bool gpu = in.byte() & 1;
  Graph g;
  const UOp* kernel = make_kernel(in, g);
  ++stats.kernels;
  auto plan = plan_graph(g, kernel);
  if (!plan.ok()) return 0;
  for (const KernelPlan& k : plan->kernels) {
    const UOp* proven = nullptr;
    PipelineOptions opts;
    opts.trace = [&](std::string_view stage, std::string_view, const UOp* ir) {
      if (stage == "bounds") proven = ir;
    };
    auto linear = gpu ? CudaBackend(CudaTarget{}).lower(g, k.kernel, opts, k.name) : host_cpu_backend()->lower(g, k.kernel, opts, k.name);
    if (!linear.ok()) {
      if (linear.status().message().empty()) {
        std::fprintf(stderr, "fuzz_bounds: a refusal without a message\n");
        std::abort();
      }
      continue;
    }
    if (!proven) {
      std::fprintf(stderr, "fuzz_bounds: a kernel was linearized without the bounds stage\n");
      std::abort();
    }
    ++stats.accepted;
    check_kernel(proven, hash_bytes(data, size), 512);
  }
  return 0;
}

#ifdef UOPD_FUZZ_REPLAY
// The bounded replay: `count` inputs from a fixed seed, or (--write-seeds DIR) a few of
// them written as the libFuzzer target's seed corpus.
#include <filesystem>
#include <fstream>

int main(int argc, char** argv) {
  const bool write = argc == 3 && std::string(argv[1]) == "--write-seeds";
  if (argc != 2 && !write) {
    std::fprintf(stderr, "usage: %s COUNT\n       %s --write-seeds DIR\n", argv[0], argv[0]);
    return 2;
  }
  const int count = write ? 64 : std::atoi(argv[1]);
  std::mt19937_64 rng(20250214);  // fixed: the same inputs every run
  for (int i = 0; i < count; ++i) {
    std::string input(16 + rng() % 112, '\0');
    for (char& c : input) c = static_cast<char>(rng());
    if (write) {
      std::filesystem::create_directories(argv[2]);
      std::ofstream(std::filesystem::path(argv[2]) / ("seed" + std::to_string(i)), std::ios::binary) << input;
      continue;
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  }
  if (!write)
    std::printf("fuzz_bounds: %llu kernels, %llu proven, %llu accesses checked at %llu points (%llu where they execute)\n",
                static_cast<unsigned long long>(stats.kernels), static_cast<unsigned long long>(stats.accepted),
                static_cast<unsigned long long>(stats.accesses), static_cast<unsigned long long>(stats.points),
                static_cast<unsigned long long>(stats.executed));
  return 0;
}
#endif
