// libFuzzer target over LoadModel's import: arbitrary bytes as an ONNX model, taken
// through what uopd does with a model a client streams in (server/models.h
// import_model_graph): the ModelProto parse, the inputs as placeholders of their declared
// shapes, the importer (compiler/onnx) with the inputs' values unknown, then the graph
// through the wire format and decoded again under the server's decode limits (smaller
// ones here, so that the fuzzer spends its time on the importer).
//
// The properties: no crash, no hang, no unbounded allocation; every refusal carries a
// message; a model that imports has a graph within the limits, outputs with shapes, and
// weights whose bytes match their dtype and shape.
//
// Built two ways: with -fsanitize=fuzzer under the 'fuzz' preset (clang), and, with
// UOPD_FUZZ_REPLAY, as a plain program that replays a fixed-seed corpus (ONNX models from
// the given directories, mutated deterministically) for a bounded ctest run.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "compiler/ir/codec.h"
#include "server/models.h"

namespace {

void check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

struct Reached {
  uint64_t tried = 0, imported = 0;
} reached;

uop::DecodeLimits limits() {
  uop::DecodeLimits l;
  l.max_nodes = 1 << 14;
  l.max_bytes = 1 << 22;
  l.max_arg_bytes = 1 << 20;
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  uop::quiet_protobuf_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ++reached.tried;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto m = uop::server::import_model_graph(bytes, {}, limits());
  if (!m.ok()) {
    if (m.status().message().empty()) {
      std::fprintf(stderr, "a refusal without a message (code %d)\n", static_cast<int>(m.status().code()));
      std::abort();
    }
    return 0;
  }
  ++reached.imported;
  check(m->graph && m->graph->root, "an imported model has a graph");
  check(m->graph->nodes.size() <= limits().max_nodes, "the graph is within max_nodes");
  for (const auto& o : m->outputs) {
    auto n = uop::checked_numel(o.shape);
    check(n.has_value() && *n > 0, "every output has a shape with elements");
  }
  for (const auto& [name, t] : m->weights) {
    auto n = uop::checked_numel(t.shape);
    check(n.has_value() && t.data.size() == static_cast<size_t>(*n) * uop::scalar_bytes(t.dtype),
          "a weight's bytes match its dtype and shape");
  }
  return 0;
}

#ifdef UOPD_FUZZ_REPLAY
// The bounded replay: every model.onnx under the given directories (ONNX backend-test
// layouts), then `iterations` deterministic mutations of them: half as messages (an
// attribute's or a dimension's number, an initializer's shape or bytes, an operator's type,
// a node's inputs, nodes dropped or repeated), half as bytes (flips, insertions, deletions,
// duplicated ranges, truncation).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "tests/fuzz/replay.h"

#include "onnx/onnx_pb.h"

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  int iterations = 4000;
  const char* seeds_dir = nullptr;
  for (int i = 1; i < argc; ++i) {
    std::string_view a(argv[i]);
    if (a == "--write-seeds" && i + 1 < argc) seeds_dir = argv[++i];
    else if (a == "--iterations" && i + 1 < argc) iterations = std::atoi(argv[++i]);
    else dirs.emplace_back(a);
  }
  if (dirs.empty()) {
    std::fprintf(stderr, "usage: %s MODELS_DIR... [--iterations N] [--write-seeds DIR]\n", argv[0]);
    return 2;
  }
  LLVMFuzzerInitialize(nullptr, nullptr);
  // In name order: directory order differs between file systems, and the replay's
  // mutations depend on the seeds' order.
  std::vector<std::filesystem::path> paths;
  for (const std::string& d : dirs) {
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(d, ec); !ec && it != std::filesystem::end(it);
         it.increment(ec))
      if (it->path().filename() == "model.onnx") paths.push_back(it->path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> seeds;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    // Small models only: the fuzzer's inputs are bounded (-max_len), and so is the replay.
    if (ss.str().size() <= 65536) seeds.push_back(ss.str());
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no model.onnx under the given directories\n");
    return 1;
  }
  if (seeds_dir) return uop::fuzz::write_seeds(seeds, seeds_dir);
  // UOPD_FUZZ_LAST=FILE: each input is written there before it runs, so a crash leaves it.
  const char* last = std::getenv("UOPD_FUZZ_LAST");
  auto feed = [last](const std::string& s) {
    if (last) std::ofstream(last, std::ios::binary | std::ios::trunc) << s;
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  for (const std::string& s : seeds) feed(s);
  std::mt19937_64 rng(20261202);  // fixed: the same corpus every run
  // Numbers a mutation writes: small, edge and large values (shapes, axes, counts).
  auto number = [&]() -> int64_t {
    static const int64_t edges[] = {0, 1, -1, 2, 3, 7, 64, 1 << 16, int64_t{1} << 31, INT64_MAX, INT64_MIN, -2};
    return rng() % 2 ? edges[rng() % std::size(edges)] : static_cast<int64_t>(rng() % 17) - 4;
  };
  static const char* const op_types[] = {"Add",   "Conv",    "Reshape", "Expand",     "Tile",  "Gather", "Slice",
                                         "Range", "Resize",  "LSTM",    "ConstantOfShape", "Concat", "Pad",
                                         "Einsum", "TopK",   "Transpose", "ReduceSum", "MatMul", "Split", "Where"};
  auto structured = [&](const std::string& seed) {
    onnx::ModelProto m;
    if (!m.ParseFromString(seed)) return seed;
    onnx::GraphProto* g = m.mutable_graph();
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 8) {
        case 0:
        case 1:
          if (g->node_size() > 0) {
            onnx::NodeProto* n = g->mutable_node(static_cast<int>(rng() % g->node_size()));
            if (n->attribute_size() > 0) {
              onnx::AttributeProto* a = n->mutable_attribute(static_cast<int>(rng() % n->attribute_size()));
              if (a->ints_size() > 0) a->set_ints(static_cast<int>(rng() % a->ints_size()), number());
              else if (a->has_i()) a->set_i(number());
              else a->add_ints(number());
            }
          }
          break;
        case 2:
          if (g->initializer_size() > 0) {
            onnx::TensorProto* t = g->mutable_initializer(static_cast<int>(rng() % g->initializer_size()));
            if (t->dims_size() > 0 && rng() % 2) t->set_dims(static_cast<int>(rng() % t->dims_size()), number());
            else if (t->int64_data_size() > 0) t->set_int64_data(static_cast<int>(rng() % t->int64_data_size()), number());
            else if (!t->raw_data().empty()) t->mutable_raw_data()->resize(rng() % (t->raw_data().size() + 9));
            else t->add_dims(number());
          }
          break;
        case 3:
          if (g->input_size() > 0) {
            auto* shape = g->mutable_input(static_cast<int>(rng() % g->input_size()))->mutable_type()->mutable_tensor_type()->mutable_shape();
            if (shape->dim_size() > 0) shape->mutable_dim(static_cast<int>(rng() % shape->dim_size()))->set_dim_value(number());
            else shape->add_dim()->set_dim_value(number());
          }
          break;
        case 4:
          if (g->node_size() > 0) g->mutable_node(static_cast<int>(rng() % g->node_size()))->set_op_type(op_types[rng() % std::size(op_types)]);
          break;
        case 5:
          if (g->node_size() > 0) {
            onnx::NodeProto* n = g->mutable_node(static_cast<int>(rng() % g->node_size()));
            const onnx::NodeProto& other = g->node(static_cast<int>(rng() % g->node_size()));
            if (n->input_size() > 0 && other.output_size() > 0)
              n->set_input(static_cast<int>(rng() % n->input_size()), other.output(0));
          }
          break;
        case 6:
          if (g->node_size() > 0) *g->add_node() = g->node(static_cast<int>(rng() % g->node_size()));
          break;
        default:
          if (g->node_size() > 1) g->mutable_node()->DeleteSubrange(static_cast<int>(rng() % g->node_size()), 1);
          break;
      }
    }
    return m.SerializeAsString();
  };
  for (int i = 0; i < iterations; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    if (rng() % 2 == 0) {
      feed(structured(s));
      continue;
    }
    uop::fuzz::mutate_bytes(s, rng);
    feed(s);
  }
  std::printf("replayed %zu seeds and %d mutations: %llu models tried, %llu imported\n", seeds.size(), iterations,
              static_cast<unsigned long long>(reached.tried), static_cast<unsigned long long>(reached.imported));
  return 0;
}
#endif
