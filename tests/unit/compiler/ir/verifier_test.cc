#include "compiler/ir/verifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "compiler/ir/printer.h"
#include "compiler/ir/shape.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Builds tensor-, kernel- and linear-level graphs in one arena.
struct B {
  Graph g;
  const UOp* dev = g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{"CPU:0"}});
  DType fptr = dtypes::float32.ptr_to(AddrSpace::Global, 16);
  const UOp* p0 = g.make(Op::PARAM, fptr, {}, ParamArg{0, 16});
  const UOp* p1 = g.make(Op::PARAM, fptr, {}, ParamArg{1, 16});

  // Tensor level.
  const UOp* buffer(int64_t n, DType dt = dtypes::float32, int64_t id = 0) {
    return g.make(Op::BUFFER, dt, {g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{id}), dev}, BufferArg{n});
  }
  const UOp* shp(std::vector<int64_t> dims) {
    Shape s;
    for (int64_t d : dims) s.push_back(g.idx(d));
    return make_shape_operand(g, s);
  }
  const UOp* reshape(const UOp* x, std::vector<int64_t> s) { return g.make(Op::RESHAPE, x->dtype(), {x, shp(s)}); }
  const UOp* expand(const UOp* x, std::vector<int64_t> s) { return g.make(Op::EXPAND, x->dtype(), {x, shp(s)}); }
  const UOp* permute(const UOp* x, std::vector<int64_t> p) { return g.make(Op::PERMUTE, x->dtype(), {x}, IntsArg{p}); }
  const UOp* reduce(const UOp* x, std::vector<int64_t> axes, ReduceOp op = ReduceOp::Add) {
    return g.make(Op::REDUCE_AXIS, x->dtype(), {x}, ReduceAxisArg{op, axes});
  }
  const UOp* tensor(std::vector<int64_t> s, int64_t id = 0, DType dt = dtypes::float32) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return reshape(buffer(n, dt, id), s);
  }
  const UOp* var(const char* name, int64_t lo, int64_t hi) {
    return g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{name, lo, hi});
  }
  const UOp* sink(std::initializer_list<const UOp*> s) { return g.make(Op::SINK, dtypes::void_, s); }

  // Kernel level.
  const UOp* range(int64_t end, int64_t id = 0, AxisType t = AxisType::Loop) {
    return g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{id, t});
  }
  const UOp* index(const UOp* buf, const UOp* i) { return g.make(Op::INDEX, dtypes::float32, {buf, i}); }
  const UOp* load(const UOp* buf, const UOp* i) { return g.make(Op::LOAD, dtypes::float32, {buf, index(buf, i)}); }
  const UOp* store(const UOp* buf, const UOp* i, const UOp* v, std::vector<const UOp*> ranges = {}) {
    std::vector<const UOp*> src{index(buf, i), v};
    src.insert(src.end(), ranges.begin(), ranges.end());
    return g.make(Op::STORE, dtypes::void_, src);
  }
  const UOp* f32(double v) { return g.cnst(dtypes::float32, v); }
  const UOp* end(const UOp* x, std::vector<const UOp*> ranges) {
    std::vector<const UOp*> src{x};
    src.insert(src.end(), ranges.begin(), ranges.end());
    return g.make(Op::END, dtypes::void_, src);
  }
  const UOp* red(const UOp* v, const UOp* r) { return g.make(Op::REDUCE, v->dtype(), {v, r}, ReduceOpArg{ReduceOp::Add}); }
  // A kernel storing `value` (which may use r) to p0[r].
  const UOp* kernel(const UOp* value, const UOp* r) { return sink({store(p0, r, value, {r})}); }
  const UOp* linear(std::vector<const UOp*> ops) { return g.make(Op::LINEAR, dtypes::void_, ops); }
};

void expect_violation(Graph& g, const UOp* root, const UOp* bad, std::string_view tag, VerifyOptions opts = {}) {
  absl::Status st = verify(g, root, opts);
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  std::string msg(st.message());
  NodeIndex index = index_by_toposort(root);
  ASSERT_TRUE(index.contains(bad));
  EXPECT_THAT(msg, StartsWith(cat("node ", index.at(bad), " (", op_name(bad->op()), "): "))) << msg;
  EXPECT_THAT(msg, HasSubstr(cat("[", tag, "]; path: "))) << msg;
}

void expect_valid(Graph& g, const UOp* root, VerifyOptions opts = {}) {
  absl::Status st = verify(g, root, opts);
  EXPECT_TRUE(st.ok()) << st << "\n";
}

// ---- the message format ---------------------------------------------------------------

TEST(Verifier, MessageNamesNodeRuleAndPath) {
  B b;
  const UOp* add = b.g.make(Op::ADD, dtypes::float32, {b.buffer(16), b.g.cnst_int(dtypes::int32, 1)});
  absl::Status st = verify(b.g, b.sink({add}));
  // UNIQUE 0, DEVICE 1, BUFFER 2, CONST 3, ADD 4, SINK 5.
  EXPECT_EQ(st.message(), "node 4 (ADD): operands have different dtypes float32 and int32 [alu.dtype]; "
                          "path: [5] SINK (src 0) -> [4] ADD");

  B k;
  const UOp* r = k.range(16);
  const UOp* bad = k.g.make(Op::ADD, dtypes::float32, {k.load(k.p1, r), k.g.cnst_int(dtypes::int32, 1)});
  const UOp* root = k.kernel(bad, r);
  st = verify(k.g, root);
  NodeIndex idx = index_by_toposort(root);
  EXPECT_EQ(st.message(), cat("node ", idx.at(bad), " (ADD): operands have different dtypes float32 and int32 "
                              "[alu.dtype]; path: [", idx.at(root), "] SINK (src 0) -> [", idx.at(root->src(0)),
                              "] STORE (src 1) -> [", idx.at(bad), "] ADD"));
  // A wire index given by the caller numbers the nodes instead.
  NodeIndex wire = idx;
  for (auto& [u, i] : wire) i += 1000;
  VerifyOptions opts;
  opts.index = &wire;
  st = verify(k.g, root, opts);
  EXPECT_THAT(std::string(st.message()), StartsWith(cat("node ", idx.at(bad) + 1000, " (ADD)")));
}

TEST(Verifier, LongPathsAreElided) {
  B b;
  const UOp* x = b.g.make(Op::SIN, dtypes::int32, {b.g.cnst_int(dtypes::int32, 1)});
  const UOp* bad = x;
  for (int i = 0; i < 1000; ++i) x = b.g.alu(Op::NEG, {x});
  absl::Status st = verify(b.g, b.sink({x}));
  EXPECT_THAT(std::string(st.message()), StartsWith("node 1 (SIN):"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("-> ... (991 more) -> "));
  EXPECT_EQ(index_by_toposort(b.sink({x})).at(bad), 1u);
}

// ---- valid graphs ---------------------------------------------------------------------

TEST(Verifier, ValidTensorGraphs) {
  B b;
  const UOp* x = b.tensor({2, 3}, 0);
  const UOp* y = b.tensor({2, 3}, 1);
  // An elementwise chain with a cast and a comparison.
  const UOp* e = b.g.alu(Op::ADD, {b.g.alu(Op::MUL, {x, y}), b.g.alu(Op::EXP2, {x})});
  const UOp* w = b.g.alu(Op::WHERE, {b.g.alu(Op::CMPLT, {x, y}), e, x});
  const UOp* chain = b.sink({b.g.make(Op::CAST, dtypes::float16, {w})});
  EXPECT_EQ(detect_stage(chain), Stage::Tensor);
  expect_valid(b.g, chain);
  // A reduction (keepdim) and a max.
  expect_valid(b.g, b.sink({b.reduce(x, {1}), b.reduce(y, {0, 1}, ReduceOp::Max)}));
  // A matmul (2x3 @ 3x4) as EXPAND + MUL + REDUCE_AXIS.
  const UOp* a = b.g.make(Op::CONTIGUOUS, dtypes::float32, {x});
  const UOp* m = b.tensor({3, 4}, 2);
  const UOp* ae = b.expand(b.reshape(a, {2, 1, 3}), {2, 4, 3});
  const UOp* me = b.expand(b.reshape(b.permute(m, {1, 0}), {1, 4, 3}), {2, 4, 3});
  const UOp* mm = b.reshape(b.reduce(b.g.alu(Op::MUL, {ae, me}), {2}), {2, 4});
  expect_valid(b.g, b.sink({mm}));
  // Constants only: a tensor graph too.
  const UOp* c = b.sink({b.g.alu(Op::ADD, {b.f32(1), b.f32(2)})});
  EXPECT_EQ(detect_stage(c), Stage::Tensor);
  expect_valid(b.g, c);
  // A root that is a tensor itself; a COPY to another device.
  expect_valid(b.g, mm);
  expect_valid(b.g, b.g.make(Op::COPY, dtypes::float32, {x, b.g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{"CUDA:0"}})}));
}

TEST(Verifier, ValidSymbolicTensorGraph) {
  B b;
  const UOp* bs = b.g.make(Op::BIND, dtypes::index, {b.var("b", 1, 128), b.g.idx(7)});
  const UOp* n = b.g.alu(Op::MUL, {bs, b.g.idx(16)});
  const UOp* x = b.g.make(Op::SHRINK, dtypes::float32, {b.buffer(2048), b.shp({0}), make_shape_operand(b.g, {n})});
  const UOp* y = b.g.make(Op::RESHAPE, dtypes::float32, {x, make_shape_operand(b.g, {bs, b.g.idx(16)})});
  expect_valid(b.g, b.sink({b.reduce(y, {1})}));
}

TEST(Verifier, ValidKernels) {
  B b;
  const UOp* r = b.range(16);
  // out[i] = in[i] * 2
  const UOp* k = b.kernel(b.g.alu(Op::MUL, {b.load(b.p1, r), b.f32(2)}), r);
  EXPECT_EQ(detect_stage(k), Stage::Kernel);
  expect_valid(b.g, k);
  // out[i] = sum_j in[i*4 + j], STORE closing the outer range, then END closing it.
  const UOp* i = b.range(4, 0);
  const UOp* j = b.range(4, 1, AxisType::Reduce);
  const UOp* s = b.red(b.load(b.p1, b.g.alu(Op::ADD, {b.g.alu(Op::MUL, {i, b.g.idx(4)}), j})), j);
  expect_valid(b.g, b.sink({b.store(b.p0, i, s, {i})}));
  expect_valid(b.g, b.sink({b.end(b.store(b.p0, i, s), {i})}));
  // Two reductions over the same range are fine.
  const UOp* two = b.g.alu(Op::ADD, {s, b.g.make(Op::REDUCE, dtypes::float32, {s->src(0), j}, ReduceOpArg{ReduceOp::Max})});
  expect_valid(b.g, b.sink({b.store(b.p0, i, two, {i})}));
  // A gated load with an alt value.
  const UOp* gate = b.g.alu(Op::CMPLT, {r, b.g.idx(8)});
  const UOp* gi = b.g.make(Op::INDEX, dtypes::float32, {b.p1, r, gate});
  const UOp* gl = b.g.make(Op::LOAD, dtypes::float32, {b.p1, gi, b.f32(0)});
  expect_valid(b.g, b.kernel(gl, r));
  // Nested ENDs; a runtime variable bounds a loop.
  const UOp* v = b.g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"n", 1, 16});
  const UOp* rv = b.g.make(Op::RANGE, dtypes::index, {v}, RangeArg{2, AxisType::Loop});
  const UOp* both = b.g.alu(Op::ADD, {i, rv});
  expect_valid(b.g, b.sink({b.end(b.end(b.store(b.p0, both, b.load(b.p1, rv)), {rv}), {i})}));
  // An accumulator as lower_reduce writes it: the LOAD names the register, its INDEX an
  // AFTER of it.
  DType reg = dtypes::float32.ptr_to(AddrSpace::Reg, 1);
  const UOp* acc = b.g.make(Op::DEFINE_REG, reg, {}, DefineRegArg{1, 0});
  const UOp* init = b.g.make(Op::STORE, dtypes::void_, {b.index(acc, b.g.idx(0)), b.f32(0)});
  const UOp* cur = b.index(b.g.make(Op::AFTER, reg, {acc, init, j}), b.g.idx(0));
  const UOp* upd = b.g.make(Op::STORE, dtypes::void_,
                            {cur, b.g.alu(Op::ADD, {b.g.make(Op::LOAD, dtypes::float32, {acc, cur}), b.load(b.p1, j)})});
  const UOp* done = b.index(b.g.make(Op::AFTER, reg, {acc, b.end(upd, {j})}), b.g.idx(0));
  expect_valid(b.g, b.sink({b.store(b.p0, b.g.idx(0), b.g.make(Op::LOAD, dtypes::float32, {acc, done}))}));
  // Between rangeify and split_kernels: a SINK of BUFFERIZEs, read through INDEX (a
  // scalar BUFFERIZE takes no index); after split_kernels: a SINK of CALLs.
  const UOp* bz = b.g.make(Op::BUFFERIZE, dtypes::float32, {b.red(b.load(b.p1, j), j)}, BufferizeArg{});
  const UOp* use = b.g.make(Op::BUFFERIZE, dtypes::float32,
                            {b.g.alu(Op::MUL, {b.g.make(Op::INDEX, dtypes::float32, {bz}), b.load(b.p1, r)}), r},
                            BufferizeArg{});
  expect_valid(b.g, b.sink({use}));
  const UOp* body = b.g.make(Op::SINK, dtypes::void_, {b.store(b.p0, r, b.load(b.p1, r), {r})}, KernelInfoArg{true, "k"});
  expect_valid(b.g, b.sink({b.g.make(Op::CALL, dtypes::void_, {body, b.buffer(16)}, CallInfoArg{"k"})}));
  // Before normalization the kernel indexes BUFFERs.
  const UOp* buf = b.buffer(16);
  expect_valid(b.g, b.sink({b.store(b.p0, r, b.g.make(Op::LOAD, dtypes::float32, {buf, b.index(buf, r)}), {r})}));
}

TEST(Verifier, ValidLinear) {
  B b;
  const UOp* c16 = b.g.idx(16);
  const UOp* r = b.g.make(Op::RANGE, dtypes::index, {c16}, RangeArg{0, AxisType::Loop});
  const UOp* i1 = b.index(b.p1, r);
  const UOp* ld = b.g.make(Op::LOAD, dtypes::float32, {b.p1, i1});
  const UOp* c2 = b.f32(2);
  const UOp* m = b.g.alu(Op::MUL, {ld, c2});
  const UOp* i0 = b.index(b.p0, r);
  const UOp* st = b.g.make(Op::STORE, dtypes::void_, {i0, m});
  const UOp* e = b.end(st, {r});
  const UOp* lin = b.linear({b.p0, b.p1, c16, r, i1, ld, c2, m, i0, st, e});
  EXPECT_EQ(detect_stage(lin), Stage::Linear);
  expect_valid(b.g, lin);
  // Two nested loops, closed by one END (outermost first) or by two.
  const UOp* c4 = b.g.idx(4);
  const UOp* r0 = b.g.make(Op::RANGE, dtypes::index, {c4}, RangeArg{0, AxisType::Loop});
  const UOp* r1 = b.g.make(Op::RANGE, dtypes::index, {c4}, RangeArg{1, AxisType::Loop});
  const UOp* mul = b.g.alu(Op::MUL, {r0, c4});
  const UOp* idx = b.g.alu(Op::ADD, {mul, r1});
  const UOp* j1 = b.index(b.p1, idx);
  const UOp* l1 = b.g.make(Op::LOAD, dtypes::float32, {b.p1, j1});
  const UOp* j0 = b.index(b.p0, idx);
  const UOp* s1 = b.g.make(Op::STORE, dtypes::void_, {j0, l1});
  std::vector<const UOp*> body = {b.p0, b.p1, c4, r0, r1, mul, idx, j1, l1, j0, s1};
  auto with = [&](std::vector<const UOp*> tail) {
    std::vector<const UOp*> ops = body;
    ops.insert(ops.end(), tail.begin(), tail.end());
    return b.linear(ops);
  };
  expect_valid(b.g, with({b.end(s1, {r0, r1})}));
  const UOp* e1 = b.end(s1, {r1});
  expect_valid(b.g, with({e1, b.end(e1, {r0})}));
  // An accumulator: DEFINE_REG, STORE in the loop, LOAD after it (ordered by AFTER).
  DType reg = dtypes::float32.ptr_to(AddrSpace::Reg, 1);
  const UOp* acc = b.g.make(Op::DEFINE_REG, reg, {}, DefineRegArg{1, 0});
  const UOp* c0 = b.g.idx(0);
  const UOp* a0 = b.g.make(Op::INDEX, dtypes::float32, {acc, c0});
  const UOp* zero = b.f32(0);
  const UOp* init = b.g.make(Op::STORE, dtypes::void_, {a0, zero});
  const UOp* acc1 = b.g.make(Op::AFTER, reg, {acc, init});
  const UOp* a1 = b.g.make(Op::INDEX, dtypes::float32, {acc1, c0});
  const UOp* cur = b.g.make(Op::LOAD, dtypes::float32, {acc1, a1});
  const UOp* sum = b.g.alu(Op::ADD, {cur, ld});
  const UOp* upd = b.g.make(Op::STORE, dtypes::void_, {a1, sum});
  const UOp* eacc = b.end(upd, {r});
  const UOp* acc2 = b.g.make(Op::AFTER, reg, {acc, eacc});
  const UOp* a2 = b.g.make(Op::INDEX, dtypes::float32, {acc2, c0});
  const UOp* total = b.g.make(Op::LOAD, dtypes::float32, {acc2, a2});
  const UOp* o = b.index(b.p0, c0);
  const UOp* out = b.g.make(Op::STORE, dtypes::void_, {o, total});
  expect_valid(b.g, b.linear({b.p0, b.p1, acc, c0, a0, zero, init, acc1, c16, r, i1, ld, a1, cur, sum, upd, eacc,
                              acc2, a2, total, o, out}));
}

TEST(Verifier, DeepChainsAreIterative) {
  B b;
  const UOp* x = b.tensor({3, 4});
  for (int i = 0; i < 200000; ++i) x = b.g.alu(Op::NEG, {x});
  expect_valid(b.g, b.sink({x}));
  const UOp* r = b.range(16);
  const UOp* v = b.load(b.p1, r);
  for (int i = 0; i < 200000; ++i) v = b.g.alu(Op::ADD, {v, b.f32(1)});
  expect_valid(b.g, b.kernel(v, r));
}

// Graphs from the network can be anything Graph::make accepts: random ops, dtypes, sources
// and args must get an answer (OK or INVALID_ARGUMENT), never a crash.
TEST(Verifier, RandomGraphsNeverCrash) {
  std::mt19937_64 rng(12345);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  auto small = [&]() { return pick(24) - 4; };
  auto ints = [&]() {
    std::vector<int64_t> v(pick(4));
    for (auto& x : v) x = small();
    return v;
  };
  auto value = [&]() {
    switch (pick(4)) {
      case 0: return ConstValue::Bool(pick(2));
      case 1: return ConstValue::Int(small());
      case 2: return ConstValue::UInt(pick(300));
      default: return ConstValue::Float(small() * 0.5);
    }
  };
  auto arg = [&](ArgKind k) -> Arg {
    switch (k) {
      case ArgKind::Const: return value();
      case ArgKind::VConst: { VConstArg a; for (int i = pick(4); i > 0; --i) a.values.push_back(value()); return a; }
      case ArgKind::Int: return IntArg{small()};
      case ArgKind::Ints: return IntsArg{ints()};
      case ArgKind::Bools: { BoolsArg a; for (int i = pick(4); i > 0; --i) a.values.push_back(pick(2)); return a; }
      case ArgKind::Range: return RangeArg{small(), static_cast<AxisType>(pick(10))};
      case ArgKind::ReduceAxis: return ReduceAxisArg{static_cast<ReduceOp>(pick(4)), ints()};
      case ArgKind::ReduceOp: return ReduceOpArg{static_cast<ReduceOp>(pick(4))};
      case ArgKind::Buffer: return BufferArg{pick(3) ? small() : INT64_MAX - pick(20)};
      case ArgKind::BufferView: return BufferViewArg{small(), small()};
      case ArgKind::Param: return ParamArg{small(), small()};
      case ArgKind::DefineVar: return DefineVarArg{"v", small(), small()};
      case ArgKind::DefineReg: return DefineRegArg{small(), small()};
      case ArgKind::AxisFactors: return AxisFactorsArg{{{small(), small()}}};
      case ArgKind::Device: return DeviceArg{{"CPU:0"}};
      default: return default_arg(k);
    }
  };
  int ok = 0;
  for (int round = 0; round < 5000; ++round) {
    Graph g;
    std::vector<const UOp*> made;
    for (int n = 1 + pick(24); n > 0; --n) {
      // Half the time from the ops and dtypes that reach shapes and range scoping.
      static constexpr Op kFocus[] = {Op::CONST, Op::BUFFER, Op::UNIQUE, Op::DEVICE, Op::VCONST, Op::VECTORIZE,
                                      Op::RESHAPE, Op::EXPAND, Op::PERMUTE, Op::PAD, Op::SHRINK, Op::REDUCE_AXIS,
                                      Op::ADD, Op::MUL, Op::WHERE, Op::CMPLT, Op::DEFINE_VAR, Op::BIND, Op::RANGE,
                                      Op::INDEX, Op::LOAD, Op::STORE, Op::REDUCE, Op::END, Op::SINK, Op::PARAM};
      static constexpr Scalar kTypes[] = {Scalar::Float32, Scalar::Index, Scalar::Bool, Scalar::Void};
      Op op = pick(2) ? kFocus[pick(std::size(kFocus))] : static_cast<Op>(pick(kNumOps));
      Scalar sc = pick(2) ? kTypes[pick(std::size(kTypes))] : static_cast<Scalar>(pick(kNumScalars));
      DType dt(sc, pick(5) == 0 ? static_cast<uint32_t>(pick(5)) : 1);
      if (pick(6) == 0) dt = dt.ptr_to(static_cast<AddrSpace>(pick(3)), small());
      std::vector<const UOp*> src;
      for (int i = made.empty() ? 0 : pick(4); i > 0; --i) src.push_back(made[pick(made.size())]);
      made.push_back(g.make(op, dt, src, arg(op_info(op).arg)));
    }
    const UOp* root = made.back();
    for (Stage st : {Stage::Tensor, Stage::Kernel, Stage::Linear}) {
      VerifyOptions o;
      o.stage = st;
      o.allow_custom = pick(2);
      absl::Status s = verify(g, root, o);
      EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kInvalidArgument) << s;
      ok += s.ok();
    }
    (void)verify(g, root);
    ShapeInference si(g);
    for (const UOp* u : made) (void)si.shape(u);
    EXPECT_FALSE(print_tree(root).empty());
  }
  RecordProperty("verified_ok", ok);
}

TEST(Verifier, CustomNeedsTheOperatorsFlag) {
  B b;
  const UOp* c = b.g.make(Op::CUSTOM, dtypes::float32, {}, StrArg{"asm(\"...\")"});
  const UOp* root = b.sink({c});
  expect_violation(b.g, root, c, "custom.refused");
  VerifyOptions allow;
  allow.allow_custom = true;
  // Allowed, it goes on to the next rule: a tensor SINK's outputs are tensors.
  expect_violation(b.g, root, root, "tensor.root", allow);
}

// ---- the catalogue of invalid graphs ----------------------------------------------------

TEST(VerifierCatalogue, Structure) {
  B b;
  const UOp* x = b.tensor({2, 3});
  const UOp* bad;
  bad = b.g.make(Op::ADD, dtypes::float32, {x});
  expect_violation(b.g, b.sink({bad}), bad, "src.count");
  bad = b.g.make(Op::RESHAPE, dtypes::float32, {x, b.shp({6}), b.shp({6})});
  expect_violation(b.g, b.sink({bad}), bad, "src.count");
#ifdef NDEBUG  // Graph::make asserts the arg kind in debug builds; a decoder may still produce one
  bad = b.g.make(Op::PERMUTE, dtypes::float32, {x}, NoArg{});
  expect_violation(b.g, b.sink({bad}), bad, "arg.kind");
#endif
  bad = b.g.make(Op::ADD, dtypes::void_, {x, x});
  expect_violation(b.g, b.sink({bad}), bad, "dtype.void");
  bad = b.g.make(Op::CONST, dtypes::float32.ptr_to(), {}, ConstValue::Float(1));
  expect_violation(b.g, b.sink({bad}), bad, "dtype.ptr");
  bad = b.g.make(Op::CONST, DType(Scalar::Float32, 0), {}, ConstValue::Float(1));
  expect_violation(b.g, b.sink({bad}), bad, "dtype.count");
  bad = b.g.make(Op::NEG, dtypes::float32, {b.sink({x})});
  expect_violation(b.g, b.sink({bad}), bad, "src.void");
  bad = b.g.make(Op::SINK, dtypes::float32, {x});
  expect_violation(b.g, bad, bad, "dtype.void");
}

TEST(VerifierCatalogue, AluDtypes) {
  B b;
  const UOp* x = b.tensor({2, 3});
  const UOp* i = b.tensor({2, 3}, 1, dtypes::int32);
  const UOp* f = b.g.make(Op::CMPLT, dtypes::bool_, {x, x});
  const UOp* bad;
  bad = b.g.make(Op::ADD, dtypes::float32, {x, i});
  expect_violation(b.g, b.sink({bad}), bad, "alu.dtype");
  bad = b.g.make(Op::SIN, dtypes::int32, {i});
  expect_violation(b.g, b.sink({bad}), bad, "alu.domain");
  bad = b.g.make(Op::IDIV, dtypes::float32, {x, x});
  expect_violation(b.g, b.sink({bad}), bad, "alu.domain");
  bad = b.g.make(Op::XOR, dtypes::float32, {x, x});
  expect_violation(b.g, b.sink({bad}), bad, "alu.domain");
  bad = b.g.make(Op::ADD, dtypes::bool_, {f, f});
  expect_violation(b.g, b.sink({bad}), bad, "alu.domain");
  bad = b.g.make(Op::SQRT, dtypes::bool_, {f});
  expect_violation(b.g, b.sink({bad}), bad, "alu.domain");
  bad = b.g.make(Op::SHL, dtypes::float32, {x, x});
  expect_violation(b.g, b.sink({bad}), bad, "alu.domain");
  bad = b.g.make(Op::CMPLT, dtypes::float32, {x, x});
  expect_violation(b.g, b.sink({bad}), bad, "alu.result");
  bad = b.g.make(Op::ADD, dtypes::float64, {x, x});
  expect_violation(b.g, b.sink({bad}), bad, "alu.result");
  bad = b.g.make(Op::WHERE, dtypes::float32, {i, x, x});
  expect_violation(b.g, b.sink({bad}), bad, "alu.where");
  bad = b.g.make(Op::WHERE, dtypes::float32, {f, x, i});
  expect_violation(b.g, b.sink({bad}), bad, "alu.dtype");
  bad = b.g.make(Op::MULACC, dtypes::float32, {x, x, i});
  expect_violation(b.g, b.sink({bad}), bad, "alu.dtype");
  bad = b.g.make(Op::BITCAST, dtypes::int16, {x});
  expect_violation(b.g, b.sink({bad}), bad, "bitcast.dtype");
  bad = b.g.make(Op::BITCAST, dtypes::uint8, {b.g.make(Op::CAST, dtypes::bool_, {i})});
  expect_violation(b.g, b.sink({bad}), bad, "bitcast.dtype");
  // MAX / MIN / comparisons and AND / OR are defined on bool; MAX on float is.
  expect_valid(b.g, b.sink({b.g.alu(Op::MAX, {f, f}), b.g.alu(Op::AND, {f, f}), b.g.alu(Op::MAX, {x, x}),
                            b.g.make(Op::BITCAST, dtypes::int32, {x})}));
}

TEST(VerifierCatalogue, ConstantsAndVariables) {
  B b;
  const UOp* bad;
  bad = b.g.make(Op::CONST, dtypes::int8, {}, ConstValue::Int(300));
  expect_violation(b.g, b.sink({bad}), bad, "const.value");
  bad = b.g.make(Op::CONST, dtypes::int32, {}, ConstValue::Float(1.5));
  expect_violation(b.g, b.sink({bad}), bad, "const.value");
  bad = b.g.make(Op::CONST, dtypes::float32, {}, ConstValue::Float(0.1));  // not a float32 value
  expect_violation(b.g, b.sink({bad}), bad, "const.value");
  bad = b.g.make(Op::CONST, dtypes::float32, {b.g.idx(1)}, ConstValue::Float(1));
  expect_violation(b.g, b.sink({bad}), bad, "const.device");
  bad = b.g.make(Op::VCONST, dtypes::index.vec(3), {}, VConstArg{{ConstValue::Int(2), ConstValue::Int(3)}});
  expect_violation(b.g, b.sink({b.g.make(Op::RESHAPE, dtypes::float32, {b.buffer(6), bad})}), bad, "vconst.count");
  bad = b.var("n", 5, 1);
  expect_violation(b.g, b.sink({bad}), bad, "define_var.range");
  bad = b.g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"f", 0, 1});
  expect_violation(b.g, b.sink({bad}), bad, "define_var.dtype");
  const UOp* v = b.var("b", 1, 8);
  bad = b.g.make(Op::BIND, dtypes::index, {v, b.g.idx(9)});
  expect_violation(b.g, b.sink({bad}), bad, "bind.value");
  bad = b.g.make(Op::BIND, dtypes::index, {b.g.idx(1), b.g.idx(1)});
  expect_violation(b.g, b.sink({bad}), bad, "bind.var");
  bad = b.g.make(Op::BIND, dtypes::index, {v, b.g.cnst_int(dtypes::int32, 3)});
  expect_violation(b.g, b.sink({bad}), bad, "bind.dtype");
  const UOp* b3 = b.g.make(Op::BIND, dtypes::index, {v, b.g.idx(3)});
  bad = b.g.make(Op::BIND, dtypes::index, {v, b.g.idx(4)});
  expect_violation(b.g, b.sink({b.g.alu(Op::ADD, {b3, bad})}), bad, "bind.conflict");
}

TEST(VerifierCatalogue, Buffers) {
  B b;
  const UOp* u = b.g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{0});
  const UOp* bad;
  bad = b.g.make(Op::BUFFER, dtypes::float32, {b.dev, b.dev}, BufferArg{16});
  expect_violation(b.g, b.sink({bad}), bad, "buffer.src");
  bad = b.g.make(Op::BUFFER, dtypes::float32, {u, b.dev}, BufferArg{int64_t{1} << 41});
  expect_violation(b.g, b.sink({bad}), bad, "buffer.size");
  bad = b.g.make(Op::BUFFER, dtypes::float32, {u, b.dev}, BufferArg{-1});
  expect_violation(b.g, b.sink({bad}), bad, "buffer.size");
  bad = b.g.make(Op::BUFFER_VIEW, dtypes::float32, {b.buffer(16)}, BufferViewArg{10, 10});
  expect_violation(b.g, b.sink({bad}), bad, "buffer_view.range");
  bad = b.g.make(Op::COPY, dtypes::float32, {b.buffer(16), b.g.idx(0)});
  expect_violation(b.g, b.sink({bad}), bad, "copy.device");
  bad = b.g.make(Op::PARAM, dtypes::float32, {}, ParamArg{0, 16});
  expect_violation(b.g, b.sink({bad}), bad, "param.dtype", {.stage = Stage::Kernel});
  bad = b.g.make(Op::PARAM, dtypes::float32.ptr_to(AddrSpace::Global, 8), {}, ParamArg{0, 16});
  expect_violation(b.g, b.sink({bad}), bad, "param.size", {.stage = Stage::Kernel});
  bad = b.g.make(Op::DEFINE_LOCAL, dtypes::float32.ptr_to(AddrSpace::Global, 8), {}, IntArg{0});
  expect_violation(b.g, b.sink({bad}), bad, "define_local.dtype", {.stage = Stage::Kernel});
}

TEST(VerifierCatalogue, Shapes) {
  B b;
  const UOp* x = b.tensor({2, 3});
  const UOp* bad;
  bad = b.reshape(x, {4, 2});
  expect_violation(b.g, b.sink({bad}), bad, "shape.reshape");
  bad = b.expand(x, {4, 3});
  expect_violation(b.g, b.sink({bad}), bad, "shape.expand");
  bad = b.permute(x, {1, 1});
  expect_violation(b.g, b.sink({bad}), bad, "shape.permute");
  bad = b.g.make(Op::PAD, dtypes::float32, {x, b.shp({1}), b.shp({1})});
  expect_violation(b.g, b.sink({bad}), bad, "shape.pad");
  bad = b.g.make(Op::SHRINK, dtypes::float32, {x, b.shp({0, 0}), b.shp({3, 3})});
  expect_violation(b.g, b.sink({bad}), bad, "shape.shrink");
  bad = b.g.make(Op::FLIP, dtypes::float32, {x}, BoolsArg{{true, false, true}});
  expect_violation(b.g, b.sink({bad}), bad, "shape.flip");
  bad = b.reduce(x, {2});
  expect_violation(b.g, b.sink({bad}), bad, "shape.reduce_axis");
  bad = b.g.alu(Op::ADD, {x, b.permute(x, {1, 0})});
  expect_violation(b.g, b.sink({bad}), bad, "shape.alu");
  bad = b.reshape(b.buffer(1), std::vector<int64_t>(17, 1));
  expect_violation(b.g, b.sink({bad}), bad, "shape.rank");
  bad = b.expand(b.reshape(b.buffer(1), {1, 1}), {int64_t{1} << 32, int64_t{1} << 32});
  expect_violation(b.g, b.sink({bad}), bad, "shape.too_large");
  bad = b.reshape(b.buffer(6), {-2, -3});
  expect_violation(b.g, b.sink({bad}), bad, "shape.negative");
  VerifyOptions small;
  small.max_rank = 1;
  bad = x;  // the RESHAPE to (2, 3) is over a rank limit of 1
  expect_violation(b.g, b.sink({bad}), bad, "shape.rank", small);
  bad = b.reduce(b.g.alu(Op::CMPLT, {x, x}), {0});
  expect_violation(b.g, b.sink({bad}), bad, "reduce.domain");
  bad = b.g.make(Op::REDUCE_AXIS, dtypes::float64, {x}, ReduceAxisArg{ReduceOp::Add, {0}});
  expect_violation(b.g, b.sink({bad}), bad, "reduce.dtype");
  bad = b.g.make(Op::PERMUTE, dtypes::int32, {x}, IntsArg{{1, 0}});
  expect_violation(b.g, b.sink({bad}), bad, "passthrough.dtype");
}

TEST(VerifierCatalogue, Stages) {
  B b;
  const UOp* x = b.tensor({2, 3});
  const UOp* r = b.range(16);
  const UOp* bad;
  // Kernel ops in a tensor graph (detected as tensor by its RESHAPE).
  expect_violation(b.g, b.sink({x, b.p0}), b.p0, "stage.tensor_op");
  expect_violation(b.g, b.sink({x, r}), r, "stage.tensor_op");
  bad = b.shp({2, 3});
  expect_violation(b.g, b.sink({bad}), b.sink({bad}), "tensor.root");
  // Tensor ops in a kernel graph.
  bad = b.g.make(Op::RESHAPE, dtypes::float32, {b.load(b.p1, r), b.shp({1})});
  expect_violation(b.g, b.kernel(bad, r), bad, "stage.kernel_op", {.stage = Stage::Kernel});
  const UOp* buf = b.buffer(16);
  bad = b.g.alu(Op::ADD, {buf, b.f32(1)});
  expect_violation(b.g, b.kernel(bad, r), bad, "stage.kernel_op", {.stage = Stage::Kernel});
  EXPECT_EQ(detect_stage(b.kernel(bad, r)), Stage::Tensor);  // a BUFFER as a value is tensor-level
  bad = b.g.make(Op::CONTIGUOUS, dtypes::float32, {b.load(b.p1, r)});
  expect_violation(b.g, b.kernel(bad, r), bad, "stage.kernel_op");
}

TEST(VerifierCatalogue, KernelMemory) {
  B b;
  const UOp* r = b.range(16);
  const UOp* bad;
  bad = b.g.make(Op::INDEX, dtypes::float32, {b.f32(1), r});
  expect_violation(b.g, b.kernel(b.g.make(Op::LOAD, dtypes::float32, {b.f32(1), bad}), r), bad, "index.buffer");
  bad = b.g.make(Op::INDEX, dtypes::float32, {b.p1, b.f32(1)});
  expect_violation(b.g, b.kernel(b.g.make(Op::LOAD, dtypes::float32, {b.p1, bad}), r), bad, "index.index");
  bad = b.g.make(Op::INDEX, dtypes::float32, {b.p1, r, r});
  expect_violation(b.g, b.kernel(b.g.make(Op::LOAD, dtypes::float32, {b.p1, bad}), r), bad, "index.arity");
  bad = b.g.make(Op::INDEX, dtypes::int32, {b.p1, r});
  expect_violation(b.g, b.kernel(b.g.make(Op::LOAD, dtypes::int32, {b.p1, bad}), r), bad, "index.dtype");
  bad = b.g.make(Op::LOAD, dtypes::float32, {b.p1, r});
  expect_violation(b.g, b.kernel(bad, r), bad, "load.index");
  bad = b.g.make(Op::LOAD, dtypes::float32, {b.p0, b.index(b.p1, r)});
  expect_violation(b.g, b.kernel(bad, r), bad, "load.buffer");
  bad = b.g.make(Op::LOAD, dtypes::float32, {b.p0, b.index(b.g.make(Op::AFTER, b.fptr, {b.p1, b.p0}), r)});
  expect_violation(b.g, b.kernel(bad, r), bad, "load.buffer");
  bad = b.g.make(Op::INDEX, dtypes::float32, {b.p1});
  expect_violation(b.g, b.kernel(b.g.make(Op::LOAD, dtypes::float32, {b.p1, bad}), r), bad, "index.arity");
  bad = b.g.make(Op::LOAD, dtypes::float16, {b.p1, b.index(b.p1, r)});
  expect_violation(b.g, b.kernel(bad, r), bad, "load.dtype");
  const UOp* gi = b.g.make(Op::INDEX, dtypes::float32, {b.p1, r, b.g.alu(Op::CMPLT, {r, b.g.idx(8)})});
  bad = b.g.make(Op::LOAD, dtypes::float32, {b.p1, gi, b.g.cnst_int(dtypes::int32, 0)});
  expect_violation(b.g, b.kernel(bad, r), bad, "load.alt");
  bad = b.g.make(Op::STORE, dtypes::void_, {b.p0, b.f32(1), r});
  expect_violation(b.g, b.sink({bad}), bad, "store.index");
  bad = b.store(b.p0, r, b.g.cnst_int(dtypes::int32, 1), {r});
  expect_violation(b.g, b.sink({bad}), bad, "store.value");
  bad = b.store(b.p0, r, b.f32(1), {b.g.idx(3)});
  expect_violation(b.g, b.sink({bad}), bad, "store.range");
  bad = b.g.make(Op::REDUCE, dtypes::float32, {b.load(b.p1, r), b.g.idx(3)}, ReduceOpArg{ReduceOp::Add});
  expect_violation(b.g, b.kernel(bad, r), bad, "reduce.range");
  bad = b.g.make(Op::VECTORIZE, dtypes::float32.vec(2), {b.load(b.p1, r), b.g.cnst_int(dtypes::int32, 1)});
  expect_violation(b.g, b.kernel(b.g.make(Op::GEP, dtypes::float32, {bad}, IntsArg{{0}}), r), bad, "vectorize.dtype");
  const UOp* vec = b.g.make(Op::VECTORIZE, dtypes::float32.vec(2), {b.load(b.p1, r), b.f32(1)});
  bad = b.g.make(Op::GEP, dtypes::float32, {vec}, IntsArg{{5}});
  expect_violation(b.g, b.kernel(bad, r), bad, "gep.index");
  bad = b.g.make(Op::CAST, dtypes::int32, {vec});
  expect_violation(b.g, b.kernel(b.g.make(Op::CAST, dtypes::float32, {bad}), r), bad, "cast.dtype");
}

TEST(VerifierCatalogue, Ranges) {
  B b;
  const UOp* r = b.range(16);
  const UOp* bad;
  bad = b.g.make(Op::RANGE, dtypes::index, {b.f32(16)}, RangeArg{});
  expect_violation(b.g, b.kernel(b.load(b.p1, bad), bad), bad, "range.end");
  bad = b.g.make(Op::RANGE, dtypes::int32, {b.g.idx(16)}, RangeArg{});
  expect_violation(b.g, b.kernel(b.f32(1), bad), bad, "range.dtype");
  bad = b.g.make(Op::RANGE, dtypes::index, {b.g.idx(-1)}, RangeArg{});
  expect_violation(b.g, b.kernel(b.load(b.p1, bad), bad), bad, "range.end");
  bad = b.g.make(Op::RANGE, dtypes::index, {b.g.idx(4), b.g.idx(1)}, RangeArg{});
  expect_violation(b.g, b.kernel(b.load(b.p1, bad), bad), bad, "range.dep");
  bad = b.end(b.store(b.p0, r, b.f32(1)), {b.g.idx(0)});
  expect_violation(b.g, b.sink({bad}), bad, "end.range");
  bad = b.end(b.load(b.p1, r), {r});
  expect_violation(b.g, b.sink({bad}), bad, "end.computation");
  // A STORE that does not close the range its index uses, nor any END around it.
  bad = b.store(b.p0, r, b.load(b.p1, r));
  expect_violation(b.g, b.sink({bad}), bad, "range.unclosed");
  const UOp* r2 = b.range(16, 1);
  bad = b.store(b.p0, b.g.alu(Op::ADD, {r, r2}), b.f32(1), {r});
  expect_violation(b.g, b.sink({bad}), bad, "range.unclosed");
  bad = b.end(b.store(b.p0, b.g.alu(Op::ADD, {r, r2}), b.f32(1)), {r2});
  expect_violation(b.g, b.sink({bad}), bad, "range.unclosed");
  // A reduced range used again outside its REDUCE.
  const UOp* j = b.range(4, 3, AxisType::Reduce);
  const UOp* lj = b.load(b.p1, j);
  bad = b.store(b.p0, j, b.red(lj, j), {j});
  expect_violation(b.g, b.sink({bad}), bad, "range.escape");
  bad = b.g.alu(Op::ADD, {b.red(lj, j), lj});
  expect_violation(b.g, b.kernel(bad, r), bad, "range.escape");
  const UOp* outer = b.g.alu(Op::MUL, {b.red(lj, j), b.f32(2)});
  bad = b.g.alu(Op::ADD, {outer, b.load(b.p1, b.g.alu(Op::ADD, {r, j}))});
  expect_violation(b.g, b.kernel(bad, r), bad, "range.escape");
  // Too many ranges open at once.
  VerifyOptions one;
  one.max_open_ranges = 1;
  bad = b.g.alu(Op::ADD, {r, r2});
  expect_violation(b.g, b.sink({b.store(b.p0, bad, b.f32(1), {r, r2})}), bad, "range.too_many", one);
}

TEST(VerifierCatalogue, KernelRoot) {
  B b;
  const UOp* r = b.range(16);
  const UOp* st = b.store(b.p0, r, b.f32(1), {r});
  expect_violation(b.g, st, st, "kernel.root");
  const UOp* root = b.sink({b.load(b.p1, b.g.idx(0))});
  expect_violation(b.g, root, root, "kernel.root");
  const UOp* bad = b.g.make(Op::PROGRAM, dtypes::void_, {b.dev, b.sink({st})});
  expect_violation(b.g, bad, bad, "program.src");
}

TEST(VerifierCatalogue, Linear) {
  B b;
  const UOp* c16 = b.g.idx(16);
  const UOp* r = b.g.make(Op::RANGE, dtypes::index, {c16}, RangeArg{0, AxisType::Loop});
  const UOp* i1 = b.index(b.p1, r);
  const UOp* ld = b.g.make(Op::LOAD, dtypes::float32, {b.p1, i1});
  const UOp* i0 = b.index(b.p0, r);
  const UOp* st = b.g.make(Op::STORE, dtypes::void_, {i0, ld});
  const UOp* e = b.end(st, {r});
  // LOAD listed before its INDEX; a CONST never listed; an op listed twice.
  expect_violation(b.g, b.linear({b.p0, b.p1, c16, r, ld, i1, i0, st, e}), ld, "linear.order");
  expect_violation(b.g, b.linear({b.p0, b.p1, r, i1, ld, i0, st, e}), r, "linear.order");
  expect_violation(b.g, b.linear({b.p0, b.p1, c16, r, i1, ld, i1, i0, st, e}), i1, "linear.duplicate");
  // A loop never closed; an op using the range after its END.
  expect_violation(b.g, b.linear({b.p0, b.p1, c16, r, i1, ld, i0, st}), r, "linear.nesting");
  const UOp* late = b.g.alu(Op::NEG, {ld});
  expect_violation(b.g, b.linear({b.p0, b.p1, c16, r, i1, ld, i0, st, e, late}), late, "linear.scope");
  // A second loop using the first loop's range.
  const UOp* r9 = b.g.make(Op::RANGE, dtypes::index, {c16}, RangeArg{9, AxisType::Loop});
  const UOp* mixed = b.g.alu(Op::ADD, {r9, r});
  const UOp* e9 = b.end(b.g.make(Op::STORE, dtypes::void_, {b.index(b.p0, r9), b.f32(1)}), {r9});
  expect_violation(b.g, b.linear({b.p0, b.p1, c16, r, i1, ld, i0, st, e, r9, mixed, e9->src(0)->src(0), b.f32(1),
                                  e9->src(0), e9}),
                   mixed, "linear.scope");
  // Nesting: two loops closed inner-first in one END, or the outer one alone.
  const UOp* c4 = b.g.idx(4);
  const UOp* r0 = b.g.make(Op::RANGE, dtypes::index, {c4}, RangeArg{0, AxisType::Loop});
  const UOp* r1 = b.g.make(Op::RANGE, dtypes::index, {c4}, RangeArg{1, AxisType::Loop});
  const UOp* idx = b.g.alu(Op::ADD, {r0, r1});
  const UOp* j0 = b.index(b.p0, idx);
  const UOp* one = b.f32(1);
  const UOp* s1 = b.g.make(Op::STORE, dtypes::void_, {j0, one});
  const UOp* bad = b.end(s1, {r1, r0});
  expect_violation(b.g, b.linear({b.p0, c4, r0, r1, idx, j0, one, s1, bad}), bad, "linear.nesting");
  bad = b.end(s1, {r0});
  expect_violation(b.g, b.linear({b.p0, c4, r0, r1, idx, j0, one, s1, bad}), bad, "linear.nesting");
  // No REDUCE and no tensor ops at linear level.
  const UOp* red = b.red(ld, r);
  expect_violation(b.g, b.linear({b.p0, b.p1, c16, r, i1, ld, red}), red, "stage.linear_op");
  const UOp* rs = b.g.make(Op::RESHAPE, dtypes::float32, {ld, b.shp({1})});
  expect_violation(b.g, b.linear({b.p0, b.p1, c16, r, i1, ld, rs}), rs, "stage.linear_op", {.stage = Stage::Linear});
  // Declared linear, but not a LINEAR.
  const UOp* sink = b.sink({b.end(st, {r})});
  expect_violation(b.g, sink, sink, "linear.root", {.stage = Stage::Linear});
}

// The blocks the renderers emit: a value is usable only while the RANGE / IF it is listed
// in is open (definitions anywhere), IF / ENDIF nest with the loops, an INDEX is only read
// by a LOAD or written by a STORE, and a vector access over one scalar index.
TEST(VerifierCatalogue, LinearBlocks) {
  B b;
  const UOp* c16 = b.g.idx(16);
  const UOp* c1 = b.g.idx(1);
  const UOp* r = b.g.make(Op::RANGE, dtypes::index, {c16}, RangeArg{0, AxisType::Loop});
  // Listed inside the loop although it does not depend on it, then used after its END.
  const UOp* k = b.g.alu(Op::ADD, {c1, c1});
  const UOp* i0 = b.index(b.p0, r);
  const UOp* st = b.g.make(Op::STORE, dtypes::void_, {i0, b.f32(1)});
  const UOp* e = b.end(st, {r});
  const UOp* j = b.index(b.p0, k);
  const UOp* after = b.g.make(Op::STORE, dtypes::void_, {j, b.f32(1)});
  expect_violation(b.g, b.linear({b.p0, c16, c1, b.f32(1), r, k, i0, st, e, j, after}), j, "linear.scope");
  expect_valid(b.g, b.linear({b.p0, c16, c1, b.f32(1), k, r, i0, st, e, j, after}));
  // The same under an IF, and an IF left open, or closed by an END.
  const UOp* cond = b.g.cnst_bool(true);
  const UOp* iff = b.g.make(Op::IF, dtypes::void_, {cond});
  const UOp* endif = b.g.make(Op::ENDIF, dtypes::void_, {iff});
  expect_violation(b.g, b.linear({b.p0, c1, b.f32(1), cond, iff, k, endif, j, after}), j, "linear.scope");
  expect_valid(b.g, b.linear({b.p0, c1, b.f32(1), cond, k, iff, j, after, endif}));
  expect_violation(b.g, b.linear({b.p0, c1, b.f32(1), cond, k, iff, j, after}), iff, "linear.nesting");
  expect_violation(b.g, b.linear({b.p0, c16, b.f32(1), cond, r, iff, i0, st, e, endif}), e, "linear.nesting");
  // An INDEX used as a value.
  const UOp* as_value = b.g.make(Op::ADD, dtypes::float32, {j, j});
  expect_violation(b.g, b.linear({b.p0, c1, k, j, as_value}), as_value, "linear.operand");
  // Four consecutive elements over a scalar index, with one gate or one per element.
  const DType f4 = dtypes::float32.vec(4);
  const UOp* v4 = b.g.make(Op::INDEX, f4, {b.p1, c1});
  const UOp* ld = b.g.make(Op::LOAD, f4, {b.p1, v4});
  const UOp* st4 = b.g.make(Op::STORE, dtypes::void_, {b.g.make(Op::INDEX, f4, {b.p0, c1}), ld});
  expect_valid(b.g, b.linear({b.p0, b.p1, c1, v4, ld, st4->src(0), st4}));
  const UOp* gates2 = b.g.make(Op::VECTORIZE, dtypes::bool_.vec(2), {cond, cond});
  const UOp* bad_gate = b.g.make(Op::INDEX, f4, {b.p1, c1, gates2});
  expect_violation(b.g, b.linear({b.p1, c1, cond, gates2, bad_gate}), bad_gate, "index.gate");
  const UOp* gates4 = b.g.make(Op::VECTORIZE, dtypes::bool_.vec(4), {cond, cond, cond, cond});
  expect_valid(b.g, b.linear({b.p0, b.p1, c1, cond, gates4, b.g.make(Op::INDEX, f4, {b.p1, c1, gates4})}));
}

TEST(Verifier, DetectStage) {
  B b;
  const UOp* r = b.range(4);
  EXPECT_EQ(detect_stage(b.sink({b.tensor({2, 2})})), Stage::Tensor);
  EXPECT_EQ(detect_stage(b.sink({b.buffer(4)})), Stage::Tensor);
  EXPECT_EQ(detect_stage(b.kernel(b.load(b.p1, r), r)), Stage::Kernel);
  EXPECT_EQ(detect_stage(b.linear({})), Stage::Linear);
  EXPECT_EQ(stage_name(Stage::Kernel), "kernel");
}

}  // namespace
}  // namespace uop
