// The LLVM CPU backend against ir/eval.h: every kernel is compiled, loaded, run on real
// buffers, and its results compared with values the test computes with eval_alu /
// cast_value, never with the compiled code itself.
#include "compiler/codegen/llvm_cpu.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>

#include "compiler/support/strings.h"
#include "tests/unit/compiler/codegen/linear_builder.h"

namespace uop {
namespace {

using testing::build;
using testing::buffer_of;
using testing::GuardedBuffer;
using testing::HostBuffer;
using testing::interesting_values;
using testing::LinearBuilder;
using testing::Maker;
using testing::run_map;
using testing::same_value;
using testing::ulp_distance;

constexpr Scalar kAllScalars[] = {Scalar::Bool, Scalar::Int8, Scalar::Int16, Scalar::Int32, Scalar::Int64,
                                  Scalar::UInt8, Scalar::UInt16, Scalar::UInt32, Scalar::UInt64,
                                  Scalar::Float16, Scalar::BFloat16, Scalar::Float32, Scalar::Float64,
                                  Scalar::Index};
constexpr Op kExactOps[] = {Op::NEG, Op::SQRT, Op::RECIPROCAL, Op::TRUNC, Op::ADD, Op::SUB, Op::MUL,
                            Op::FDIV, Op::IDIV, Op::MOD, Op::MAX, Op::MIN, Op::CMPLT, Op::CMPNE,
                            Op::CMPEQ, Op::AND, Op::OR, Op::XOR, Op::SHL, Op::SHR, Op::MULACC};
constexpr Op kTranscendentals[] = {Op::EXP2, Op::LOG2, Op::SIN, Op::POW};

bool defined_on(Op op, Scalar s) {
  ConstValue z[3] = {cast_value(ConstValue::Int(0), s), cast_value(ConstValue::Int(0), s), cast_value(ConstValue::Int(0), s)};
  return eval_alu(op, s, std::span<const ConstValue>(z, op_info(op).min_src)).has_value();
}

// Inputs for an op of `arity` on `s`: every pair of the interesting values for binary
// ops, a smaller cube for ternary ones, padded to a multiple of 8 elements.
std::vector<HostBuffer> operands(Scalar s, int arity) {
  std::vector<std::vector<ConstValue>> cols(arity);
  auto vals = interesting_values(s, arity == 1 ? 300 : arity == 2 ? 30 : 0);
  if (arity == 1) cols[0] = vals;
  if (arity == 2)
    for (auto& a : vals)
      for (auto& b : vals) cols[0].push_back(a), cols[1].push_back(b);
  if (arity == 3) {
    vals.resize(std::min<size_t>(vals.size(), 16));
    for (auto& a : vals)
      for (auto& b : vals)
        for (auto& c : vals) cols[0].push_back(a), cols[1].push_back(b), cols[2].push_back(c);
    // MULACC cases where rounding the sum twice would be wrong (see llvm_cpu_alu.cc).
    for (double c : {std::ldexp(1.0, -100), -std::ldexp(1.0, -100), std::ldexp(1.0, -20), -std::ldexp(1.0, -20)}) {
      for (auto [a, b] : {std::pair{7.0, 37.0}, std::pair{3.0, 683.0}}) {
        cols[0].push_back(cast_value(ConstValue::Float(a), s));
        cols[1].push_back(cast_value(ConstValue::Float(b), s));
        cols[2].push_back(cast_value(ConstValue::Float(c), s));
      }
    }
  }
  std::vector<HostBuffer> out;
  for (auto& col : cols) {
    while (col.size() % 8) {
      ConstValue again = col[0];  // a copy: push_back may reallocate
      col.push_back(again);
    }
    out.push_back(buffer_of(s, col));
  }
  return out;
}

Maker alu_maker(Op op) {
  return [op](LinearBuilder& lb, std::span<const UOp* const> in) {
    std::vector<const UOp*> src(in.begin(), in.begin() + op_info(op).min_src);
    return lb.add(lb.g.alu(op, src));
  };
}

TEST(LlvmCpu, ElementwiseAddWithATail) {
  constexpr int64_t N = 1003;  // not a multiple of any vector width
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::float32, N);
  const UOp* a = lb.param(1, dtypes::float32, N);
  const UOp* b = lb.param(2, dtypes::float32, N);
  const UOp* r = lb.range(lb.idx(N), 0);
  const UOp* x = lb.load(a, lb.index(a, r));
  const UOp* y = lb.load(b, lb.index(b, r));
  lb.end(lb.store(lb.index(out, r), lb.alu(Op::ADD, {x, y})), r);
  auto art = compile_cpu(lb.linear(), CpuTarget::host(), {.emit_ir_text = true});
  ASSERT_TRUE(art.ok()) << art.status();
  EXPECT_EQ(art->object.substr(0, 4), "\x7f" "ELF");
  EXPECT_NE(art->ir_text.find("define void @uop_kernel(ptr"), std::string::npos);
  EXPECT_EQ(art->entry, "uop_kernel");
  EXPECT_EQ(art->abi.params[0], (KernelParam{0, dtypes::float32, N, false, true}));
  EXPECT_EQ(art->abi.params[1], (KernelParam{1, dtypes::float32, N, true, false}));
  EXPECT_FALSE(art->abi.has_thread_range);
  auto prog = CpuProgram::load(art->object, art->abi);
  ASSERT_TRUE(prog.ok()) << prog.status();
  HostBuffer o(Scalar::Float32, N), av(Scalar::Float32, N), bv(Scalar::Float32, N);
  for (int64_t i = 0; i < N; ++i) {
    av.set(i, ConstValue::Float(i * 0.37 - 50));
    bv.set(i, ConstValue::Float(1.0 / (i + 1)));
  }
  void* bufs[] = {o.data(), av.data(), bv.data()};
  ThreadPool pool(4);  // no Thread range: one task whatever the pool
  ASSERT_TRUE((*prog)->run(bufs, {}, &pool).ok());
  for (int64_t i = 0; i < N; ++i) {
    ConstValue args[] = {av.get(i), bv.get(i)};
    ASSERT_TRUE(same_value(o.get(i), *eval_alu(Op::ADD, Scalar::Float32, args))) << i;
  }
}

// Every source is listed before its use, constants and definitions included: compile_cpu
// verifies the LINEAR first and refuses one that lists them late or not at all.
TEST(LlvmCpu, DefinitionsAreListedBeforeTheirUse) {
  Graph g;
  const UOp* out = g.make(Op::PARAM, dtypes::int32.ptr_to(AddrSpace::Global, 8), {}, ParamArg{0, 8});
  const UOp* n = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"n", 0, 8});
  const UOp* r = g.make(Op::RANGE, dtypes::index, {n}, RangeArg{0, AxisType::Loop, true});
  const UOp* v = g.make(Op::CAST, dtypes::int32, {g.alu(Op::ADD, {r, g.idx(40)})});
  const UOp* st = g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, dtypes::int32, {out, r}), v});
  const UOp* end = g.make(Op::END, dtypes::void_, {st, r});
  std::vector<const UOp*> late = {r, v->src(0), v, st->src(0), st, end, g.idx(40), out};
  auto refused = compile_cpu(g.make(Op::LINEAR, dtypes::void_, late), CpuTarget::host());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("(RANGE): source 0 ([0] DEFINE_VAR) is not listed before it [linear.order]"),
            std::string::npos) << refused.status();
  std::vector<const UOp*> ops = {n, out, g.idx(40), r, v->src(0), v, st->src(0), st, end};
  auto prog = build(g.make(Op::LINEAR, dtypes::void_, ops));
  ASSERT_TRUE(prog);
  std::vector<int32_t> o(8, 0);
  void* bufs[] = {o.data()};
  ASSERT_TRUE(prog->run(bufs, std::array<int64_t, 1>{5}, nullptr).ok());
  EXPECT_EQ(o, (std::vector<int32_t>{40, 41, 42, 43, 44, 0, 0, 0}));
}

// Every exact ALU op on every dtype it is defined on, scalar and <4 x T>, bit-exact.
class AluTest : public ::testing::TestWithParam<std::tuple<Scalar, uint32_t>> {};

TEST_P(AluTest, MatchesEval) {
  auto [s, width] = GetParam();
  for (int arity = 1; arity <= 3; ++arity) {
    std::vector<Op> ops;
    std::vector<std::pair<Scalar, Maker>> outs;
    for (Op op : kExactOps)
      if (op_info(op).min_src == arity && defined_on(op, s)) {
        ops.push_back(op);
        outs.push_back({is_comparison(op) ? Scalar::Bool : s, alu_maker(op)});
      }
    if (ops.empty()) continue;
    auto ins = operands(s, arity);
    auto got = run_map(ins, outs, width);
    ASSERT_EQ(got.size(), ops.size());
    for (size_t k = 0; k < ops.size(); ++k) {
      int bad = 0;
      for (size_t i = 0; i < ins[0].size() && bad < 5; ++i) {
        std::vector<ConstValue> args;
        for (auto& in : ins) args.push_back(in.get(i));
        ConstValue want = *eval_alu(ops[k], s, args);
        if (!same_value(got[k].get(i), want)) {
          ++bad;
          ADD_FAILURE() << op_name(ops[k]) << " on " << scalar_name(s) << " x" << width << " (" << args[0].str()
                        << (args.size() > 1 ? ", " + args[1].str() : "") << (args.size() > 2 ? ", " + args[2].str() : "")
                        << "): got " << got[k].get(i).str() << ", eval.h says " << want.str();
        }
      }
    }
  }
}

TEST_P(AluTest, WhereMatchesEval) {
  auto [s, width] = GetParam();
  auto vals = operands(s, 2);
  std::vector<ConstValue> cond;
  for (size_t i = 0; i < vals[0].size(); ++i) cond.push_back(ConstValue::Bool(i % 3 == 0));
  std::vector<HostBuffer> ins;
  ins.push_back(buffer_of(Scalar::Bool, cond));
  ins.push_back(std::move(vals[0]));
  ins.push_back(std::move(vals[1]));
  auto got = run_map(ins, {{s, alu_maker(Op::WHERE)}}, width);
  for (size_t i = 0; i < ins[0].size(); ++i) {
    ConstValue args[] = {ins[0].get(i), ins[1].get(i), ins[2].get(i)};
    ASSERT_TRUE(same_value(got[0].get(i), *eval_alu(Op::WHERE, s, args))) << i;
  }
}

TEST_P(AluTest, CastsToEveryDtype) {
  auto [from, width] = GetParam();
  std::vector<HostBuffer> ins;
  ins.push_back(operands(from, 1)[0]);
  std::vector<std::pair<Scalar, Maker>> outs;
  for (Scalar to : kAllScalars)
    outs.push_back({to, [to](LinearBuilder& lb, std::span<const UOp* const> in) {
                      return lb.cast(in[0], DType(to, in[0]->dtype().count));
                    }});
  auto got = run_map(ins, outs, width);
  for (size_t k = 0; k < outs.size(); ++k) {
    Scalar to = outs[k].first;
    int bad = 0;
    for (size_t i = 0; i < ins[0].size() && bad < 5; ++i) {
      ConstValue want = cast_value(ins[0].get(i), to);
      if (!same_value(got[k].get(i), want))
        ++bad, ADD_FAILURE() << "CAST " << scalar_name(from) << " -> " << scalar_name(to) << " x" << width << " of "
                             << ins[0].get(i).str() << ": got " << got[k].get(i).str() << ", eval.h says " << want.str();
    }
  }
}

// EXP2, LOG2, SIN, POW call libm; llvm_cpu.h documents their error against eval.h.
class TranscendentalTest : public ::testing::TestWithParam<std::tuple<Scalar, uint32_t>> {};

TEST_P(TranscendentalTest, WithinDocumentedUlps) {
  auto [s, width] = GetParam();
  const uint64_t bound = 1;  // llvm_cpu.h's table: 1 ULP for every op and float dtype
  std::vector<ConstValue> x, y;
  for (int i = -300; i <= 300; ++i) {
    x.push_back(cast_value(ConstValue::Float(i * 0.173), s));
    y.push_back(cast_value(ConstValue::Float((i % 23) * 0.37 - 3), s));
  }
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> mag(-30, 30), expo(-12, 12), lin(-200, 200);
  for (int i = 0; i < 3000; ++i) {
    double xv = i % 2 ? lin(rng) : std::exp(mag(rng)) * (i % 4 == 0 ? -1 : 1);
    x.push_back(cast_value(ConstValue::Float(xv), s));
    y.push_back(cast_value(ConstValue::Float(i % 3 ? expo(rng) : std::round(expo(rng))), s));
  }
  for (double d : std::initializer_list<double>{0.0, -0.0, 1e-30, 1e-6, 1e6, 65504.0, 1e30, 1e300, INFINITY, -INFINITY, NAN, 0.5, 2.0, -2.0, 128.0, -150.0})
    x.push_back(cast_value(ConstValue::Float(d), s)), y.push_back(cast_value(ConstValue::Float(d / 3 + 0.25), s));
  while (x.size() % 8) {
    ConstValue x0 = x[0], y0 = y[0];
    x.push_back(x0), y.push_back(y0);
  }
  std::vector<HostBuffer> ins;
  ins.push_back(buffer_of(s, x));
  ins.push_back(buffer_of(s, y));
  std::vector<std::pair<Scalar, Maker>> outs;
  for (Op op : kTranscendentals) outs.push_back({s, alu_maker(op)});
  auto got = run_map(ins, outs, width);
  for (size_t k = 0; k < outs.size(); ++k) {
    uint64_t worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ConstValue args[] = {x[i], y[i]};
      ConstValue want = *eval_alu(kTranscendentals[k], s, std::span<const ConstValue>(args, op_info(kTranscendentals[k]).min_src));
      uint64_t d = ulp_distance(got[k].get(i), want, s);
      worst = std::max(worst, d);
      EXPECT_LE(d, bound) << op_name(kTranscendentals[k]) << " on " << scalar_name(s) << " of " << x[i].str() << ", "
                          << y[i].str() << ": got " << got[k].get(i).str() << ", eval.h says " << want.str();
    }
    RecordProperty(std::string(op_name(kTranscendentals[k])) + "_max_ulp", static_cast<int>(worst));
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Scalar, uint32_t>>& info) {
  return std::string(scalar_name(std::get<0>(info.param))) + "_x" + std::to_string(std::get<1>(info.param));
}
INSTANTIATE_TEST_SUITE_P(AllDtypes, AluTest, ::testing::Combine(::testing::ValuesIn(kAllScalars), ::testing::Values(1u, 4u)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(FloatDtypes, TranscendentalTest,
                         ::testing::Combine(::testing::Values(Scalar::Float16, Scalar::BFloat16, Scalar::Float32, Scalar::Float64),
                                            ::testing::Values(1u, 4u)),
                         param_name);

// EXP2 below float64 is vector code computed in float64 (llvm_cpu_alu.cc, exp2_narrow):
// over a dense sweep of float32 inputs, from where 2^x is 0 through the subnormals to
// where it overflows, and over every float16 and bfloat16 value, it rounds as eval.h
// does (libm's double exp2 rounded once), at most a handful of ties within 1 ULP.
TEST(LlvmCpu, VectorExp2RoundsAsEvalDoes) {
  for (Scalar s : {Scalar::Float32, Scalar::Float16, Scalar::BFloat16}) {
    std::vector<ConstValue> x;
    if (s == Scalar::Float32) {
      std::mt19937_64 rng(5);
      std::uniform_real_distribution<double> wide(-152, 130), near(-1, 1);
      for (int i = 0; i < 1 << 17; ++i) x.push_back(cast_value(ConstValue::Float(i % 4 ? wide(rng) : near(rng)), s));
      for (int i = -1600; i <= 1300; ++i) x.push_back(cast_value(ConstValue::Float(i / 10.0), s));
    } else {
      for (uint32_t bits = 0; bits < 1u << 16; ++bits) x.push_back(*bitcast_value(ConstValue::Int(bits), Scalar::UInt16, s));
    }
    while (x.size() % 16) x.push_back(x[0]);
    std::vector<HostBuffer> ins;
    ins.push_back(buffer_of(s, x));
    auto got = run_map(ins, {{s, alu_maker(Op::EXP2)}}, 16);
    size_t inexact = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ConstValue args[] = {x[i]};
      ConstValue want = *eval_alu(Op::EXP2, s, args);
      const uint64_t d = ulp_distance(got[0].get(i), want, s);
      ASSERT_LE(d, 1u) << "EXP2 " << scalar_name(s) << " of " << x[i].str() << ": got " << got[0].get(i).str()
                       << ", eval.h says " << want.str();
      inexact += d != 0;
    }
    EXPECT_LE(inexact, 4u) << scalar_name(s) << ": " << inexact << " of " << x.size() << " one ULP off";
  }
}

TEST(LlvmCpu, BitcastsKeepTheBits) {
  const std::vector<std::vector<Scalar>> groups = {
      {Scalar::Int8, Scalar::UInt8},
      {Scalar::Int16, Scalar::UInt16, Scalar::Float16, Scalar::BFloat16},
      {Scalar::Int32, Scalar::UInt32, Scalar::Float32},
      {Scalar::Int64, Scalar::UInt64, Scalar::Float64, Scalar::Index}};
  for (const auto& group : groups) {
    for (Scalar from : group) {
      std::vector<HostBuffer> ins;
      HostBuffer in(from, 256);
      std::mt19937_64 rng(7);
      for (size_t i = 0; i < in.size(); ++i) in.set_bits(i, i < 16 ? (uint64_t{1} << (scalar_bits(from) - 1)) - i : rng());
      ins.push_back(std::move(in));
      std::vector<std::pair<Scalar, Maker>> outs;
      for (Scalar to : group)
        outs.push_back({to, [to](LinearBuilder& lb, std::span<const UOp* const> v) {
                          return lb.make(Op::BITCAST, DType(to, v[0]->dtype().count), {v[0]});
                        }});
      for (uint32_t width : {1u, 4u}) {
        auto got = run_map(ins, outs, width);
        for (size_t k = 0; k < outs.size(); ++k)
          for (size_t i = 0; i < ins[0].size(); ++i) {
            ASSERT_EQ(got[k].bits(i), ins[0].bits(i)) << scalar_name(from) << " -> " << scalar_name(outs[k].first);
            // eval.h holds a float NaN as a double, which forgets its payload; compare
            // the values of everything else.
            ConstValue v = ins[0].get(i);
            if (v.kind() == ConstValue::Kind::Float && std::isnan(v.as_float())) continue;
            auto want = bitcast_value(v, from, outs[k].first);
            ASSERT_TRUE(want && same_value(got[k].get(i), *want))
                << scalar_name(from) << " -> " << scalar_name(outs[k].first) << " of " << v.str();
          }
      }
    }
  }
}

// Operations on constants only: LLVM folds them at compile time, and must fold to eval.h.
TEST(LlvmCpu, ConstantFoldingMatchesEval) {
  for (Scalar s : kAllScalars) {
    auto vals = interesting_values(s, 4);
    LinearBuilder lb;
    std::vector<std::pair<const UOp*, ConstValue>> checks;  // (stored value, expected)
    for (Op op : kExactOps) {
      if (op_info(op).min_src != 2 || !defined_on(op, s)) continue;
      for (size_t i = 0; i < vals.size(); i += 4)
        for (size_t j = 1; j < vals.size(); j += 3) {
          ConstValue args[] = {vals[i], vals[j]};
          checks.push_back({lb.alu(op, {lb.cnst(DType(s), vals[i]), lb.cnst(DType(s), vals[j])}), *eval_alu(op, s, args)});
        }
    }
    for (Scalar to : kAllScalars)
      for (size_t i = 0; i < vals.size(); ++i)
        checks.push_back({lb.cast(lb.cnst(DType(s), vals[i]), DType(to)), cast_value(vals[i], to)});
    // One output buffer per result dtype, the k-th check at its own position.
    std::vector<const UOp*> outs;
    for (Scalar t : kAllScalars) outs.push_back(lb.param(outs.size(), DType(t), checks.size()));
    for (size_t k = 0; k < checks.size(); ++k) {
      const UOp* v = checks[k].first;
      const UOp* out = outs[std::find(std::begin(kAllScalars), std::end(kAllScalars), v->dtype().scalar) - std::begin(kAllScalars)];
      lb.store(lb.index(out, lb.idx(k)), v);
    }
    auto prog = build(lb.linear());
    ASSERT_TRUE(prog);
    std::vector<HostBuffer> bufs;
    std::vector<void*> ptrs;
    for (Scalar t : kAllScalars) bufs.emplace_back(t, checks.size());
    for (auto& b : bufs) ptrs.push_back(b.data());
    ASSERT_TRUE(prog->run(ptrs, {}, nullptr).ok());
    for (size_t k = 0; k < checks.size(); ++k) {
      const UOp* v = checks[k].first;
      auto& buf = bufs[std::find(std::begin(kAllScalars), std::end(kAllScalars), v->dtype().scalar) - std::begin(kAllScalars)];
      EXPECT_TRUE(same_value(buf.get(k), checks[k].second))
          << op_name(v->op()) << " on " << scalar_name(v->src(0)->dtype().scalar) << " of "
          << v->src(0)->const_value()->str() << (v->num_src() > 1 ? ", " + v->src(1)->const_value()->str() : "")
          << ": got " << buf.get(k).str() << ", eval.h says " << checks[k].second.str();
    }
  }
}


// Sum of each row: the accumulator is a DEFINE_REG, its loads ordered with AFTER; rows
// are the Thread range. Float addition in order, so the result is exact against eval.h.
TEST(LlvmCpu, ReductionWithDefineRegAndAfter) {
  constexpr int64_t M = 37, K = 129;
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::float32, M);
  const UOp* a = lb.param(1, dtypes::float32, M * K);
  const UOp* acc = lb.reg(dtypes::float32, 1);
  const UOp* row = lb.range(lb.idx(M), 0, AxisType::Thread);
  const UOp* init = lb.store(lb.index(acc, lb.idx(0)), lb.f32(0));
  const UOp* k = lb.range(lb.idx(K), 1, AxisType::Reduce);
  const UOp* acc_in = lb.index(lb.after(acc, {init, k}), lb.idx(0));
  const UOp* x = lb.load(a, lb.index(a, lb.alu(Op::ADD, {lb.alu(Op::MUL, {row, lb.idx(K)}), k})));
  const UOp* upd = lb.store(acc_in, lb.alu(Op::ADD, {lb.load(acc, acc_in), x}));
  const UOp* done = lb.end(upd, k);
  const UOp* total = lb.load(acc, lb.index(lb.after(acc, {done}), lb.idx(0)));
  lb.end(lb.store(lb.index(out, row), total), row);
  HostBuffer in(Scalar::Float32, M * K);
  for (int64_t i = 0; i < M * K; ++i) in.set(i, ConstValue::Float(std::sin(i * 0.7) * 1000));
  for (int opt : {0, 1, 2, 3}) {  // every O level gives eval.h's sum
    auto prog = build(lb.linear(), {.opt_level = opt});
    ASSERT_TRUE(prog);
    HostBuffer o(Scalar::Float32, M);
    void* bufs[] = {o.data(), in.data()};
    ThreadPool pool(4);
    ASSERT_TRUE(prog->run(bufs, {}, &pool).ok());
    for (int64_t r = 0; r < M; ++r) {
      ConstValue sum = ConstValue::Float(0);
      for (int64_t j = 0; j < K; ++j) {
        ConstValue args[] = {sum, in.get(r * K + j)};
        sum = *eval_alu(Op::ADD, Scalar::Float32, args);
      }
      ASSERT_TRUE(same_value(o.get(r), sum)) << r << " at O" << opt;
    }
  }
}

// A gated LOAD whose index is far outside its buffer when the gate is off must not
// read: the buffer ends at an inaccessible page.
TEST(LlvmCpu, GatedLoadDoesNotTouchMemory) {
  constexpr int64_t N = 64;
  GuardedBuffer small(4 * sizeof(float));
  std::memcpy(small.data(), std::array<float, 4>{1, 2, 3, 4}.data(), 16);
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::float32, N);
  const UOp* a = lb.param(1, dtypes::float32, 4);
  const UOp* r = lb.range(lb.idx(N), 0);
  // In bounds (and gated on) only for r < 4; otherwise 4 + r*2^36 elements away.
  const UOp* on = lb.alu(Op::CMPLT, {r, lb.idx(4)});
  const UOp* i = lb.alu(Op::WHERE, {on, r, lb.alu(Op::ADD, {lb.idx(4), lb.alu(Op::MUL, {r, lb.idx(int64_t{1} << 36)})})});
  const UOp* x = lb.load(a, lb.index(a, i, on), dtypes::float32, lb.f32(-1));
  lb.end(lb.store(lb.index(out, r), x), r);
  // And a vector load with one gate per lane, at the very end of the buffer.
  const UOp* out4 = lb.param(2, dtypes::float32.vec(4), 2);
  const UOp* gates = lb.make(Op::VCONST, dtypes::bool_.vec(4), {}, VConstArg{{ConstValue::Bool(true), ConstValue::Bool(true), ConstValue::Bool(false), ConstValue::Bool(false)}});
  const ConstValue m2 = ConstValue::Float(-2);
  const UOp* alt = lb.make(Op::VCONST, dtypes::float32.vec(4), {}, VConstArg{{m2, m2, m2, m2}});
  const UOp* v = lb.load(a, lb.index(a, lb.idx(2), gates), dtypes::float32.vec(4), alt);
  lb.store(lb.index(out4, lb.idx(0)), v);
  auto prog = build(lb.linear());
  ASSERT_TRUE(prog);
  HostBuffer o(Scalar::Float32, N), o4(Scalar::Float32, 8);
  void* bufs[] = {o.data(), small.data(), o4.data()};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr).ok());
  for (int64_t j = 0; j < N; ++j) EXPECT_EQ(o.get(j).as_float(), j < 4 ? j + 1.0 : -1.0) << j;
  EXPECT_EQ(o4.get(0).as_float(), 3.0);
  EXPECT_EQ(o4.get(1).as_float(), 4.0);
  EXPECT_EQ(o4.get(2).as_float(), -2.0);
  EXPECT_EQ(o4.get(3).as_float(), -2.0);
}

TEST(LlvmCpu, GatedStoreWritesOnlyWhereTheGateHolds) {
  constexpr int64_t N = 33;
  GuardedBuffer mem(N * sizeof(int32_t));
  auto* o = static_cast<int32_t*>(mem.data());
  std::fill(o, o + N, 7);
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int32, N);
  const UOp* r = lb.range(lb.idx(N + 5), 0);  // r >= N would be out of bounds
  const UOp* even = lb.alu(Op::CMPEQ, {lb.alu(Op::MOD, {r, lb.idx(2)}), lb.idx(0)});
  const UOp* on = lb.alu(Op::AND, {even, lb.alu(Op::CMPLT, {r, lb.idx(N)})});
  lb.end(lb.store(lb.index(out, r, on), lb.cast(r, dtypes::int32)), r);
  auto prog = build(lb.linear());
  ASSERT_TRUE(prog);
  void* bufs[] = {o};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr).ok());
  for (int64_t j = 0; j < N; ++j) EXPECT_EQ(o[j], j % 2 == 0 ? j : 7) << j;
}

TEST(LlvmCpu, IfEndifBlock) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int32, 10);
  const UOp* r = lb.range(lb.idx(10), 0);
  const UOp* iff = lb.make(Op::IF, dtypes::void_, {lb.alu(Op::CMPLT, {r, lb.idx(5)})});
  lb.store(lb.index(out, r), lb.cast(lb.alu(Op::MUL, {r, r}), dtypes::int32));
  lb.end(lb.make(Op::ENDIF, dtypes::void_, {iff}), r);
  auto prog = build(lb.linear());
  ASSERT_TRUE(prog);
  std::vector<int32_t> o(10, -1);
  void* bufs[] = {o.data()};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr).ok());
  for (int j = 0; j < 10; ++j) EXPECT_EQ(o[j], j < 5 ? j * j : -1);
}

// out[i] += 1 over a Thread range of n: every element is covered exactly once whatever
// the number of tasks, and 1..8 tasks give the result of one.
TEST(LlvmCpu, ThreadRangeSplitsAcrossTasks) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int32, 1000);
  const UOp* in = lb.param(1, dtypes::float32, 1000);
  const UOp* out2 = lb.param(2, dtypes::float32, 1000);
  const UOp* n = lb.var("n", 0, 1000);
  const UOp* r = lb.range(n, 0, AxisType::Thread);
  const UOp* i = lb.index(out, r);
  lb.store(i, lb.alu(Op::ADD, {lb.load(out, i), lb.cnst(dtypes::int32, ConstValue::Int(1))}));
  lb.end(lb.store(lb.index(out2, r), lb.alu(Op::MUL, {lb.load(in, lb.index(in, r)), lb.f32(3)})), r);
  auto art = compile_cpu(lb.linear(), CpuTarget::host());
  ASSERT_TRUE(art.ok()) << art.status();
  EXPECT_TRUE(art->abi.has_thread_range);
  auto prog = CpuProgram::load(art->object, art->abi);
  ASSERT_TRUE(prog.ok());
  std::vector<float> x(1000);
  for (int j = 0; j < 1000; ++j) x[j] = j * 0.5f - 7;
  for (int64_t count : {0, 1, 3, 7, 8, 9, 1000}) {
    EXPECT_EQ(art->abi.eval_tasks(std::array{count}), count);
    std::vector<float> ref;
    for (int threads = 1; threads <= 8; ++threads) {
      ThreadPool pool(threads);
      std::vector<int32_t> o(1000, 0);
      std::vector<float> o2(1000, -1);
      void* bufs[] = {o.data(), x.data(), o2.data()};
      ASSERT_TRUE((*prog)->run(bufs, std::array{count}, &pool).ok());
      for (int j = 0; j < 1000; ++j) ASSERT_EQ(o[j], j < count ? 1 : 0) << "n=" << count << " threads=" << threads;
      if (threads == 1) ref = o2;
      EXPECT_EQ(o2, ref);
    }
  }
}

TEST(LlvmCpu, DefineVarLoopBounds) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int64, 64);
  const UOp* n = lb.var("n", 1, 8);
  const UOp* m = lb.var("m", 0, 8);
  const UOp* i = lb.range(n, 0);
  const UOp* j = lb.range(m, 1);
  const UOp* st = lb.store(lb.index(out, lb.alu(Op::ADD, {lb.alu(Op::MUL, {i, lb.idx(8)}), j})),
                           lb.cast(lb.alu(Op::SUB, {i, j}), dtypes::int64));
  lb.end(lb.end(st, j), i);
  auto art = compile_cpu(lb.linear(), CpuTarget::host());
  ASSERT_TRUE(art.ok()) << art.status();
  ASSERT_EQ(art->abi.vars.size(), 2u);
  EXPECT_EQ(art->abi.vars[0].name, "m");  // argument order: by name
  auto prog = CpuProgram::load(art->object, art->abi);
  ASSERT_TRUE(prog.ok());
  for (int64_t nv : {1, 3, 8})
    for (int64_t mv : {0, 2, 8}) {
      std::vector<int64_t> o(64, 99);
      void* bufs[] = {o.data()};
      ASSERT_TRUE((*prog)->run(bufs, std::array{mv, nv}, nullptr).ok());
      for (int a = 0; a < 8; ++a)
        for (int b = 0; b < 8; ++b) ASSERT_EQ(o[a * 8 + b], a < nv && b < mv ? a - b : 99);
    }
}

TEST(LlvmCpu, VectorLoadStoreAluGepVectorize) {
  constexpr int64_t N = 64;
  const DType v8 = dtypes::float32.vec(8);
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::float32, N);
  const UOp* a = lb.param(1, dtypes::float32, N);
  const UOp* out2 = lb.param(2, dtypes::float32, N / 4);
  const UOp* r = lb.range(lb.idx(N / 8), 0);
  const UOp* v = lb.load(a, lb.index(a, lb.alu(Op::MUL, {r, lb.idx(8)})), v8);
  const UOp* rev = lb.make(Op::GEP, v8, std::array{v}, IntsArg{{7, 6, 5, 4, 3, 2, 1, 0}});
  std::vector<ConstValue> ks;
  for (int k = 1; k <= 8; ++k) ks.push_back(ConstValue::Float(k));
  const UOp* w = lb.alu(Op::MULACC, {rev, lb.make(Op::VCONST, v8, {}, VConstArg{ks}), lb.make(Op::CONST, v8, {}, ConstValue::Float(0.5))});
  lb.store(lb.index(out, lb.alu(Op::MUL, {r, lb.idx(8)})), w);
  const UOp* lo = lb.make(Op::GEP, dtypes::float32, std::array{w}, IntsArg{{0}});
  const UOp* hi = lb.make(Op::GEP, dtypes::float32, std::array{w}, IntsArg{{7}});
  lb.end(lb.store(lb.index(out2, lb.alu(Op::MUL, {r, lb.idx(2)})), lb.make(Op::VECTORIZE, dtypes::float32.vec(2), {hi, lo})), r);
  auto prog = build(lb.linear());
  ASSERT_TRUE(prog);
  HostBuffer o(Scalar::Float32, N), in(Scalar::Float32, N), o2(Scalar::Float32, N / 4);
  for (int64_t j = 0; j < N; ++j) in.set(j, ConstValue::Float(j * 1.25 - 3));
  void* bufs[] = {o.data(), in.data(), o2.data()};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr).ok());
  for (int64_t j = 0; j < N; ++j) {
    int64_t base = j / 8 * 8, lane = j % 8;
    ConstValue args[] = {in.get(base + 7 - lane), ConstValue::Float(lane + 1), ConstValue::Float(0.5)};
    ConstValue want = *eval_alu(Op::MULACC, Scalar::Float32, args);
    ASSERT_TRUE(same_value(o.get(j), want)) << j;
    if (lane == 0) {
      ASSERT_TRUE(same_value(o2.get(j / 4 + 1), want));
    }
    if (lane == 7) {
      ASSERT_TRUE(same_value(o2.get(j / 4 - 1), want));
    }
  }
}

TEST(LlvmCpu, BoolBuffersAreBytes) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::bool_, 16);
  const UOp* a = lb.param(1, dtypes::bool_, 16);
  const UOp* r = lb.range(lb.idx(16), 0);
  const UOp* x = lb.load(a, lb.index(a, r));
  lb.end(lb.store(lb.index(out, r), lb.alu(Op::XOR, {x, lb.alu(Op::CMPLT, {r, lb.idx(8)})})), r);
  auto prog = build(lb.linear());
  ASSERT_TRUE(prog);
  std::vector<uint8_t> o(16, 0xAA), in(16);
  for (int j = 0; j < 16; ++j) in[j] = j % 3 == 0;
  void* bufs[] = {o.data(), in.data()};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr).ok());
  for (int j = 0; j < 16; ++j) EXPECT_EQ(o[j], uint8_t((j % 3 == 0) != (j < 8))) << j;
}

// Input the backend cannot compile is an INVALID_ARGUMENT naming the node and its op.
TEST(LlvmCpu, RejectsBadInputWithTheNode) {
  auto expect_error = [](LinearBuilder& lb, std::string_view needle) {
    auto art = compile_cpu(lb.linear(), CpuTarget::host());
    ASSERT_FALSE(art.ok());
    EXPECT_EQ(art.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(art.status().message().find(std::string(needle)), absl::string_view::npos) << art.status();
  };
  {
    LinearBuilder lb;
    lb.make(Op::SPECIAL, dtypes::index, std::array{lb.idx(4)}, StrArg{"gidx0"});
    expect_error(lb, "(SPECIAL)");
  }
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::float32, 4);
    lb.store(lb.index(out, lb.idx(0)), lb.make(Op::ADD, dtypes::float32, {lb.f32(1), lb.cnst(dtypes::int32, ConstValue::Int(1))}));
    expect_error(lb, "(ADD): operands have different dtypes");
  }
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::float32, 4);
    const UOp* x = lb.load(out, lb.index(out, lb.idx(0)));
    lb.store(lb.index(out, lb.idx(1)), lb.make(Op::IDIV, dtypes::float32, {x, x}));
    expect_error(lb, "(IDIV): IDIV is not defined on float32");
  }
  {
    LinearBuilder lb;  // a value computed inside a loop, used after it
    const UOp* out = lb.param(0, dtypes::index, 4);
    const UOp* r = lb.range(lb.idx(4), 0);
    const UOp* sq = lb.alu(Op::MUL, {r, r});
    lb.end(lb.store(lb.index(out, r), sq), r);
    lb.store(lb.index(out, lb.idx(0)), lb.alu(Op::ADD, {sq, lb.idx(1)}));
    expect_error(lb, "(ADD): uses [3] MUL outside the RANGE / IF that computes it [linear.scope]");
  }
  {
    LinearBuilder lb;  // a value computed under an IF, used after its ENDIF
    const UOp* out = lb.param(0, dtypes::index, 4);
    const UOp* c = lb.cnst(dtypes::bool_, ConstValue::Bool(true));
    const UOp* iff = lb.make(Op::IF, dtypes::void_, {c});
    const UOp* x = lb.alu(Op::ADD, {lb.idx(1), lb.idx(2)});
    lb.make(Op::ENDIF, dtypes::void_, {iff});
    lb.store(lb.index(out, lb.idx(0)), x);
    expect_error(lb, "(STORE): uses [5] ADD outside the RANGE / IF that computes it [linear.scope]");
  }
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::index, 16);
    const UOp* r0 = lb.range(lb.idx(4), 0);
    const UOp* r1 = lb.range(lb.idx(4), 1);
    const UOp* st = lb.store(lb.index(out, lb.alu(Op::ADD, {r0, r1})), r0);
    lb.end(st, r0);
    expect_error(lb, "(END): does not close the innermost open ranges, outermost first ([3] RANGE(r1, Loop)) [linear.nesting]");
  }
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::index, 16);
    const UOp* r0 = lb.range(lb.idx(4), 0);
    const UOp* r1 = lb.range(lb.idx(4), 1, AxisType::Thread);
    lb.end(lb.end(lb.store(lb.index(out, lb.alu(Op::ADD, {r0, r1})), r0), r1), r0);
    expect_error(lb, "the Thread range must be outermost");
  }
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::index, 16);
    lb.store(lb.index(out, lb.idx(0)), lb.idx(1));
    const UOp* r = lb.range(lb.idx(4), 0, AxisType::Thread);
    lb.end(lb.store(lb.index(out, r), r), r);
    expect_error(lb, "outside the Thread range");
  }
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::index, 16);
    lb.store(lb.make(Op::INDEX, dtypes::index, {out, lb.idx(0), lb.idx(1)}), lb.idx(1));
    expect_error(lb, "(INDEX): has 2 indices into a PARAM, wants 1 [index.arity]");
  }
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::float32, 1);
    const UOp* reg = lb.reg(dtypes::float32, int64_t{1} << 40);
    lb.store(lb.index(out, lb.idx(0)), lb.load(reg, lb.index(reg, lb.idx(0))));
    expect_error(lb, "(DEFINE_REG)");
  }
}

TEST(KernelAbi, DerivedFromTheLinear) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::float16, 100);
  const UOp* in = lb.param(2, dtypes::float32.vec(4), 25);
  const UOp* n = lb.var("n", 1, 100);
  const UOp* k = lb.var("k", 0, 7);
  const UOp* r = lb.range(lb.alu(Op::IDIV, {lb.alu(Op::ADD, {n, lb.idx(3)}), lb.idx(4)}), 0, AxisType::Thread);
  const UOp* x = lb.load(in, lb.index(in, lb.alu(Op::ADD, {r, k})));
  lb.end(lb.store(lb.index(out, r), lb.cast(lb.make(Op::GEP, dtypes::float32, std::array{x}, IntsArg{{0}}), dtypes::float16)), r);
  auto abi = abi_of(lb.linear());
  ASSERT_TRUE(abi.ok()) << abi.status();
  ASSERT_EQ(abi->params.size(), 2u);
  EXPECT_EQ(abi->params[0], (KernelParam{0, dtypes::float16, 100, false, true}));
  EXPECT_EQ(abi->params[1], (KernelParam{2, dtypes::float32.vec(4), 25, true, false}));
  EXPECT_EQ(abi->num_buffers(), 3);
  ASSERT_EQ(abi->vars.size(), 2u);
  EXPECT_EQ(abi->vars[0], (KernelVar{"k", 0, 7}));
  EXPECT_EQ(abi->vars[1], (KernelVar{"n", 1, 100}));
  EXPECT_EQ(abi->tasks_extent.str(abi->vars), "((n + 3) / 4)");
  EXPECT_EQ(abi->eval_tasks(std::array<int64_t, 2>{0, 5}), 2);
  EXPECT_EQ(abi->eval_tasks(std::array<int64_t, 2>{0, 100}), 25);

  std::string text = abi->serialize();
  auto back = parse_abi(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(*back, *abi);
  EXPECT_EQ(back->serialize(), text);
  // Every truncation and a few corruptions are errors, never crashes.
  for (size_t len = 0; len + 1 < text.size(); ++len) EXPECT_FALSE(parse_abi(text.substr(0, len)).ok()) << len;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    std::string bad = text;
    bad[pos] = bad[pos] == '9' ? '/' : '9';
    (void)parse_abi(bad);
  }
}

// The work estimate weighs each op by the trip counts of the ranges open around it, each
// lane of a vector op counted, registers not counted as memory; it survives the text form,
// and an ABI without one keeps its older text version.
TEST(KernelAbi, WorkEstimateWeighsOpsByTheirRanges) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::float32, 800);
  const UOp* in = lb.param(1, dtypes::float32.vec(4), 8);
  const UOp* acc = lb.reg(dtypes::float32, 1);
  const UOp* n = lb.var("n", 1, 100);
  const UOp* r0 = lb.range(n, 0, AxisType::Thread);
  const UOp* r1 = lb.range(lb.idx(8), 1, AxisType::Reduce);
  const UOp* x = lb.load(in, lb.index(in, r1));               // 16 bytes per r1
  const UOp* sq = lb.alu(Op::MUL, {x, x});                      // 4 flops per r1
  const UOp* a = lb.load(acc, lb.index(acc, lb.idx(0)));        // a register: no bytes
  const UOp* sum = lb.alu(Op::ADD, {a, lb.make(Op::GEP, dtypes::float32, std::array{sq}, IntsArg{{0}})});  // 1 flop
  const UOp* st = lb.store(lb.index(acc, lb.idx(0)), sum);
  const UOp* e1 = lb.end(st, r1);
  const UOp* doubled = lb.alu(Op::MUL, {lb.load(acc, lb.index(acc, lb.idx(0))), lb.cnst(dtypes::float32, ConstValue::Float(2))});
  lb.end(lb.after(lb.store(lb.index(out, r0), doubled), {e1}), r0);  // 1 flop, 4 bytes per r0
  auto abi = abi_of(lb.linear());
  ASSERT_TRUE(abi.ok()) << abi.status();
  ASSERT_TRUE(abi->work.has_value());
  for (int64_t nv : {1, 7, 100}) {
    std::array<int64_t, 1> vars{nv};
    EXPECT_EQ(abi->work->flops.eval(vars), nv * (8 * (4 + 1) + 1)) << nv;
    EXPECT_EQ(abi->work->bytes.eval(vars), nv * (8 * 16 + 4)) << nv;
  }
  EXPECT_EQ(abi->loops_str(), "Thread(n) Reduce(8) lanes=4");
  std::string text = abi->serialize();
  EXPECT_TRUE(text.starts_with(cat("uopd-abi ", kAbiVersion, "\n"))) << text;
  auto back = parse_abi(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(*back, *abi);
  for (size_t len = 0; len + 1 < text.size(); ++len) EXPECT_FALSE(parse_abi(text.substr(0, len)).ok()) << len;
  std::string bad_axis = text;
  bad_axis.replace(bad_axis.find("Reduce"), 6, "Reduse");
  EXPECT_EQ(parse_abi(bad_axis).status().code(), absl::StatusCode::kDataLoss);
  // With GPU launch dims after it.
  KernelAbi gpu = *abi;
  gpu.gpu.emplace();
  gpu.gpu->block[0] = LaunchExpr::constant(128);
  auto gpu_back = parse_abi(gpu.serialize());
  ASSERT_TRUE(gpu_back.ok()) << gpu_back.status() << "\n" << gpu.serialize();
  EXPECT_EQ(*gpu_back, gpu);

  // Without an estimate (an artifact of an older ABI), the text is what it was.
  KernelAbi old = *abi;
  old.work.reset();
  EXPECT_TRUE(old.serialize().starts_with("uopd-abi 1\n")) << old.serialize();
  auto old_back = parse_abi(old.serialize());
  ASSERT_TRUE(old_back.ok()) << old_back.status();
  EXPECT_EQ(*old_back, old);
  EXPECT_EQ(old.loops_str(), "");
  old.stop_word = true;
  EXPECT_TRUE(old.serialize().starts_with("uopd-abi 3\n")) << old.serialize();
}

TEST(KernelAbi, LaunchExprFollowsEval) {
  using T = LaunchExpr::Term;
  auto e = LaunchExpr::from_terms({{T::Kind::Var, 0}, {T::Kind::Const, 0}, {T::Kind::Op, 0, Op::IDIV}}, 1);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->eval(std::array<int64_t, 1>{5}), 0);  // x / 0 = 0
  auto m = LaunchExpr::from_terms({{T::Kind::Var, 0}, {T::Kind::Const, -1}, {T::Kind::Op, 0, Op::IDIV}}, 1);
  EXPECT_EQ(m->eval(std::array<int64_t, 1>{INT64_MIN}), INT64_MIN);
  EXPECT_FALSE(LaunchExpr::from_terms({{T::Kind::Op, 0, Op::ADD}}, 0).ok());
  EXPECT_FALSE(LaunchExpr::from_terms({{T::Kind::Var, 1}}, 1).ok());
  EXPECT_FALSE(LaunchExpr::from_terms({{T::Kind::Const, 1}, {T::Kind::Const, 2}}, 0).ok());
  EXPECT_FALSE(LaunchExpr::from_terms({{T::Kind::Const, 1}, {T::Kind::Const, 2}, {T::Kind::Op, 0, Op::SHL}}, 0).ok());
  KernelAbi none;
  EXPECT_EQ(none.eval_tasks({}), 1);
}

}  // namespace
}  // namespace uop
