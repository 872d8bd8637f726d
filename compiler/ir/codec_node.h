// One wire node (uop.v1.Node) <-> one UOp: the enum tables that pair IR and proto values by
// name, the arg of every ArgKind in both directions, and the structural checks of a single
// node. Private to the codec: it includes the generated protobuf header, which codec.h,
// the public face, keeps out of everything else.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/uop.h"
#include "proto/uop.pb.h"

namespace uop::codec_internal {

// Rule tags, one spelling for every message (codec.h lists them).
inline constexpr std::string_view kParse = "codec.parse";
inline constexpr std::string_view kLimits = "codec.limits";
inline constexpr std::string_view kVersion = "codec.version";
inline constexpr std::string_view kEmpty = "codec.empty";
inline constexpr std::string_view kOp = "codec.op";
inline constexpr std::string_view kEnum = "codec.enum";
inline constexpr std::string_view kDType = "codec.dtype";
inline constexpr std::string_view kTopological = "codec.topological";
inline constexpr std::string_view kSourceCount = "codec.source_count";
inline constexpr std::string_view kArgKind = "codec.arg_kind";
inline constexpr std::string_view kConst = "codec.const";
inline constexpr std::string_view kName = "codec.name";

// Wire index of every node already written.
using WireIndex = absl::flat_hash_map<const UOp*, uint32_t>;

// Checks wire node `index` against ops.def and `limits`, then interns it in `graph`.
// `earlier` maps the wire indices before it to their nodes; `src` is scratch space reused
// from node to node.
absl::StatusOr<const UOp*> decode_node(const v1::Node& node, uint32_t index, const DecodeLimits& limits,
                                       const std::vector<const UOp*>& earlier, std::vector<const UOp*>& src,
                                       Graph& graph);

// Writes `u`; its sources must already be in `index`.
void encode_node(const UOp* u, const WireIndex& index, v1::Node* out);

// For a proto and an IR that disagree, or output protobuf cannot hold: a defect of this
// build or of the caller, never of the input. Prints and aborts.
[[noreturn]] void die(const std::string& msg);

}  // namespace uop::codec_internal
