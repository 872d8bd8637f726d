// Benchmarks of the IR's front door and core: what the server pays for every graph that
// arrives (decode a binary .uopb, verify it, digest it: the first stage of docs/ARCHITECTURE.md, The pipeline, and the plan cache
// key) on a 100k-node tensor graph, and how fast Graph::make hash-conses nodes when every
// call makes a new node vs when every call finds an existing one. Items are nodes (or make
// calls), so items_per_second is nodes/s.
#include <benchmark/benchmark.h>

#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/ir/uop.h"
#include "compiler/ir/verifier.h"

namespace uop {
namespace {

constexpr size_t kGraphNodes = 100'000;

// A realistic tensor-level graph of at least kGraphNodes nodes, as a frontend would emit
// for a deep stack of elementwise layers: x = max(x * c + bias, 0), flattened and
// reshaped back every step, transposed and back every 8th step, with a handful of
// distinct constants (so hash consing shares the broadcast constants, as it does in real
// graphs, and the chain itself is all new nodes). Encoded once, with encode_binary.
const std::string& uopb_graph() {
  static const std::string bytes = [] {
    Graph g;
    TensorBuilder tb(g);
    const std::vector<int64_t> shape = {32, 64};
    const UOp* x = tb.input(Scalar::Float32, shape);
    const UOp* bias = tb.input(Scalar::Float32, {64});  // broadcast over rows each step
    const UOp* zero = tb.full(Scalar::Float32, 0.0, shape);
    for (int64_t i = 0; g.size() < kGraphNodes; ++i) {
      const UOp* c = tb.full(Scalar::Float32, 1.0 + static_cast<double>(i % 16) / 64, shape);
      x = tb.alu(Op::ADD, {tb.alu(Op::MUL, {x, c}), bias});
      x = tb.alu(Op::MAX, {x, zero});
      x = tb.reshape(tb.reshape(x, {32 * 64}), shape);
      if (i % 8 == 7) x = tb.permute(tb.permute(x, {1, 0}), {1, 0});
    }
    return encode_binary(tb.sink({x}));
  }();
  return bytes;
}

DecodedGraph decode_or_die(benchmark::State& state) {
  auto d = decode_binary(uopb_graph());
  if (!d.ok()) state.SkipWithError(std::string(d.status().message()).c_str());
  return d.ok() ? std::move(*d) : DecodedGraph{};
}

// The whole door: bytes -> verified graph -> its digest.
void BM_DecodeVerifyDigest(benchmark::State& state) {
  const std::string& bytes = uopb_graph();
  size_t nodes = 0;
  for (auto _ : state) {
    auto d = decode_binary(bytes);
    if (!d.ok()) {
      state.SkipWithError(std::string(d.status().message()).c_str());
      return;
    }
    VerifyOptions vo;
    vo.index = &d->index;
    if (absl::Status s = verify(*d->graph, d->root, vo); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(d->root->digest().bytes.data());
    nodes = d->nodes.size();
    state.PauseTiming();  // freeing 100k nodes is not part of the door
    d = absl::StatusOr<DecodedGraph>();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * nodes));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
  state.counters["nodes"] = static_cast<double>(nodes);
  state.counters["uopb_bytes"] = static_cast<double>(bytes.size());
}
BENCHMARK(BM_DecodeVerifyDigest)->Unit(benchmark::kMillisecond);

// The three parts of the door apart, to see which one dominates.
void BM_Decode(benchmark::State& state) {
  const std::string& bytes = uopb_graph();
  size_t nodes = 0;
  for (auto _ : state) {
    auto d = decode_binary(bytes);
    if (!d.ok()) {
      state.SkipWithError(std::string(d.status().message()).c_str());
      return;
    }
    nodes = d->nodes.size();
    state.PauseTiming();
    d = absl::StatusOr<DecodedGraph>();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * nodes));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_Verify(benchmark::State& state) {
  DecodedGraph d = decode_or_die(state);
  if (!d.graph) return;
  VerifyOptions vo;
  vo.index = &d.index;
  for (auto _ : state) {
    if (absl::Status s = verify(*d.graph, d.root, vo); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * d.nodes.size()));
}
BENCHMARK(BM_Verify)->Unit(benchmark::kMillisecond);

// Digests are memoized in the nodes, so each iteration needs a freshly decoded graph.
void BM_Digest(benchmark::State& state) {
  size_t nodes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    DecodedGraph d = decode_or_die(state);
    if (!d.graph) return;
    nodes = d.nodes.size();
    state.ResumeTiming();
    benchmark::DoNotOptimize(d.root->digest().bytes.data());
    state.PauseTiming();
    d = DecodedGraph{};
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * nodes));
}
BENCHMARK(BM_Digest)->Unit(benchmark::kMillisecond);

// The make() stream both hash-consing benchmarks issue: a chain of n ALU nodes over four
// constants, each node using the previous one, so in an empty graph every call is new.
const UOp* make_chain(Graph& g, const UOp* const (&k)[4], int64_t n) {
  const UOp* e = g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"x", 0, 1});
  for (int64_t i = 0; i < n; ++i) e = g.make(i % 2 ? Op::ADD : Op::MUL, dtypes::float32, {e, k[i % 4]});
  return e;
}

// Every make() call creates a node: hashing, a failed probe, the arena allocation and
// the insert. Destroying the graph is left out of the timing.
void BM_MakeUnique(benchmark::State& state) {
  const int64_t n = state.range(0);
  for (auto _ : state) {
    state.PauseTiming();
    std::optional<Graph> g(std::in_place);
    const UOp* const k[4] = {g->cnst(dtypes::float32, 0.5), g->cnst(dtypes::float32, 1.5),
                             g->cnst(dtypes::float32, 2.5), g->cnst(dtypes::float32, 3.5)};
    state.ResumeTiming();
    benchmark::DoNotOptimize(make_chain(*g, k, n));
    state.PauseTiming();
    if (g->size() != static_cast<size_t>(n) + 5) state.SkipWithError("chain nodes were not all new");
    g.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_MakeUnique)->Arg(1 << 16)->Arg(1 << 20)->Unit(benchmark::kMillisecond);

// The same stream into a graph that already holds it: every call is a hit (hash + one
// successful probe and compare), what rewrites that change nothing cost.
void BM_MakeDuplicates(benchmark::State& state) {
  const int64_t n = state.range(0);
  Graph g;
  const UOp* const k[4] = {g.cnst(dtypes::float32, 0.5), g.cnst(dtypes::float32, 1.5),
                           g.cnst(dtypes::float32, 2.5), g.cnst(dtypes::float32, 3.5)};
  const UOp* first = make_chain(g, k, n);
  const size_t size = g.size();
  for (auto _ : state) benchmark::DoNotOptimize(make_chain(g, k, n));
  if (g.size() != size || make_chain(g, k, n) != first) state.SkipWithError("a duplicate made a new node");
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_MakeDuplicates)->Arg(1 << 16)->Arg(1 << 20)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace uop

BENCHMARK_MAIN();
