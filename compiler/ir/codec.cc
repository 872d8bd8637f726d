// The graph level of the codec: limits on the whole input, the binary and JSON formats,
// names, and files. Each node is converted by codec_node.cc. Protobuf only ever sees input
// whose node count is already known to be within limits, parsed on an arena so that a
// large message is freed at once.
#include "compiler/ir/codec.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <optional>

#include "compiler/ir/codec_node.h"
#include "compiler/support/strings.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/type_resolver.h"
#include "google/protobuf/util/type_resolver_util.h"
#include "google/protobuf/wire_format_lite.h"

namespace uop {

using codec_internal::decode_node;
using codec_internal::die;
using codec_internal::encode_node;
using codec_internal::kEmpty;
using codec_internal::kLimits;
using codec_internal::kName;
using codec_internal::kParse;
using codec_internal::kVersion;
using codec_internal::WireIndex;

namespace {

namespace gpb = google::protobuf;

// Untrusted text quoted in a message, cut short so a huge name cannot flood a log.
std::string quote(std::string_view s) {
  constexpr size_t kMax = 40;
  return cat("\"", s.substr(0, kMax), s.size() > kMax ? "...\"" : "\"");
}

absl::Status graph_error(std::string_view tag, const std::string& what) {
  return absl::InvalidArgumentError(cat("graph: ", what, " [", tag, "]"));
}

// Counts Graph.nodes on the wire without building them, so that a flood of tiny nodes is
// refused before protobuf allocates a message for each (an empty node is 2 bytes on the
// wire and far more in memory). nullopt: not even the top level parses.
std::optional<uint64_t> count_wire_nodes(std::string_view bytes, uint64_t stop_after) {
  using WFL = gpb::internal::WireFormatLite;
  gpb::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
  uint64_t count = 0;
  while (count <= stop_after) {
    uint32_t tag = in.ReadTag();
    if (tag == 0) break;  // the end, or a malformed tag that the real parse will refuse
    if (WFL::GetTagFieldNumber(tag) == v1::Graph::kNodesFieldNumber &&
        WFL::GetTagWireType(tag) == WFL::WIRETYPE_LENGTH_DELIMITED)
      ++count;
    if (!WFL::SkipField(&in, tag)) return std::nullopt;
  }
  return count;
}

absl::Status nodes_over_limit(const DecodeLimits& limits) {
  return graph_error(kLimits, cat("the graph has more than max_nodes (", limits.max_nodes, ") nodes"));
}

// The binary path shared by decode_binary and decode_json (after JSON became binary).
absl::StatusOr<DecodedGraph> parse_and_decode(std::string_view bytes, const DecodeLimits& limits) {
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    return graph_error(kLimits, cat("the encoded graph has ", bytes.size(), " bytes; protobuf reads at most 2 GiB"));
  std::optional<uint64_t> n = count_wire_nodes(bytes, limits.max_nodes);
  if (!n) return graph_error(kParse, "the bytes are not a uop.v1.Graph protobuf");
  if (*n > limits.max_nodes) return nodes_over_limit(limits);
  gpb::Arena arena;  // one free for the whole message, however many nodes it has
  auto* pb = gpb::Arena::CreateMessage<v1::Graph>(&arena);
  if (!pb->ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return graph_error(kParse, "the bytes are not a uop.v1.Graph protobuf");
  return decode_proto(*pb, limits);
}

gpb::util::TypeResolver* json_resolver() {
  static gpb::util::TypeResolver* const resolver = gpb::util::NewTypeResolverForDescriptorPool(
      "type.googleapis.com", v1::Graph::descriptor()->file()->pool());
  return resolver;
}

// ---------------------------------------------------------------------------------------
// Encoding

std::optional<std::string> serialize(const v1::Graph& g) {
  std::string out;
  if (!g.SerializeToString(&out)) return std::nullopt;  // over 2 GiB
  return out;
}

// Protobuf 3.21 prints the double -0.0 as `-0`, which its own parser reads back as the
// integer 0, i.e. +0.0; a constant would change sign (and digest) on the way. Only double
// fields can print a bare -0 (64-bit integers are quoted), so every such token outside a
// string is rewritten to `-0.0`, which parses back exactly.
void keep_negative_zero(std::string& json) {
  auto is_number_char = [](char c) { return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E'; };
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    out.push_back(c);
    if (in_string) {
      if (c == '\\' && i + 1 < json.size()) out.push_back(json[++i]);
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '-' && (i == 0 || !is_number_char(json[i - 1])) && i + 1 < json.size() && json[i + 1] == '0' &&
               (i + 2 == json.size() || !is_number_char(json[i + 2]))) {
      out.append("0.0");
      ++i;
    }
  }
  json = std::move(out);
}

std::string to_json(const v1::Graph& g, bool pretty) {
  gpb::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.preserve_proto_field_names = true;
  std::string out;
  auto st = gpb::util::MessageToJsonString(g, &out, options);
  if (!st.ok()) die(cat("cannot print a graph as JSON: ", std::string(st.message().data(), st.message().size())));
  keep_negative_zero(out);
  return out;
}

// ---------------------------------------------------------------------------------------
// Files

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

absl::Status with_path(const std::string& path, const absl::Status& st) {
  return absl::Status(st.code(), cat(path, ": ", st.message()));
}

// Reads at most max_bytes, whatever the file claims to be (it may be a pipe or growing).
absl::StatusOr<std::string> read_bounded(const std::string& path, uint64_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return absl::ErrnoToStatus(errno, cat(path, ": cannot open"));
  std::string data;
  char buf[1 << 16];
  while (true) {
    size_t got = std::fread(buf, 1, sizeof buf, f);
    if (data.size() + got > max_bytes) {
      std::fclose(f);
      return absl::InvalidArgumentError(cat(path, ": the file is larger than max_bytes ", max_bytes, " [", kLimits, "]"));
    }
    data.append(buf, got);
    if (got < sizeof buf) break;
  }
  bool failed = std::ferror(f);
  int err = errno;
  std::fclose(f);
  if (failed) return absl::ErrnoToStatus(err, cat(path, ": cannot read"));
  return data;
}

}  // namespace

absl::StatusOr<DecodedGraph> decode_proto(const v1::Graph& pb, const DecodeLimits& limits) {
  if (pb.format_version() != v1::FORMAT_VERSION_1)
    return graph_error(kVersion, cat("format_version is ", static_cast<int>(pb.format_version()), "; this decoder reads 1"));
  const int n = pb.nodes_size();
  if (n == 0) return graph_error(kEmpty, "the graph has no nodes");
  if (static_cast<uint64_t>(n) > limits.max_nodes) return nodes_over_limit(limits);

  DecodedGraph out;
  out.graph = std::make_unique<Graph>();
  out.nodes.reserve(static_cast<size_t>(n));  // the nodes are already parsed: no untrusted count
  out.index.reserve(static_cast<size_t>(n));
  std::vector<const UOp*> src;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<const UOp*> u = decode_node(pb.nodes(i), static_cast<uint32_t>(i), limits, out.nodes, src, *out.graph);
    if (!u.ok()) return u.status();
    out.nodes.push_back(*u);
    out.index.emplace(*u, static_cast<uint32_t>(i));  // keeps the first index of a shared node
  }
  out.root = out.nodes.back();

  for (int k = 0; k < pb.names_size(); ++k) {
    const v1::Name& name = pb.names(k);
    if (name.name().size() > limits.max_arg_bytes)
      return absl::InvalidArgumentError(cat("name ", k, ": has ", name.name().size(),
                                            " bytes, more than max_arg_bytes ", limits.max_arg_bytes, " [", kLimits, "]"));
    if (name.node() >= static_cast<uint32_t>(n))
      return absl::InvalidArgumentError(cat("name ", k, " ", quote(name.name()), ": refers to node ", name.node(),
                                            ", but the graph has ", n, " nodes [", kName, "]"));
    out.names.emplace_back(name.name(), out.nodes[name.node()]);
  }
  return out;
}

absl::StatusOr<DecodedGraph> decode_binary(std::string_view bytes, const DecodeLimits& limits) {
  if (bytes.size() > limits.max_bytes)
    return graph_error(kLimits, cat("the input has ", bytes.size(), " bytes, more than max_bytes ", limits.max_bytes));
  return parse_and_decode(bytes, limits);
}

absl::StatusOr<DecodedGraph> decode_json(std::string_view json, const DecodeLimits& limits) {
  if (json.size() > limits.max_bytes)
    return graph_error(kLimits, cat("the input has ", json.size(), " bytes, more than max_bytes ", limits.max_bytes));
  // JsonStringToMessage is this same JSON -> binary step followed by a parse; taking the
  // binary ourselves lets the node count be checked before any Node message exists.
  gpb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  std::string binary;
  auto st = gpb::util::JsonToBinaryString(json_resolver(), cat("type.googleapis.com/", v1::Graph::descriptor()->full_name()),
                                          gpb::StringPiece(json.data(), json.size()), &binary, options);
  if (!st.ok()) {
    std::string why(st.message().data(), st.message().size());
    if (why.size() > 200) why = why.substr(0, 200) + "...";
    return graph_error(kParse, cat("the text is not uop.v1.Graph JSON: ", why));
  }
  return parse_and_decode(binary, limits);
}

void encode_proto(const UOp* root, const Names& names, v1::Graph* out) {
  std::vector<const UOp*> roots;
  roots.reserve(names.size() + 1);
  for (const auto& [name, u] : names) roots.push_back(u);
  roots.push_back(root);
  std::vector<const UOp*> order = toposort(roots);

  out->Clear();
  out->set_format_version(v1::FORMAT_VERSION_1);
  WireIndex index;
  index.reserve(order.size());
  out->mutable_nodes()->Reserve(static_cast<int>(order.size()) + 1);
  for (const UOp* u : order) {
    encode_node(u, index, out->add_nodes());
    index.emplace(u, static_cast<uint32_t>(index.size()));
  }
  // When a named node depends on the root, the root cannot be last in any topological
  // order; a second copy of it at the end is what the wire says instead, and the decoder
  // hash-conses the two copies back into one node.
  if (order.back() != root) encode_node(root, index, out->add_nodes());
  for (const auto& [name, u] : names) {
    v1::Name* nm = out->add_names();
    nm->set_name(name);
    nm->set_node(index.at(u));
  }
}

std::string encode_binary(const UOp* root, const Names& names) {
  v1::Graph g;
  encode_proto(root, names, &g);
  std::optional<std::string> out = serialize(g);
  if (!out) die("encode_binary: the graph is over protobuf's 2 GiB limit");
  return *std::move(out);
}

std::string encode_json(const UOp* root, const Names& names, bool pretty) {
  v1::Graph g;
  encode_proto(root, names, &g);
  return to_json(g, pretty);
}

absl::StatusOr<DecodedGraph> read_graph_file(const std::string& path, const DecodeLimits& limits) {
  absl::StatusOr<std::string> data = read_bounded(path, limits.max_bytes);
  if (!data.ok()) return data.status();
  absl::StatusOr<DecodedGraph> out;
  if (ends_with(path, ".json")) {
    out = decode_json(*data, limits);
  } else if (ends_with(path, ".uopb")) {
    out = decode_binary(*data, limits);
  } else {
    out = decode_binary(*data, limits);
    if (out.ok()) return out;
    absl::StatusOr<DecodedGraph> json = decode_json(*data, limits);
    if (json.ok()) return json;
    // Report the failure of the format the bytes look like.
    size_t first = data->find_first_not_of(" \t\r\n");
    if (first != std::string::npos && (*data)[first] == '{') out = std::move(json);
  }
  if (!out.ok()) return with_path(path, out.status());
  return out;
}

absl::Status write_graph_file(const std::string& path, const UOp* root, const Names& names) {
  v1::Graph g;
  encode_proto(root, names, &g);
  std::string data;
  if (ends_with(path, ".json")) {
    data = to_json(g, /*pretty=*/true);
  } else {
    std::optional<std::string> bin = serialize(g);
    if (!bin) return absl::InvalidArgumentError(cat(path, ": the graph is over protobuf's 2 GiB limit [", kLimits, "]"));
    data = *std::move(bin);
  }
  // A reader never sees half a file: write a private temporary, then rename over the path.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = cat(path, ".tmp.", static_cast<int64_t>(getpid()), ".", counter.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return absl::ErrnoToStatus(errno, cat(path, ": cannot create ", tmp));
  bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = std::fflush(f) == 0 && ok;
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    if (err == 0) err = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err, cat(path, ": cannot write"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err, cat(path, ": cannot rename ", tmp, " over it"));
  }
  return absl::OkStatus();
}

void quiet_protobuf_logs() {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel level, const char* file, int line,
                                     const std::string& message) {
    if (level >= google::protobuf::LOGLEVEL_FATAL) fprintf(stderr, "[protobuf %s:%d] %s\n", file, line, message.c_str());
  });
}

}  // namespace uop
