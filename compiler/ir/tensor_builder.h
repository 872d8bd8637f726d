// TensorBuilder: builds tensor-level graphs (compiler/ir/README.md "Tensor level") with
// constant shapes, tracking each value's shape so callers write `add(a, b)` instead of
// spelling RESHAPE / EXPAND operands by hand. Used by tests, benchmarks, the random graph
// generator and the client's frontends. Shapes are checked with assertions: a builder
// call with inconsistent shapes is a bug in the caller, not input from the network.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/uop.h"

namespace uop {

class TensorBuilder {
 public:
  explicit TensorBuilder(Graph& g, std::string device = "CPU:0");

  Graph& graph() { return g_; }
  const std::vector<int64_t>& shape(const UOp* x) const { return shapes_.at(x); }
  // Null for a node the builder did not make.
  const std::vector<int64_t>* shape_if(const UOp* x) const {
    auto it = shapes_.find(x);
    return it == shapes_.end() ? nullptr : &it->second;
  }
  int64_t numel(const UOp* x) const;

  // A new input BUFFER of `numel(shape)` elements (UNIQUE ids count up from 0), viewed as
  // `shape`. buffer_of() gives the BUFFER behind an input.
  const UOp* input(Scalar dtype, std::vector<int64_t> shape);
  const UOp* buffer_of(const UOp* input) const { return buffers_.at(input); }
  // A constant of `shape` (a CONST broadcast with RESHAPE + EXPAND).
  const UOp* full(Scalar dtype, ConstValue v, std::vector<int64_t> shape);
  const UOp* full(Scalar dtype, double v, std::vector<int64_t> shape) { return full(dtype, ConstValue::Float(v), std::move(shape)); }

  const UOp* reshape(const UOp* x, std::vector<int64_t> shape);
  const UOp* expand(const UOp* x, std::vector<int64_t> shape);
  const UOp* permute(const UOp* x, std::vector<int64_t> axes);
  const UOp* pad(const UOp* x, std::vector<int64_t> begins, std::vector<int64_t> ends);
  const UOp* shrink(const UOp* x, std::vector<int64_t> begins, std::vector<int64_t> ends);
  const UOp* flip(const UOp* x, std::vector<bool> axes);
  // Keeps reduced axes as 1, as REDUCE_AXIS does.
  const UOp* reduce(const UOp* x, ReduceOp op, std::vector<int64_t> axes);
  const UOp* contiguous(const UOp* x);

  // Elementwise ops. Operands are broadcast NumPy-style (align trailing dims, expand 1s).
  const UOp* alu(Op op, std::initializer_list<const UOp*> src);
  const UOp* cast(const UOp* x, Scalar to);
  const UOp* bitcast(const UOp* x, Scalar to);
  // Broadcasts `x` to `shape` (NumPy rules).
  const UOp* broadcast_to(const UOp* x, const std::vector<int64_t>& shape);

  // matmul of [.., m, k] x [.., k, n] as RESHAPE + EXPAND + MUL + REDUCE_AXIS.
  const UOp* matmul(const UOp* a, const UOp* b);

  const UOp* sink(std::initializer_list<const UOp*> outputs);
  const UOp* sink(const std::vector<const UOp*>& outputs);

 private:
  const UOp* shaped(const UOp* u, std::vector<int64_t> shape);
  const UOp* shape_operand(const std::vector<int64_t>& dims);

  Graph& g_;
  const UOp* device_;
  int64_t next_unique_ = 0;
  absl::flat_hash_map<const UOp*, std::vector<int64_t>> shapes_;
  absl::flat_hash_map<const UOp*, const UOp*> buffers_;
};

}  // namespace uop
