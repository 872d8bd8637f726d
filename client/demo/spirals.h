// Data-parallel training of a small MLP on the two-spirals problem through a uopd session:
// what `uop-train-demo` shows, what the multi-device e2e test checks and what bench_train
// times. The batch is sharded along axis 0 over the session's devices and the parameters
// are replicated on all of them. A step is one graph and one Run: forward and backward on
// every shard, the ALLREDUCE of the gradients (the multi pass makes it out of the sum over
// the sharded batch), and the SGD update, whose results are written into the parameters'
// own session buffers (RealizeOptions::into), and the loss comes back with the Run. From
// the second step on the graph is the same (realize.h): the session holds it, so a warm
// step sends its digest and bindings (and a fresh batch, if any) and nothing else, and its
// plan, kernels and collective groups all come from the server's caches.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/realize.h"
#include "client/tensor.h"
#include "compiler/interp/host_tensor.h"

namespace uop::demo {

// Two interleaved spirals in the plane, one per class: x [2n, 2] float32 and one-hot
// labels y [2n, 2] float32, the classes alternating row by row (so every shard of the
// batch sees both). The same seed gives the same points on every machine.
struct SpiralsData {
  HostTensor x, y;
};
SpiralsData two_spirals(int64_t points_per_class, uint64_t seed, double noise = 0.02);
// `rows` points of `inputs` features uniform in [-1, 1), each labelled with a class drawn
// uniformly from `classes` (one-hot): data of any width for the same MLP (what the
// benchmarks train beside torch).
SpiralsData random_classes(int64_t rows, int64_t inputs, int64_t classes, uint64_t seed);

struct TrainOptions {
  std::vector<std::string> devices = {"CPU:0", "CPU:1"};
  int64_t points_per_class = 128;  // the batch has 2 x this many rows
  int64_t hidden = 32;
  // The MLP's in- and out-features: 2 and 2 train on the spirals, anything else on
  // random_classes (inputs -> hidden -> hidden -> classes).
  int64_t inputs = 2, classes = 2;
  double learning_rate = 0.5;
  uint64_t seed = 1;
  // The parameters to start from (w1, b1, w2, b2, w3, b3, as parameters() gives them);
  // empty: seeded uniform values.
  std::vector<HostTensor> initial_params;
  // Every step after the first trains on a new batch (the same kind of data, seeded by the
  // step), sent inline with its Run; otherwise one batch, uploaded once and kept.
  bool fresh_batches = false;
};

// One step as the client saw it and as uopd reported it.
struct StepReport {
  int step = 0;           // 1-based
  double loss = 0;        // of the parameters this step started from
  int kernels = 0;        // kernels the Run launched (every device's)
  int cache_hits = 0;     // of them, found in the compile cache
  int cache_misses = 0;   // compiled by this step (or waited for a concurrent compile)
  bool plan_cached = false;  // unknown to the Run response; true when nothing compiled
  double plan_ms = 0, compile_ms = 0, run_ms = 0, allreduce_ms = 0;  // uopd's split
  double client_ms = 0;   // building the graph and its gradients on the client
  double wall_ms = 0;     // the whole step, from the client
};

class SpiralsTrainer {
 public:
  // The session must hold every device of options.devices.
  SpiralsTrainer(client::Session& session, TrainOptions options);
  // The same steps through another realizer (the interpreter, an in-process LocalRunner):
  // what a uopd run is compared with. Without a session there are no uopd timings, and
  // check_replicas is FAILED_PRECONDITION.
  SpiralsTrainer(client::Realizer& realizer, TrainOptions options);

  // Forward, backward, allreduce, update: one Run.
  absl::StatusOr<StepReport> step();

  // Every replica of every parameter (and of the loss) the last step left on the devices,
  // downloaded and compared byte for byte: OK when the devices agree bit for bit,
  // DATA_LOSS naming the output and the devices otherwise.
  absl::Status check_replicas();

  // Fraction of the training points the current parameters classify correctly (the
  // forward pass on the host, from replica 0).
  absl::StatusOr<double> accuracy();

  // The current parameters on the host (replica 0's), in TrainOptions::initial_params' order.
  absl::StatusOr<std::vector<HostTensor>> parameters();

  const TrainOptions& options() const { return opts_; }

 private:
  void init();
  void make_batch();  // x_, y_ from data_
  client::Session* session_ = nullptr;  // null: realizer_ is another realizer
  TrainOptions opts_;
  SpiralsData data_;
  std::unique_ptr<client::RemoteRealizer> remote_;
  client::Realizer* realizer_ = nullptr;
  client::ContextPtr ctx_;  // the trainer's own graph arena
  client::Tensor x_, y_;
  std::vector<client::Tensor> params_;  // w1, b1, w2, b2, w3, b3
  int steps_ = 0;
};

}  // namespace uop::demo
