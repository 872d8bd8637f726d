// libFuzzer target over uopd's RPC surface: arbitrary bytes as the client API's requests
// (proto/uopd.proto), taken through what a handler does with them before any worker is
// involved: the message parse, the graph decode with the server's limits, the checks on
// bindings and byte ranges, and the planner's entry point (plan_graph: verify, rangeify,
// split kernels, normalize), then lowering of small kernels. The first byte picks the
// request; the rest is its wire bytes.
//
// The properties: no crash, no hang, no unbounded allocation; every refusal carries a
// message, and decode refusals are INVALID_ARGUMENT; a plan that succeeds has kernels whose
// buffers are in range and outputs with shapes.
//
// Built two ways: with -fsanitize=fuzzer under the 'fuzz' preset (clang, UOPD_SERVICE=OFF,
// the messages generated here), and, with UOPD_FUZZ_REPLAY, as a plain program that replays
// a fixed-seed corpus (the examples' graphs as requests, mutated deterministically) for a
// bounded ctest run in every build, gcc's included.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "compiler/ir/codec.h"
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/pipeline.h"
#include "uopd.pb.h"

namespace {

namespace pb = ::uopd::v1;

void check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

void check_refusal(const absl::Status& s, const char* where) {
  if (s.ok()) return;
  if (s.message().empty()) {
    std::fprintf(stderr, "%s: a refusal without a message (code %d)\n", where, static_cast<int>(s.code()));
    std::abort();
  }
}

// How far inputs got, for the replay's summary.
struct Reached {
  uint64_t parsed = 0, decoded = 0, planned = 0;
} reached;

uop::DecodeLimits limits() {
  uop::DecodeLimits l;
  l.max_nodes = 1 << 12;
  l.max_bytes = 1 << 20;
  l.max_arg_bytes = 1 << 16;
  return l;
}

// What Compile, Run and Explain do with the graph: decode, then plan; small kernels are
// lowered too. Returns the decoded graph's node count (0 when refused).
size_t decode_and_plan(const ::uop::v1::Graph& wire, bool lower) {
  ++reached.parsed;
  auto g = uop::decode_proto(wire, limits());
  if (!g.ok()) {
    check(g.status().code() == absl::StatusCode::kInvalidArgument, "decode errors are INVALID_ARGUMENT");
    check_refusal(g.status(), "decode");
    return 0;
  }
  ++reached.decoded;
  uop::PipelineOptions opts;
  opts.index = &g->index;
  auto plan = uop::plan_graph(*g->graph, g->root, opts);
  if (!plan.ok()) {
    check_refusal(plan.status(), "plan");
    return g->nodes.size();
  }
  ++reached.planned;
  check(plan->output_shapes.size() >= plan->outputs.size(), "every output has a shape");
  if (lower && g->graph->size() < 256) {
    for (const uop::KernelPlan& k : plan->kernels) {
      auto linear = uop::host_cpu_backend()->lower(*g->graph, k.kernel, opts, k.name);
      check_refusal(linear.status(), "lowering");
    }
  }
  return g->nodes.size();
}

// The handlers' checks on a Run's bindings: a name or an index of the graph, a buffer id
// or an inline tensor whose size must match.
void check_bindings(const pb::RunRequest& req, size_t nodes) {
  for (const pb::Binding& b : req.inputs()) {
    if (b.node_case() == pb::Binding::kIndex) (void)(b.index() < nodes);
    if (b.value_case() == pb::Binding::kTensor) {
      const pb::Tensor& t = b.tensor();
      uint64_t elements = 1;
      for (int64_t d : t.shape()) elements = d > 0 && elements < (uint64_t{1} << 40) ? elements * static_cast<uint64_t>(d) : 0;
      (void)(t.data().size() == elements);
    }
  }
}

// Upload and Download: byte ranges against a buffer's size, without overflow (the
// handlers' arithmetic, written the same way).
void check_range(uint64_t offset, uint64_t length, uint64_t size) {
  bool fits = offset <= size && length <= size - offset;
  if (fits) check(offset + length <= size, "a range that fits ends inside the buffer");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  uop::quiet_protobuf_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 5;
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (which) {
    case 0: {
      pb::CompileRequest req;
      if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
      decode_and_plan(req.graph(), /*lower=*/true);
      break;
    }
    case 1: {
      pb::RunRequest req;
      if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
      check_bindings(req, decode_and_plan(req.graph(), /*lower=*/false));
      break;
    }
    case 2: {
      pb::ExplainRequest req;
      if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
      decode_and_plan(req.graph(), /*lower=*/false);
      break;
    }
    case 3: {
      pb::UploadChunk c;
      if (!c.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
      check_range(c.offset(), c.data().size(), uint64_t{1} << 20);
      break;
    }
    default: {
      pb::DownloadRequest r;
      if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
      check_range(r.offset(), r.length(), uint64_t{1} << 20);
      break;
    }
  }
  return 0;
}

#ifdef UOPD_FUZZ_REPLAY
// The bounded replay: each example graph as a Compile, Run and Explain request, then
// `iterations` deterministic mutations of them (byte flips, insertions, deletions,
// duplicated ranges, truncation), all through LLVMFuzzerTestOneInput.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "tests/fuzz/replay.h"

int main(int argc, char** argv) {
  if (argc < 2 || (argc > 2 && std::string_view(argv[2]) == "--write-seeds" && argc != 4)) {
    std::fprintf(stderr, "usage: %s EXAMPLES_DIR [ITERATIONS]\n       %s EXAMPLES_DIR --write-seeds DIR\n", argv[0], argv[0]);
    return 2;
  }
  // --write-seeds: only write the seeds, one file each, as the libFuzzer target's corpus
  // (deploy/check.sh), and leave.
  const char* seeds_dir = argc == 4 ? argv[3] : nullptr;
  const int iterations = argc > 2 && !seeds_dir ? std::atoi(argv[2]) : 4000;
  LLVMFuzzerInitialize(nullptr, nullptr);
  std::vector<std::string> seeds;
  // In name order: directory order differs between file systems, and the replay's
  // mutations depend on the seeds' order.
  std::vector<std::filesystem::path> graphs;
  for (auto& e : std::filesystem::directory_iterator(argv[1]))
    if (e.path().extension() == ".json") graphs.push_back(e.path());
  std::sort(graphs.begin(), graphs.end());
  for (const std::filesystem::path& path : graphs) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto g = uop::decode_json(ss.str());
    if (!g.ok()) continue;
    ::uop::v1::Graph wire;
    if (!wire.ParseFromString(uop::encode_binary(g->root, g->names))) continue;
    pb::CompileRequest c;
    *c.mutable_graph() = wire;
    pb::RunRequest r;
    *r.mutable_graph() = wire;
    r.set_session_id("0123456789abcdef0123456789abcdef");
    for (auto& [name, node] : g->names) r.add_inputs()->set_name(name);
    pb::ExplainRequest x;
    *x.mutable_graph() = wire;
    seeds.push_back(std::string(1, '\0') + c.SerializeAsString());
    seeds.push_back(std::string(1, '\1') + r.SerializeAsString());
    seeds.push_back(std::string(1, '\2') + x.SerializeAsString());
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no example graphs under %s\n", argv[1]);
    return 1;
  }
  if (seeds_dir) return uop::fuzz::write_seeds(seeds, seeds_dir);
  auto feed = [](const std::string& s) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  for (const std::string& s : seeds) feed(s);
  std::mt19937_64 rng(20240601);  // fixed: the same corpus every run
  // Half the mutations edit the graph as a message (ops, dtypes, sources, ints, nodes
  // dropped or repeated) so that they get past the parse into decoding and planning.
  auto structured = [&](const std::string& seed) {
    pb::CompileRequest compile;
    pb::RunRequest run;
    pb::ExplainRequest explain;
    google::protobuf::Message* req = seed[0] == 1 ? static_cast<google::protobuf::Message*>(&run)
                                     : seed[0] == 2 ? static_cast<google::protobuf::Message*>(&explain)
                                                    : &compile;
    (void)req->ParseFromString(seed.substr(1));
    ::uop::v1::Graph* g = seed[0] == 1 ? run.mutable_graph() : seed[0] == 2 ? explain.mutable_graph() : compile.mutable_graph();
    if (g->nodes_size() == 0) return seed;
    int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      auto* n = g->mutable_nodes(static_cast<int>(rng() % g->nodes_size()));
      switch (rng() % 7) {
        case 0: n->set_op(static_cast<::uop::v1::Op>(rng() % 96)); break;
        case 1: n->mutable_dtype()->set_scalar(static_cast<::uop::v1::DType::Scalar>(rng() % 16)); break;
        case 2:
          if (n->src_size() > 0) n->set_src(static_cast<int>(rng() % n->src_size()), static_cast<uint32_t>(rng() % (g->nodes_size() + 2)));
          break;
        case 3: n->add_src(static_cast<uint32_t>(rng() % g->nodes_size())); break;
        case 4:
          if (n->has_buffer()) n->mutable_buffer()->set_size(static_cast<int64_t>(rng() % 4096) - 8);
          else if (n->has_int_value()) n->set_int_value(static_cast<int64_t>(rng() % 64) - 4);
          else if (n->has_ints() && n->ints().values_size() > 0) n->mutable_ints()->set_values(0, static_cast<int64_t>(rng() % 64) - 4);
          break;
        case 5: *g->add_nodes() = *n; break;
        default:
          if (g->nodes_size() > 1) g->mutable_nodes()->DeleteSubrange(static_cast<int>(rng() % (g->nodes_size() - 1)), 1);
          break;
      }
    }
    return std::string(1, seed[0]) + req->SerializeAsString();
  };
  for (int i = 0; i < iterations; ++i) {
    std::string s = seeds[rng() % seeds.size()];
    if (rng() % 2 == 0) {
      feed(structured(s));
      continue;
    }
    uop::fuzz::mutate_bytes(s, rng, 1);  // byte 0 says which request the rest is
    feed(s);
  }
  std::printf("replayed %zu seeds and %d mutations: %llu graphs parsed, %llu decoded, %llu planned\n", seeds.size(),
              iterations, static_cast<unsigned long long>(reached.parsed), static_cast<unsigned long long>(reached.decoded),
              static_cast<unsigned long long>(reached.planned));
  return 0;
}
#endif
