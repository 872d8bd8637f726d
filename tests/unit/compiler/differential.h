// The differential harness: a tensor-level graph is compiled and run in process
// (LocalRunner: the whole pipeline, then LLVM for this CPU) and evaluated by the reference
// interpreter, and every output is compared. Used by the corpus, the random graph test and
// the dedup test; header-only so each test file stays self-contained.
//
// Tolerances follow the backend's contract (compiler/codegen/llvm_cpu.h): everything but
// the transcendentals is bit for bit what ir/eval.h says, NaN payloads aside. So an
// `exact` float check here is stricter than compare()'s Tolerance::exact(), which lets
// -0.0 equal +0.0: it also wants the sign of every zero.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "compiler/ir/printer.h"
#include "local/local_runner.h"
#include "tests/unit/compiler/random_graph.h"

namespace uop::difftest {

using Inputs = absl::flat_hash_map<const UOp*, HostTensor>;

// What one output must satisfy, and a name for messages.
struct OutputCheck {
  std::string label;
  Tolerance tol = Tolerance::exact();
};

// The documented bound of the transcendentals (llvm_cpu.h): 1 ULP of the result type.
inline Tolerance ulp_bound(int64_t ulps = 1) { return Tolerance{0, 0, ulps}; }

// Unit roundoff of a float type: half an ULP of 1.
inline double unit_roundoff(Scalar s) {
  switch (s) {
    case Scalar::Float16: return 0x1p-11;
    case Scalar::BFloat16: return 0x1p-8;
    case Scalar::Float32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

// Float Add / Mul reductions may be reassociated (PIPELINE.md). Any order of n additions
// is within (n - 1) u sum|terms| of the exact sum, so two orders are within twice that
// (Higham, Accuracy and Stability of Numerical Algorithms, 4.2): an absolute bound that
// follows the terms, not the result, which a cancelling sum needs. A product's rounding
// is relative, (n - 1) u per order. Both widen the defaults, never narrow them.
inline Tolerance add_reduction(Scalar s, int64_t n, double sum_abs) {
  Tolerance t = Tolerance::for_dtype(s);
  t.atol = std::max(t.atol, 2.0 * static_cast<double>(std::max<int64_t>(n - 1, 0)) * unit_roundoff(s) * sum_abs);
  return t;
}
inline Tolerance mul_reduction(Scalar s, int64_t n) {
  Tolerance t = Tolerance::for_dtype(s);
  t.rtol = std::max(t.rtol, 2.0 * static_cast<double>(std::max<int64_t>(n - 1, 0)) * unit_roundoff(s) * 1.01);
  return t;
}

inline bool is_exact(const Tolerance& t) { return t.rtol == 0 && t.atol == 0 && t.max_ulp == 0; }

// "" when `got` matches `want` under `tol`, else why not. Exact float checks compare bit
// patterns, with any NaN equal to any NaN.
inline std::string compare_output(const HostTensor& want, const HostTensor& got, const Tolerance& tol) {
  CompareResult c = compare(want, got, tol);
  if (!c.ok) return c.message;
  if (!is_exact(tol) || !scalar_is_float(want.dtype)) return "";
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (want.get_bits(i) == got.get_bits(i)) continue;
    if (std::isnan(want.get(i).as_float()) && std::isnan(got.get(i).as_float())) continue;
    return cat("element ", i, ": expected ", want.get(i).str(), " (bits ", want.get_bits(i), "), got ",
               got.get(i).str(), " (bits ", got.get_bits(i), ")");
  }
  return "";
}

struct RunStats {
  int kernels = 0;   // kernels launched
  int compiled = 0;  // of those, compiled now (the rest were in the runner's cache)
};

// Runs `sink` both ways and compares output i under checks[i] (missing checks: the
// defaults of Tolerance::for_dtype). Returns "" when everything matches, else one line per
// problem: a status from either side, or an output that differs.
inline std::string check_graph(LocalRunner& runner, Graph& g, const UOp* sink, const Inputs& inputs,
                               const std::vector<OutputCheck>& checks = {}, RunStats* stats = nullptr) {
  auto want = interpret(g, sink, inputs);
  if (!want.ok()) return cat("interpreter: ", want.status().ToString());
  std::vector<KernelReport> report;
  auto got = runner.run(g, sink, inputs, &report);
  if (!got.ok()) return cat("compiled: ", got.status().ToString());
  if (stats) {
    stats->kernels += static_cast<int>(report.size());
    for (const KernelReport& r : report) stats->compiled += r.compiled ? 1 : 0;
  }
  if (got->size() != want->size()) return cat("compiled run gave ", got->size(), " outputs, interpreter ", want->size());
  std::string out;
  for (size_t i = 0; i < want->size(); ++i) {
    Tolerance tol = i < checks.size() ? checks[i].tol : Tolerance::for_dtype((*want)[i].dtype);
    std::string label = i < checks.size() ? checks[i].label : cat("output ", i);
    std::string why = compare_output((*want)[i], (*got)[i], tol);
    if (!why.empty()) out += cat(label, ": ", why, "\n");
  }
  return out;
}

// Random contents for every input of a TensorBuilder graph (HostTensor::random: small ints,
// floats in [-2, 2]), seeded by position.
inline Inputs random_inputs(const TensorBuilder& tb, const std::vector<const UOp*>& inputs, uint64_t seed) {
  Inputs in;
  for (const UOp* x : inputs) {
    const UOp* buf = tb.buffer_of(x);
    in[buf] = HostTensor::random(buf->dtype().scalar, {buf->arg_as<BufferArg>().size}, seed++);
  }
  return in;
}

// Integers in [lo, hi] as values of `s` (any dtype): float sums and products of these stay
// exact in any order while they are small, so reductions over them compare bit for bit.
inline HostTensor small_ints(Scalar s, std::vector<int64_t> shape, uint64_t seed, int64_t lo = -3, int64_t hi = 3) {
  HostTensor t = HostTensor::zeros(s, shape);
  uint64_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ULL;
    t.set(i, ConstValue::Int(lo + static_cast<int64_t>((z ^ (z >> 29)) % static_cast<uint64_t>(hi - lo + 1))));
  }
  return t;
}

// ---------------------------------------------------------------------------------------
// Values that find bugs: the edges of every dtype (zeros of both signs, ±1, the extremes,
// infinities, NaN, subnormals, halves that round to even, powers of two around the
// integer types' limits) followed by random values. `wide` adds random bit patterns over
// the whole type (NaN patterns are left out: their payloads are outside the contract).

inline std::vector<ConstValue> edge_values(Scalar s) {
  std::vector<ConstValue> v;
  auto F = [&](double d) { v.push_back(ConstValue::Float(d)); };
  if (s == Scalar::Bool) return {ConstValue::Bool(false), ConstValue::Bool(true)};
  if (scalar_is_float(s)) {
    for (double d : {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 0.1, -7.75, 100.0, 1e4, -3e4,
                     65504.0, 65519.0, 65520.0, 127.0, 128.0, 255.0, 256.0, -129.0, 2147483647.0,
                     2147483648.0, -2147483649.0, 4294967296.0, 9.2233720368547758e18, -9.3e18,
                     1.9e19, 3e38, -3.4e38, 1e-3, 1e-8, 1e-40, -1e-42, 1e-310, 1e300})
      F(d);
    F(INFINITY), F(-INFINITY), F(NAN);
    // Narrow types' own extremes: the largest finite value and the smallest subnormal.
    if (s == Scalar::Float16) F(6.103515625e-05), F(5.9604644775390625e-08), F(-2.9802322387695312e-08);
    if (s == Scalar::BFloat16) F(3.3895313892515355e+38), F(9.183549615799121e-41);
    for (ConstValue& c : v) c = cast_value(c, s);  // rounded to the type (may become inf / 0)
    return v;
  }
  const int nb = scalar_bits(s);
  const bool sgn = scalar_is_signed_int(s);
  uint64_t max = sgn ? (uint64_t{1} << (nb - 1)) - 1 : (nb == 64 ? ~uint64_t{0} : (uint64_t{1} << nb) - 1);
  auto U = [&](uint64_t bits) { v.push_back(bits_to_value(bits, s)); };
  for (uint64_t b : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, max, max - 1, max + 1,
                     max + 2, ~uint64_t{0}, ~uint64_t{1}, uint64_t{16}, static_cast<uint64_t>(nb - 1), static_cast<uint64_t>(nb)})
    U(b);
  U(static_cast<uint64_t>(-5)), U(static_cast<uint64_t>(-8)), U(max / 3);
  return v;
}

inline uint64_t mix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A tensor whose first elements are edge_values(dtype), cycled when the tensor is shorter
// than the list, then random values: HostTensor::random's, and with `wide` every other
// one a random bit pattern of the type.
inline HostTensor edge_tensor(Scalar s, std::vector<int64_t> shape, uint64_t seed, bool wide = true) {
  HostTensor t = HostTensor::random(s, shape, seed);
  std::vector<ConstValue> edges = edge_values(s);
  uint64_t state = seed * 7919 + 1;
  int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<size_t>(i) < edges.size()) {
      // Spread the edges over the tensor so every dim sees some.
      t.set(i, edges[(i + seed) % edges.size()]);
      continue;
    }
    if (!wide || s == Scalar::Bool || i % 2) continue;
    uint64_t bits = mix64(state);
    ConstValue v = bits_to_value(bits, s);
    if (scalar_is_float(s) && std::isnan(v.as_float())) continue;
    t.set_bits(i, value_to_bits(v, s));
  }
  return t;
}

inline const std::vector<Scalar>& all_dtypes() {
  static const std::vector<Scalar> kAll = {Scalar::Bool,    Scalar::Int8,     Scalar::Int16,   Scalar::Int32,
                                           Scalar::Int64,   Scalar::UInt8,    Scalar::UInt16,  Scalar::UInt32,
                                           Scalar::UInt64,  Scalar::Float16,  Scalar::BFloat16, Scalar::Float32,
                                           Scalar::Float64};
  return kAll;
}

// Whether eval.h defines `op` on operands of `s` (what the verifier accepts).
inline bool op_defined_on(Op op, Scalar s) {
  if (op == Op::WHERE) return true;
  ConstValue zero = cast_value(ConstValue::Int(0), s);
  ConstValue args[3] = {zero, zero, zero};
  return eval_alu(op, s, std::span<const ConstValue>(args, op_info(op).min_src)).has_value();
}

// The random graph of `seed` (random_graph.h) checked, its inputs random (edge values
// for the wide ones), each output under the tolerance the generator derived: "" when
// it matches, else what differs and the graph.
inline std::string check_random_graph(LocalRunner& runner, uint64_t seed, RunStats* stats) {
  Graph g;
  TensorBuilder tb(g);
  randgraph::RandomGraph rg = randgraph::generate(tb, seed);
  std::vector<OutputCheck> checks;
  for (size_t i = 0; i < rg.tolerances.size(); ++i) checks.push_back({cat("output ", i, " ", rg.notes[i]), rg.tolerances[i]});
  Inputs in = random_inputs(tb, rg.inputs, seed * 1000);
  for (size_t i = 0; i < rg.inputs.size(); ++i) {
    if (!rg.wide[i]) continue;
    HostTensor& t = in.at(tb.buffer_of(rg.inputs[i]));
    t = edge_tensor(t.dtype, t.shape, seed * 1000 + i, true);
  }
  std::string why = check_graph(runner, g, rg.sink, in, checks, stats);
  if (why.empty()) return "";
  if (why.back() != '\n') why += '\n';
  return cat(why, print_tree(rg.sink));
}

}  // namespace uop::difftest
