// Test helpers for the CPU backend: a builder of LINEAR graphs by hand (each op made with
// Graph::make and listed once, in the order it is made), typed host buffers that hold
// values in eval.h's memory form, and compile + load in one call.
#pragma once

#include <algorithm>

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "compiler/codegen/llvm_cpu.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/uop.h"
#include "worker/cpu/cpu_program.h"

namespace uop::testing {

class LinearBuilder {
 public:
  Graph g;

  const UOp* add(const UOp* u) {
    if (seen_.insert(u).second) ops_.push_back(u);
    return u;
  }
  const UOp* make(Op op, DType d, std::initializer_list<const UOp*> src) { return add(g.make(op, d, src)); }
  const UOp* make(Op op, DType d, std::span<const UOp* const> src, Arg arg) { return add(g.make(op, d, src, std::move(arg))); }

  const UOp* param(int64_t slot, DType elem, int64_t size) {
    return add(g.make(Op::PARAM, elem.ptr_to(AddrSpace::Global, size), {}, ParamArg{slot, size}));
  }
  const UOp* var(std::string name, int64_t min, int64_t max) {
    return add(g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{std::move(name), min, max}));
  }
  const UOp* reg(DType elem, int64_t size, int64_t id = 0) {
    return add(g.make(Op::DEFINE_REG, elem.ptr_to(AddrSpace::Reg, size), {}, DefineRegArg{size, id}));
  }
  const UOp* cnst(DType d, ConstValue v) { return add(g.make(Op::CONST, d, {}, v)); }
  const UOp* idx(int64_t v) { return add(g.idx(v)); }
  const UOp* f32(double v) { return add(g.cnst(dtypes::float32, v)); }
  const UOp* alu(Op op, std::initializer_list<const UOp*> src) { return add(g.alu(op, src)); }
  const UOp* cast(const UOp* x, DType to) { return make(Op::CAST, to, {x}); }
  const UOp* range(const UOp* end, int64_t axis, AxisType type = AxisType::Loop) {
    return add(g.make(Op::RANGE, dtypes::index, {end}, RangeArg{axis, type, true}));
  }
  const UOp* end(const UOp* x, const UOp* r) { return make(Op::END, dtypes::void_, {x, r}); }
  const UOp* index(const UOp* buf, const UOp* i, const UOp* gate = nullptr) {
    if (gate) return make(Op::INDEX, buf->dtype().pointee(), {buf, i, gate});
    return make(Op::INDEX, buf->dtype().pointee(), {buf, i});
  }
  // A LOAD or STORE of d.count elements reads or writes that many consecutive ones from
  // its INDEX, which then has that dtype (the verifier's [index.dtype]): the INDEX made
  // for one element is retyped in place.
  const UOp* load(const UOp* buf, const UOp* index, DType d, const UOp* alt = nullptr) {
    index = retype(index, d);
    if (alt) return make(Op::LOAD, d, {buf, index, alt});
    return make(Op::LOAD, d, {buf, index});
  }
  const UOp* load(const UOp* buf, const UOp* index) { return load(buf, index, index->dtype()); }
  const UOp* store(const UOp* index, const UOp* value) {
    return make(Op::STORE, dtypes::void_, {retype(index, value->dtype()), value});
  }
  const UOp* after(const UOp* x, std::initializer_list<const UOp*> deps) {
    std::vector<const UOp*> src{x};
    src.insert(src.end(), deps.begin(), deps.end());
    return add(g.make(Op::AFTER, x->dtype(), src));
  }
  const UOp* linear() { return g.make(Op::LINEAR, dtypes::void_, ops_); }

 private:
  const UOp* retype(const UOp* index, DType d) {
    if (!index->is(Op::INDEX) || index->dtype() == d) return index;
    const UOp* wide = g.replace_dtype(index, d);
    auto at = std::find(ops_.begin(), ops_.end(), index);
    if (at != ops_.end() && !seen_.contains(wide)) {
      *at = wide;
      seen_.erase(index);
      seen_.insert(wide);
    }
    return wide;
  }

  std::vector<const UOp*> ops_;
  absl::flat_hash_set<const UOp*> seen_;
};

// Host memory for one buffer, in the memory form eval.h defines (value_to_bits).
class HostBuffer {
 public:
  HostBuffer(Scalar s, size_t n) : s_(s), n_(n), bytes_(n * scalar_bytes(s) + 64, 0) {}
  void set(size_t i, ConstValue v) { set_bits(i, value_to_bits(cast_value(v, s_), s_)); }
  void set_bits(size_t i, uint64_t bits) { std::memcpy(ptr(i), &bits, scalar_bytes(s_)); }
  uint64_t bits(size_t i) const {
    uint64_t b = 0;
    std::memcpy(&b, bytes_.data() + i * scalar_bytes(s_), scalar_bytes(s_));
    return b;
  }
  ConstValue get(size_t i) const { return bits_to_value(bits(i), s_); }
  void* data() { return bytes_.data(); }
  size_t size() const { return n_; }
  Scalar scalar() const { return s_; }

 private:
  uint8_t* ptr(size_t i) { return bytes_.data() + i * scalar_bytes(s_); }
  Scalar s_;
  size_t n_;
  std::vector<uint8_t> bytes_;
};

// Equal as eval.h defines results: bit for bit, except that any NaN equals any NaN.
inline bool same_value(ConstValue got, ConstValue want) {
  if (got.kind() == ConstValue::Kind::Float && want.kind() == ConstValue::Kind::Float &&
      got.as_float() != got.as_float() && want.as_float() != want.as_float())
    return true;
  return got == want;
}

// `bytes` bytes of memory that end exactly where an inaccessible page begins: any read
// or write past the end faults.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) {
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t pages = (bytes + page - 1) / page + 1;
    len_ = pages * page;
    base_ = static_cast<char*>(mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    mprotect(base_ + len_ - page, page, PROT_NONE);
    data_ = base_ + len_ - page - bytes;
  }
  ~GuardedBuffer() { munmap(base_, len_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  void* data() { return data_; }

 private:
  char* base_;
  char* data_;
  size_t len_;
};

// Operand values worth testing for a scalar type: edges (zero, signs, limits, widths for
// shifts, subnormals, infinities, NaN, midpoints of narrow formats) and random bits.
inline std::vector<ConstValue> interesting_values(Scalar s, int random_count, uint64_t seed = 1) {
  std::vector<ConstValue> v;
  std::mt19937_64 rng(seed + static_cast<uint64_t>(s));
  int nb = scalar_bits(s);
  if (s == Scalar::Bool) return {ConstValue::Bool(false), ConstValue::Bool(true)};
  if (scalar_is_float(s)) {
    const double inf = INFINITY, nan = std::numeric_limits<double>::quiet_NaN();
    for (double d : {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 1.0 / 3, 7.0, 37.0, 259.0, 683.0,
                     2049.0, 100.5, -7.25, 65504.0, 65519.0, 65520.0, -65520.0, 1e-8, -6e-8,
                     std::ldexp(1.0, -24), std::ldexp(1.0, -14), std::ldexp(1.0, -126), std::ldexp(1.0, -133),
                     std::ldexp(1.0, -149), std::ldexp(1.0, -100), -std::ldexp(1.0, -100), 1e30, -1e30, 3.4e38,
                     3.4028234663852886e38, 1.7976931348623157e308, 2.2250738585072014e-308, 4.9e-324,
                     16777217.0, 9007199254740993.0, inf, -inf, nan})
      v.push_back(cast_value(ConstValue::Float(d), s));
    std::uniform_real_distribution<double> u(-1000, 1000);
    for (int i = 0; i < random_count; ++i) {
      if (i % 2) v.push_back(cast_value(ConstValue::Float(u(rng)), s));
      else v.push_back(bits_to_value(rng(), s));
    }
    return v;
  }
  bool sgn = scalar_is_signed_int(s);
  int64_t lo = sgn ? (nb == 64 ? INT64_MIN : -(int64_t{1} << (nb - 1))) : 0;
  const uint64_t l = static_cast<uint64_t>(lo);
  for (uint64_t x : std::initializer_list<uint64_t>{0ull, 1ull, ~0ull, 2ull, ~1ull, 3ull, ~2ull, 5ull, ~6ull, 7ull, uint64_t(nb - 1), uint64_t(nb),
                     uint64_t(nb + 1), uint64_t(2 * nb + 3), 0ull - nb, l, l + 1, l - 1, l - 2, 100ull, 0ull - 100,
                     1ull << (nb - 1), 65520ull, 16777217ull, (1ull << 62) + (1ull << 54) + 1})
    v.push_back(cast_value(sgn ? ConstValue::Int(static_cast<int64_t>(x)) : ConstValue::UInt(x), s));
  for (int i = 0; i < random_count; ++i) {
    uint64_t r = rng();
    if (i % 3 == 1) r >>= (rng() % 64);  // smaller magnitudes too
    v.push_back(bits_to_value(r, s));
  }
  return v;
}

// Distance in units in the last place between two values of a float type; 0 for two
// NaNs, huge for a NaN and a number.
inline uint64_t ulp_distance(ConstValue a, ConstValue b, Scalar s) {
  uint64_t x = value_to_bits(a, s), y = value_to_bits(b, s);
  double da = a.as_float(), db = b.as_float();
  if (da != da || db != db) return (da != da && db != db) ? 0 : UINT64_MAX;
  int nb = scalar_bits(s);
  uint64_t sign = uint64_t{1} << (nb - 1);
  auto ord = [&](uint64_t bits) {
    int64_t mag = static_cast<int64_t>(bits & (sign - 1));
    return (bits & sign) ? -mag : mag;
  };
  int64_t d = ord(x) - ord(y);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

inline std::unique_ptr<CpuProgram> build(const UOp* linear, CpuCompileOptions opts = {}) {
  auto art = compile_cpu(linear, CpuTarget::host(), opts);
  EXPECT_TRUE(art.ok()) << art.status();
  if (!art.ok()) return nullptr;
  auto prog = CpuProgram::load(art->object, art->abi);
  EXPECT_TRUE(prog.ok()) << prog.status();
  return prog.ok() ? *std::move(prog) : nullptr;
}

// A kernel that maps input buffers to output buffers element-wise, `width` elements per
// step: each maker builds an output value from the loaded inputs. Returns the outputs.
using Maker = std::function<const UOp*(LinearBuilder&, std::span<const UOp* const>)>;
inline std::vector<HostBuffer> run_map(std::vector<HostBuffer>& ins, const std::vector<std::pair<Scalar, Maker>>& outs,
                                       uint32_t width = 1) {
  const int64_t n = static_cast<int64_t>(ins[0].size());
  EXPECT_EQ(n % width, 0);
  LinearBuilder lb;
  std::vector<const UOp*> in_params, out_params;
  for (size_t k = 0; k < ins.size(); ++k) in_params.push_back(lb.param(k, DType(ins[k].scalar()), n));
  for (size_t k = 0; k < outs.size(); ++k) out_params.push_back(lb.param(ins.size() + k, DType(outs[k].first), n));
  const UOp* r = lb.range(lb.idx(n / width), 0);
  const UOp* i = width == 1 ? r : lb.alu(Op::MUL, {r, lb.idx(width)});
  std::vector<const UOp*> loaded;
  for (size_t k = 0; k < ins.size(); ++k)
    loaded.push_back(lb.load(in_params[k], lb.index(in_params[k], i), DType(ins[k].scalar()).vec(width)));
  const UOp* last = nullptr;
  for (size_t k = 0; k < outs.size(); ++k) last = lb.store(lb.index(out_params[k], i), outs[k].second(lb, loaded));
  lb.end(last, r);
  std::vector<HostBuffer> result;
  for (const auto& o : outs) result.emplace_back(o.first, n);
  auto prog = build(lb.linear());
  if (!prog) return result;
  std::vector<void*> bufs;
  for (auto& b : ins) bufs.push_back(b.data());
  for (auto& b : result) bufs.push_back(b.data());
  auto st = prog->run(bufs, {}, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return result;
}

inline HostBuffer buffer_of(Scalar s, const std::vector<ConstValue>& values) {
  HostBuffer b(s, values.size());
  for (size_t i = 0; i < values.size(); ++i) b.set(i, values[i]);
  return b;
}

}  // namespace uop::testing
