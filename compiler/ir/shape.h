// Tensor-level shapes (compiler/ir/README.md, "Tensor level"). A shape is a list of dims;
// each dim is an index-typed node: a CONST, or an index expression over DEFINE_VAR / BIND
// for symbolic dims (a batch size bound at run time). Dims are ordinary nodes of the
// Graph, so equal constant dims are the same pointer and rangeify can use them directly.
//
// ShapeInference checks the README's rules and the size limits (rank, element count): a
// graph from the network with an absurd shape is refused here, never overflowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/ir/dim.h"
#include "compiler/ir/uop.h"

namespace uop {

using Shape = std::vector<const UOp*>;

struct ShapeLimits {
  int max_rank = 16;
  int64_t max_elements = int64_t{1} << 40;  // per tensor, at every symbolic dim's maximum
};

// The dims of a shape when every one is constant, nullopt otherwise.
std::optional<std::vector<int64_t>> const_shape(const Shape& s);

// The dims of a shape operand: a VCONST of index values (its dims become CONST nodes made
// in `g`), a VECTORIZE of index scalars, or, for rank 1, any index scalar. Only the form
// is checked here; ShapeInference checks that each dim is an index expression >= 0.
absl::StatusOr<Shape> shape_operand_dims(Graph& g, const UOp* s);
// The canonical operand for a shape: VCONST when every dim is constant, else VECTORIZE;
// rank 0 is an empty VCONST of dtype index width 0.
const UOp* make_shape_operand(Graph& g, const Shape& s);

// The product of the dims (CONST 1 for rank 0).
const UOp* shape_numel(Graph& g, const Shape& s);

class ShapeInference {
 public:
  // `index` numbers nodes in messages; without one, the toposort of the queried node.
  explicit ShapeInference(Graph& g, ShapeLimits limits = {}, const NodeIndex* index = nullptr);

  // The shape of a tensor-level value, memoized. Iterative: graphs are 100k+ nodes deep.
  // INVALID_ARGUMENT "node N (OP): what [shape.rule]" when it (or a value below it) is
  // ill-shaped or over the limits.
  absl::StatusOr<const Shape*> shape(const UOp* u);
  // Whether u is a tensor-level value, i.e. has a shape: BUFFER, BUFFER_VIEW, CONST,
  // DEFINE_VAR, BIND, movement ops, REDUCE_AXIS, ALU ops, CAST, BITCAST, CONTIGUOUS,
  // CONTIGUOUS_BACKWARD, DETACH, COPY, PRECAST, ALLREDUCE, and AFTER of one of these.
  // Not: shape operands (VCONST, VECTORIZE), DEVICE, UNIQUE, SINK, kernel-level ops.
  bool has_shape(const UOp* u) const;

  // The node at which the last failed shape() call failed, and the message without the
  // "node N (OP): " prefix (the verifier names the node itself).
  struct Failure {
    const UOp* node = nullptr;
    std::string detail;  // "element count 6 != 8 [shape.reshape]"
  };
  const Failure* last_failure() const { return last_ < failed_.size() ? &failed_[last_] : nullptr; }

 private:
  // Bounds of a dim expression, nullopt when it is not one (memoized per node).
  std::optional<DimBounds> facts(const UOp* d) { return dims_.bounds(d); }
  // The rule for one node whose tensor sources already have shapes.
  absl::StatusOr<Shape> infer(const UOp* u);
  absl::StatusOr<Shape> operand(const UOp* u, size_t i, size_t rank, const char* tag);
  absl::Status check_limits(const UOp* u, const Shape& s);
  absl::Status fail(const UOp* u, std::string detail);

  Graph& g_;
  ShapeLimits limits_;
  const NodeIndex* index_;
  absl::flat_hash_map<const UOp*, const Shape*> shapes_;
  absl::flat_hash_map<const UOp*, size_t> failures_;  // node -> position in failed_
  std::deque<Shape> store_;
  std::vector<Failure> failed_;
  size_t last_ = SIZE_MAX;
  DimFacts dims_;
};

}  // namespace uop
