// The wire codec: a Graph (proto/uop.proto) <-> UOp nodes, as binary `.uopb` or protobuf
// JSON `.json`. Decoding is the door through which graphs from the network come in, so it
// treats every byte as hostile: it never crashes or recurses, its memory grows only with
// the input's size (never with a count the input claims), and it refuses anything
// structurally malformed with INVALID_ARGUMENT naming the node (its wire index), the op
// and the rule, e.g.
//   node 5 (ADD): source 1 refers to node 9, which does not come before it [codec.topological]
// What it guarantees is structure only: known ops and enums, sources that point backwards
// and fit the op's source count (ops.def), the op's arg kind, constants that are values of
// their dtype. Whether the graph means anything (operand dtypes, shapes) is the verifier's.
//
// Rule tags: codec.parse, codec.limits, codec.version, codec.empty, codec.op, codec.enum,
// codec.dtype, codec.topological, codec.source_count, codec.arg_kind, codec.const,
// codec.name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop::v1 {
class Graph;
// Protobuf logs an ERROR line for every string field with invalid UTF-8 it parses; with
// input from the network that is a log flood anyone can trigger. Servers and fuzzers call
// this once at startup: such messages are dropped (decoding still refuses the input, with
// a status), fatal ones still print.
void quiet_protobuf_logs();

}  // namespace uop::v1

namespace uop {

// Safe defaults for input from the network; a server exposes them as flags.
struct DecodeLimits {
  uint32_t max_nodes = 1'000'000;        // nodes per graph
  uint64_t max_bytes = 512ull << 20;     // encoded input size (binary or JSON text)
  uint32_t max_sources = 1u << 16;       // sources of one node
  uint64_t max_arg_bytes = 64ull << 20;  // one string / bytes value (args and names)
  uint32_t max_vector_width = 1u << 16;  // dtype count, VCONST values, any list in an arg
};

struct DecodedGraph {
  std::unique_ptr<Graph> graph;
  const UOp* root = nullptr;      // the last node on the wire
  std::vector<const UOp*> nodes;  // wire index -> node; hash consing may map two indices to one node
  NodeIndex index;                // node -> its first wire index (for messages and the printer)
  std::vector<std::pair<std::string, const UOp*>> names;  // Graph.names, in order
};

absl::StatusOr<DecodedGraph> decode_proto(const uop::v1::Graph& pb, const DecodeLimits& limits = {});
absl::StatusOr<DecodedGraph> decode_binary(std::string_view bytes, const DecodeLimits& limits = {});
absl::StatusOr<DecodedGraph> decode_json(std::string_view json, const DecodeLimits& limits = {});

using Names = std::vector<std::pair<std::string, const UOp*>>;

// Writes the nodes of toposort({named..., root}) (so a named node that root does not reach
// still travels) followed by the names. The root is the last node; if a named node depends
// on it, the root is written a second time at the end (decoding interns both as one node).
// All nodes must belong to one Graph. String args and names must be UTF-8 (proto3
// `string`): protobuf writes other bytes with a logged error, JSON drops them, and no
// decoder accepts them back; raw bytes belong in PROGRAM_BINARY's `bytes_value`.
void encode_proto(const UOp* root, const Names& names, uop::v1::Graph* out);
std::string encode_binary(const UOp* root, const Names& names = {});
// snake_case field names (the parser takes camelCase too); `pretty` adds newlines and indents.
std::string encode_json(const UOp* root, const Names& names = {}, bool pretty = true);

// By extension: ".json" is JSON, ".uopb" binary; anything else is tried as binary, then as
// JSON. Every error names the path. The file is read only up to limits.max_bytes.
absl::StatusOr<DecodedGraph> read_graph_file(const std::string& path, const DecodeLimits& limits = {});
// ".json" writes pretty JSON, anything else binary. The file is replaced atomically (written
// under a temporary name, then renamed).
absl::Status write_graph_file(const std::string& path, const UOp* root, const Names& names = {});

// Protobuf logs an ERROR line for every string field with invalid UTF-8 it parses; with
// input from the network that is a log flood anyone can trigger. Servers and fuzzers call
// this once at startup: such messages are dropped (decoding still refuses the input, with
// a status), fatal ones still print.
void quiet_protobuf_logs();

}  // namespace uop
