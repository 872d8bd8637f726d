// The e2e tests' small model: a matmul, a bias and a softmax over rows (three kernels:
// matmul + bias, and the two reductions), with random inputs and the interpreter's answer.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "client/client.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"

namespace uop::testing {

struct SoftmaxModel {
  Graph g;
  const UOp* root = nullptr;
  Names names;
  absl::flat_hash_map<const UOp*, HostTensor> inputs;  // by BUFFER
  std::vector<client::Input> bindings;

  explicit SoftmaxModel(uint64_t seed, int64_t n = 24, int64_t k = 16, int64_t m = 8) {
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {n, k});
    const UOp* w = tb.input(Scalar::Float32, {k, m});
    const UOp* b = tb.input(Scalar::Float32, {m});
    const UOp* h = tb.alu(Op::ADD, {tb.matmul(x, w), b});
    const UOp* mx = tb.reduce(h, ReduceOp::Max, {1});
    const UOp* e = tb.alu(Op::EXP2, {tb.alu(Op::SUB, {h, mx})});
    const UOp* out = tb.alu(Op::FDIV, {e, tb.reduce(e, ReduceOp::Add, {1})});
    root = tb.sink({out});
    names = {{"x", tb.buffer_of(x)}, {"w", tb.buffer_of(w)}, {"b", tb.buffer_of(b)}, {"probs", out}};
    for (auto& [name, node] : names) {
      if (node->op() != Op::BUFFER) continue;
      HostTensor t = HostTensor::random(Scalar::Float32, {node->arg_as<BufferArg>().size}, seed++);
      inputs[node] = t;
      bindings.push_back({name, t});
    }
  }
  // The interpreter's answer, worked out once: interpreting adds nodes to `g`, so tests
  // that run one model from several threads would otherwise grow its arena at once.
  std::vector<HostTensor> expected() {
    std::call_once(expected_once_, [&] {
      auto want = interpret(g, root, inputs);
      EXPECT_TRUE(want.ok()) << want.status();
      if (want.ok()) expected_ = *std::move(want);
    });
    return expected_;
  }

 private:
  std::once_flag expected_once_;
  std::vector<HostTensor> expected_;
};

// Runs the model in a new session on `device`: OK when the results match the
// interpreter's, the failure otherwise.
inline absl::Status run_softmax(client::Client& c, const std::string& device, uint64_t seed) {
  auto session = c.create_session({device});
  if (!session.ok()) return session.status();
  SoftmaxModel m(seed);
  auto got = session->run(m.root, m.names, m.bindings);
  if (!got.ok()) return got.status();
  std::vector<HostTensor> want = m.expected();
  if (want.size() != got->outputs.size()) return absl::InternalError("wrong number of outputs");
  for (size_t i = 0; i < want.size(); ++i) {
    CompareResult r = compare(want[i], got->outputs[i].tensor);
    if (!r.ok) return absl::InternalError(got->outputs[i].name + ": " + r.message);
  }
  return absl::OkStatus();
}

}  // namespace uop::testing
