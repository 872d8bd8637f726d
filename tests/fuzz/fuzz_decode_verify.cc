// libFuzzer target: arbitrary bytes through the graph decoder (binary and JSON), and what
// decodes through the verifier, the printer and a re-encode. The properties: no crash, no
// hang, no unbounded allocation; every rejection is INVALID_ARGUMENT with a message; a
// graph that decodes re-encodes to a graph with the same digest.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "compiler/ir/codec.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verifier.h"

namespace {

void check(bool cond, const char* what) {
  if (!cond) {
    fprintf(stderr, "property violated: %s\n", what);
    abort();
  }
}

void exercise(const absl::StatusOr<uop::DecodedGraph>& g) {
  if (!g.ok()) {
    check(g.status().code() == absl::StatusCode::kInvalidArgument, "decode errors are INVALID_ARGUMENT");
    check(!g.status().message().empty(), "decode errors have a message");
    return;
  }
  uop::VerifyOptions opts;
  opts.index = &g->index;
  absl::Status s = uop::verify(*g->graph, g->root, opts);
  if (!s.ok()) {
    check(s.code() == absl::StatusCode::kInvalidArgument, "verify errors are INVALID_ARGUMENT");
    check(!s.message().empty(), "verify errors have a message");
  }
  if (g->graph->size() < 2000) (void)uop::print_tree(g->root, &g->index);
  auto again = uop::decode_binary(uop::encode_binary(g->root, g->names));
  check(again.ok(), "a decoded graph re-encodes to a decodable graph");
  check(again->root->digest() == g->root->digest(), "re-encoding keeps the digest");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  uop::quiet_protobuf_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uop::DecodeLimits limits;
  limits.max_nodes = 1 << 15;
  limits.max_bytes = 1 << 20;
  limits.max_arg_bytes = 1 << 16;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  exercise(uop::decode_binary(bytes, limits));
  if (size > 0 && data[0] == '{') exercise(uop::decode_json(bytes, limits));
  return 0;
}
