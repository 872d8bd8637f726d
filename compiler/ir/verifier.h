// The verifier: the rules a graph must satisfy at each IR level (compiler/ir/README.md).
// It runs on every graph decoded from the network (docs/ARCHITECTURE.md, Untrusted input) and after passes in tests,
// and reports the first violation as INVALID_ARGUMENT naming the node, the rule and a path
// from the root:
//
//   node 12 (ADD): operands have different dtypes float32 and int32 [alu.dtype];
//   path: [40] SINK (src 0) -> [33] STORE (src 1) -> [12] ADD
//
// Rule tags are stable (tests and clients match on them); the README lists them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "compiler/ir/uop.h"

namespace uop {

enum class Stage { Tensor, Kernel, Linear };
std::string_view stage_name(Stage s);

struct VerifyOptions {
  std::optional<Stage> stage;  // nullopt: detect_stage(root)
  // CUSTOM / CUSTOMI / CUSTOM_FUNCTION carry inline code: refused unless the operator
  // allows them (docs/ARCHITECTURE.md, Untrusted input).
  bool allow_custom = false;
  int max_rank = 16;
  int64_t max_elements = int64_t{1} << 40;
  // Ranges one value may depend on at once (loop nesting depth); bounds the verifier's work.
  int max_open_ranges = 128;
  // How messages number nodes (the wire index of a decoded graph); default: toposort.
  const NodeIndex* index = nullptr;
};

// LINEAR root -> Linear. Any movement op, REDUCE_AXIS or BUFFER used as a tensor value
// -> Tensor. Otherwise any kernel-level op (RANGE, INDEX, LOAD, STORE, END, REDUCE,
// BUFFERIZE, PARAM, SPECIAL, DEFINE_REG, DEFINE_LOCAL) -> Kernel; a graph with neither
// (constants and ALU only) is a Tensor graph.
Stage detect_stage(const UOp* root);

// OK, or INVALID_ARGUMENT for the first violation: nodes are checked in toposort order
// (sources first), each against the rules for every stage and then its stage's rules;
// the root's structure (kernel SINK, LINEAR order and nesting) comes last.
absl::Status verify(Graph& g, const UOp* root, const VerifyOptions& opts = {});

// At linear level: the ops that are valid anywhere once listed, wherever they are listed
// (constants, buffers, variables, SPECIAL), because the renderers make them at the kernel's
// entry. Every other value is valid only inside the RANGE / IF it is listed in.
bool is_linear_definition(Op op);

// verify() at Stage::Linear, which needs no graph to build in: what the renderers run on
// every LINEAR before they emit it, so that what they rely on is checked in this one place.
absl::Status verify_linear(const UOp* linear, VerifyOptions opts = {});

}  // namespace uop
