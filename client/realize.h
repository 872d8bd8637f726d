// Realizing tensors: their graph is made canonical, run by a Realizer, and each tensor
// becomes a leaf backed by its result, so the next graph starts from it.
//
// Determinism (why step 2 of a training loop is step 1's graph, and a cache hit): the
// graph of a realize is a SINK over the tensors' nodes in the order given, and every
// BUFFER in it is renumbered by its position in toposort(SINK) (a depth-first post-order
// along source order): BUFFER(UNIQUE k) is the k-th buffer met. The UNIQUE ids leaves get
// when they are made (TensorContext::kProvisionalUnique + a counter) never reach the
// wire. Everything else is hash-consed structure, so two realizes that build the same
// ops over leaves of the same dtype, size and device send the same graph, digest and all,
// whichever data the leaves hold and wherever it lives (host or session). A leaf made from
// host data and a realized result take the same form (RESHAPE of a BUFFER; a MULTI of
// those), so parameters created with Tensor::from / uniform and parameters realized by
// the previous step look alike. Constants (full, zeros) are no buffers: a parameter must
// start from host data, or be realized once, to keep the form.
//
// Realizers: RemoteRealizer runs through a client::Session (uopd), InterpRealizer through
// the reference interpreter, LocalRealizer (local/local_realizer.h, which links LLVM) through an
// in-process LocalRunner.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/tensor.h"

namespace uop::client {

struct RealizeOptions {
  // Leave the results in the session as buffers (only ids come back): parameters stay on
  // the server between training steps, and to_host() downloads on demand. Realizers that
  // run in this process hold results on the host either way.
  bool keep_outputs = false;
  // Parallel to realize_all's tensors (empty: none): into[k], when defined, is a realized
  // tensor of the same dtype, shape and placement whose storage tensors[k]'s result
  // replaces in place, as an assignment `into[k] = tensors[k]`: afterwards both hold the
  // result in the same storage (on the server, the same session buffers: uopd's
  // RunRequest.assign, so nothing new is allocated and nothing is left to free). What a
  // training step does with its parameters.
  std::vector<Tensor> into;
  // Host data the server does not hold yet goes inline with the run, for it only, instead
  // of being uploaded and kept in the session (a batch that changes every step). Data an
  // `into` tensor holds is uploaded all the same.
  bool inline_host_inputs = false;
  // The server keeps the graph, and later realizes of the same graph send only its
  // digest and bindings (client::RunOptions::hold_graph).
  bool hold_graph = false;
};

// One BUFFER of a canonical graph and the data bound to it.
struct RealizeInput {
  const UOp* buffer = nullptr;
  std::shared_ptr<LeafStorage> data;
};

struct CanonicalGraph {
  const UOp* sink = nullptr;         // SINK over the outputs; null when nothing is left to run
  std::vector<RealizeInput> inputs;  // inputs[k] binds BUFFER(UNIQUE k)
  std::vector<Tensor> outputs;       // the tensors behind the SINK's sources, in order
  // Per result (results()' order): the storage it is written into (RealizeOptions::into),
  // null for a new one.
  std::vector<std::shared_ptr<LeafStorage>> into;
  // How many results the run gives: one per single-device output, one per shard of a MULTI.
  size_t results() const;
};

// The graph realize_all would run: tensors already realized, and repeats of a node, are
// left out.
CanonicalGraph canonical_graph(const std::vector<Tensor>& tensors);

class Realizer {
 public:
  virtual ~Realizer() = default;
  // Runs graph.sink (in `g`, the tensors' context graph) and returns one result per output,
  // a MULTI giving one per shard (README "Multi-device"), each with host data or a server
  // buffer, its dtype and shape.
  virtual absl::StatusOr<std::vector<LeafStorage>> run(Graph& g, const CanonicalGraph& graph,
                                                       const RealizeOptions& opts) = 0;
  // Where a device-less result (a realized constant) is said to live.
  virtual std::string default_device() const { return "CPU:0"; }
};

// Realizes all of `tensors` with one graph and one run.
absl::Status realize_all(const std::vector<Tensor>& tensors, Realizer& r, const RealizeOptions& opts = {});

namespace detail {
// What ties server buffers to a live session: the remote realizer's, cleared when it goes.
struct SessionLink {
  Session* session = nullptr;
  std::vector<std::string> unused;  // buffers no tensor holds any more, freed on the next run
};
}  // namespace detail

// A buffer in a session that a leaf's data lives in. When the last leaf holding it goes,
// its id is queued and the remote realizer frees it on its next run (or when it goes).
class ServerBuffer {
 public:
  ServerBuffer(std::shared_ptr<detail::SessionLink> link, std::string id) : link_(std::move(link)), id_(std::move(id)) {}
  ~ServerBuffer();
  ServerBuffer(const ServerBuffer&) = delete;
  ServerBuffer& operator=(const ServerBuffer&) = delete;

  const std::string& id() const { return id_; }
  const detail::SessionLink* link() const { return link_.get(); }
  // FAILED_PRECONDITION once its realizer is gone.
  absl::StatusOr<HostTensor> download(Scalar dtype, const std::vector<int64_t>& shape) const;

 private:
  std::shared_ptr<detail::SessionLink> link_;
  std::string id_;
};

// Runs graphs through a uopd session: leaf data is uploaded once and kept as a session
// buffer for later runs; with keep_outputs, results stay in the session too. Graphs go by
// the session's Run (one device: the session's first, today).
class RemoteRealizer : public Realizer {
 public:
  explicit RemoteRealizer(Session& session);
  ~RemoteRealizer() override;
  RemoteRealizer(const RemoteRealizer&) = delete;
  RemoteRealizer& operator=(const RemoteRealizer&) = delete;

  absl::StatusOr<std::vector<LeafStorage>> run(Graph& g, const CanonicalGraph& graph, const RealizeOptions& opts) override;
  std::string default_device() const override;
  // What the last run reported: kernels with their cache status, timings.
  const std::optional<RunResult>& last_run() const { return last_; }
  // Frees buffers no tensor holds any more (each run does it first).
  absl::Status flush();

 private:
  absl::StatusOr<std::string> ensure_uploaded(LeafStorage& s);
  Session& session_;
  std::shared_ptr<detail::SessionLink> link_;
  std::optional<RunResult> last_;
};

// Runs graphs through the reference interpreter (compiler/interp): slow and exact; results
// on the host. For tests and small graphs.
class InterpRealizer : public Realizer {
 public:
  absl::StatusOr<std::vector<LeafStorage>> run(Graph& g, const CanonicalGraph& graph, const RealizeOptions& opts) override;
};

namespace detail {
// The host data of each input (downloaded where it lives only in a session).
absl::StatusOr<std::vector<HostTensor>> host_inputs(const CanonicalGraph& graph);
// graph.sink rebuilt in `dst` with each input's BUFFER found again: for realizers that
// lower in a Graph of their own, so the context's arena does not grow with every run.
const UOp* clone_graph(Graph& dst, const CanonicalGraph& graph, std::vector<const UOp*>& buffers);
// Results for Realizer::run from one logical value per output (what the interpreter and
// LocalRunner return: a MULTI assembled): a multi-device output is cut back into its
// shards by its placement (a replicated one repeated per device).
absl::StatusOr<std::vector<LeafStorage>> host_results(const CanonicalGraph& graph, std::vector<HostTensor> logical);
// A realizer that computes in this process: the inputs' host data bound to a clone of the
// graph, `compute` (the interpreter, LocalRunner) gives one logical value per output, and
// host_results cuts them into Realizer::run's results.
using HostCompute = std::function<absl::StatusOr<std::vector<HostTensor>>(
    Graph& g, const UOp* sink, const absl::flat_hash_map<const UOp*, HostTensor>& inputs)>;
absl::StatusOr<std::vector<LeafStorage>> realize_on_host(const CanonicalGraph& graph, const HostCompute& compute);
}  // namespace detail

}  // namespace uop::client
