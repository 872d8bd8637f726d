// The corpus the CUDA backend is checked on: the kernel corpus of the CPU benchmarks
// (tests/bench/kernel_corpus.h: elementwise chains, reductions, matmuls, movement ops),
// every ALU op on every dtype over the edge values of the CPU differential harness
// (tests/unit/compiler/differential.h), every CAST and BITCAST, float16 / bfloat16
// matmuls (the tensor-core path) and a batch bound at run time (a LaunchExpr over a
// DEFINE_VAR). cuda_compile_test renders and compiles each for sm_80 and sm_90 with
// NVRTC; cuda_gpu_test runs each on the GPU against the reference interpreter.
// Header-only, like differential.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compiler/ir/shape.h"
#include "tests/bench/kernel_corpus.h"
#include "tests/unit/compiler/differential.h"

namespace uop::cudatest {

using difftest::Inputs;

struct Case {
  std::string name;
  std::unique_ptr<Graph> g = std::make_unique<Graph>();
  const UOp* sink = nullptr;
  Inputs inputs;
  std::vector<Tolerance> tols;  // per output; missing: Tolerance::for_dtype
};

inline const std::vector<Op>& unary_ops() {
  static const std::vector<Op> k = {Op::NEG, Op::RECIPROCAL, Op::SQRT, Op::EXP2, Op::LOG2, Op::SIN, Op::TRUNC};
  return k;
}
inline const std::vector<Op>& binary_ops() {
  static const std::vector<Op> k = {Op::ADD, Op::SUB,   Op::MUL,   Op::FDIV,  Op::IDIV, Op::MOD, Op::MAX,
                                    Op::MIN, Op::CMPLT, Op::CMPNE, Op::CMPEQ, Op::AND,  Op::OR,  Op::XOR,
                                    Op::SHL, Op::SHR,   Op::POW};
  return k;
}
inline bool transcendental(Op op) {
  return op == Op::EXP2 || op == Op::LOG2 || op == Op::SIN || op == Op::POW;
}
// The backend's documented bounds (codegen/cuda.h): narrow types and float32 through
// float64 functions rounded once (1 ULP of the result type); float64 with CUDA's own,
// up to 2 ULP, against the interpreter's libm (itself within 1).
inline Tolerance transcendental_tol(Scalar s) { return Tolerance{0, 0, s == Scalar::Float64 ? 3 : 1}; }

// Per kernel-corpus graph: the longest reduction and the largest |term|, for the
// reassociation bound of an Add reduction (differential.h add_reduction).
inline Tolerance corpus_tol(const std::string& name) {
  struct R { const char* name; int64_t n; double term; bool mul; };
  static const R kReductions[] = {
      {"sum_rows", 256, 2, false},  {"sum_cols", 256, 2, false},       {"sum_all", 65536, 2, false},
      {"row_norm", 128, 4, false},  {"center_rows", 96, 2, false},     {"softmax", 100, 1, false},
      {"matmul_32", 32, 4, false},  {"matmul_64x128x32", 128, 4, false}, {"batched_matmul", 32, 4, false},
      {"matvec", 256, 4, false},    {"linear_relu", 128, 4, false},    {"prod_rows", 64, 2, true},
  };
  Tolerance t = Tolerance::for_dtype(Scalar::Float32);
  for (const R& r : kReductions)
    if (name == r.name) {
      Tolerance red = r.mul ? difftest::mul_reduction(Scalar::Float32, r.n)
                            : difftest::add_reduction(Scalar::Float32, r.n, static_cast<double>(r.n) * r.term);
      t.atol = std::max(t.atol, red.atol);
      t.rtol = std::max(t.rtol, red.rtol);
    }
  // Transcendentals (exp2_log2, sin_pow, softmax): 1 ULP each, composed.
  t.max_ulp = 8;
  return t;
}

// "" when `got` has `want`'s outputs, each within the case's tolerance, else one line per
// output that is not.
inline std::string compare_outputs(const Case& c, const std::vector<HostTensor>& want,
                                   const std::vector<HostTensor>& got) {
  if (got.size() != want.size()) return cat(got.size(), " outputs, expected ", want.size());
  std::string out;
  for (size_t i = 0; i < want.size(); ++i) {
    Tolerance tol = i < c.tols.size() ? c.tols[i] : Tolerance::for_dtype(want[i].dtype);
    if (std::string why = difftest::compare_output(want[i], got[i], tol); !why.empty())
      out += cat("output ", i, ": ", why, "\n");
  }
  return out;
}

inline const UOp* input(Case& c, TensorBuilder& tb, Scalar s, std::vector<int64_t> shape, HostTensor data) {
  const UOp* x = tb.input(s, std::move(shape));
  data.shape = {data.numel()};
  c.inputs[tb.buffer_of(x)] = std::move(data);
  return x;
}

inline std::vector<Case> corpus() {
  std::vector<Case> out;
  // 1. The kernel corpus, on HostTensor::random inputs.
  for (const CorpusGraph& cg : kernel_corpus()) {
    Case c;
    c.name = cg.name;
    TensorBuilder tb(*c.g);
    c.sink = cg.build(tb);
    uint64_t seed = 1;
    for (const UOp* u : toposort(c.sink))
      if (u->op() == Op::BUFFER)
        c.inputs[u] = HostTensor::random(u->dtype().scalar, {u->arg_as<BufferArg>().size}, seed++);
    for (size_t i = 0; i < c.sink->num_src(); ++i) c.tols.push_back(corpus_tol(c.name));
    out.push_back(std::move(c));
  }
  // 2. Every ALU op on every dtype, over every pair of edge values (dense operands).
  constexpr int64_t P = 47;
  for (Scalar s : difftest::all_dtypes()) {
    Case c;
    c.name = cat("alu_", scalar_name(s));
    TensorBuilder tb(*c.g);
    HostTensor e = difftest::edge_tensor(s, {P}, 1), xd = HostTensor::zeros(s, {P * P}), yd = HostTensor::zeros(s, {P * P});
    for (int64_t i = 0; i < P * P; ++i) {
      xd.set_bits(i, e.get_bits(i / P));
      yd.set_bits(i, e.get_bits(i % P));
    }
    const UOp* x = input(c, tb, s, {P, P}, xd);
    const UOp* y = input(c, tb, s, {P, P}, yd);
    const UOp* z = input(c, tb, s, {P, P}, difftest::edge_tensor(s, {P * P}, 3));
    const UOp* cond = input(c, tb, Scalar::Bool, {P, P}, HostTensor::random(Scalar::Bool, {P * P}, 4));
    std::vector<const UOp*> outs;
    auto add = [&](const UOp* o, Op op) {
      outs.push_back(o);
      c.tols.push_back(transcendental(op) ? transcendental_tol(s) : Tolerance::exact());
    };
    for (Op op : unary_ops())
      if (difftest::op_defined_on(op, s)) add(tb.alu(op, {z}), op);
    for (Op op : binary_ops())
      if (difftest::op_defined_on(op, s)) add(tb.alu(op, {x, y}), op);
    add(tb.alu(Op::WHERE, {cond, x, y}), Op::WHERE);
    if (difftest::op_defined_on(Op::MULACC, s)) add(tb.alu(Op::MULACC, {x, y, z}), Op::MULACC);
    c.sink = tb.sink(outs);
    out.push_back(std::move(c));
  }
  // 3. CAST from every dtype to every dtype; BITCAST to every other dtype of its width.
  for (Scalar s : difftest::all_dtypes()) {
    Case c;
    c.name = cat("cast_from_", scalar_name(s));
    TensorBuilder tb(*c.g);
    const UOp* x = input(c, tb, s, {P * 4}, difftest::edge_tensor(s, {P * 4}, 7));
    std::vector<const UOp*> outs;
    for (Scalar t : difftest::all_dtypes()) {
      if (t == s) continue;
      outs.push_back(tb.cast(x, t));
      c.tols.push_back(Tolerance::exact());
      if (s != Scalar::Bool && t != Scalar::Bool && scalar_bits(s) == scalar_bits(t)) {
        outs.push_back(tb.bitcast(x, t));
        c.tols.push_back(Tolerance::exact());
      }
    }
    c.sink = tb.sink(outs);
    out.push_back(std::move(c));
  }
  // 4. Matmuls on float16 / bfloat16 (tensor cores on sm_80+), with small integers so every
  // order of the sum is exact; one batched (blockIdx.z), one widened to float32.
  struct Mm { const char* name; Scalar s; std::vector<int64_t> a, b; bool widen; };
  for (const Mm& m : {Mm{"matmul_f16", Scalar::Float16, {64, 64}, {64, 128}, false},
                      Mm{"matmul_bf16", Scalar::BFloat16, {32, 128}, {128, 64}, false},
                      Mm{"matmul_f16_batched", Scalar::Float16, {3, 32, 48}, {3, 48, 16}, false},
                      Mm{"matmul_f16_to_f32", Scalar::Float16, {48, 32}, {32, 40}, true},
                      Mm{"matmul_f16_odd", Scalar::Float16, {10, 12}, {12, 6}, false}}) {
    Case c;
    c.name = m.name;
    TensorBuilder tb(*c.g);
    auto numel = [](const std::vector<int64_t>& v) {
      int64_t n = 1;
      for (int64_t d : v) n *= d;
      return n;
    };
    const UOp* a = input(c, tb, m.s, m.a, difftest::small_ints(m.s, {numel(m.a)}, 11));
    const UOp* b = input(c, tb, m.s, m.b, difftest::small_ints(m.s, {numel(m.b)}, 12));
    if (m.widen) a = tb.cast(a, Scalar::Float32), b = tb.cast(b, Scalar::Float32);
    c.sink = tb.sink({tb.matmul(a, b)});
    c.tols.push_back(Tolerance::exact());
    out.push_back(std::move(c));
  }
  // 5. A batch bound at run time: the grid is a LaunchExpr over the variable.
  for (int64_t batch : {1, 5}) {
    Case c;
    c.name = cat("symbolic_batch_", batch);
    Graph& g = *c.g;
    constexpr int64_t kMax = 300;
    const UOp* dev = g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{"CPU:0"}});
    const UOp* buf = g.make(Op::BUFFER, dtypes::float32, {g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{0}), dev},
                            BufferArg{kMax * 70});
    const UOp* b = g.make(Op::BIND, dtypes::index,
                          {g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"b", 1, kMax}), g.idx(batch * 60)});
    const UOp* n = g.alu(Op::MUL, {b, g.idx(70)});
    const UOp* v = g.make(Op::SHRINK, dtypes::float32, {buf, make_shape_operand(g, {g.idx(0)}), make_shape_operand(g, {n})});
    const UOp* x = g.make(Op::RESHAPE, dtypes::float32, {v, make_shape_operand(g, {b, g.idx(70)})});
    const UOp* two = g.make(Op::EXPAND, dtypes::float32,
                            {g.make(Op::RESHAPE, dtypes::float32, {g.cnst(dtypes::float32, 2.0), make_shape_operand(g, {g.idx(1), g.idx(1)})}),
                             make_shape_operand(g, {b, g.idx(70)})});
    const UOp* rowsum = g.make(Op::REDUCE_AXIS, dtypes::float32, {x}, ReduceAxisArg{ReduceOp::Add, {1}});
    c.sink = g.make(Op::SINK, dtypes::void_, {g.alu(Op::MUL, {x, two}), rowsum});
    c.inputs[buf] = HostTensor::random(Scalar::Float32, {kMax * 70}, 21);
    c.tols = {Tolerance::exact(), difftest::add_reduction(Scalar::Float32, 70, 140)};
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace uop::cudatest
