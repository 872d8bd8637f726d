// The tensor frontend: a lazy Tensor that builds tensor-level graphs (compiler/ir/README.md
// "Tensor level" and "Multi-device") in a shared TensorContext, realizes them through a
// Realizer (realize.h: the service, or in-process), and differentiates them (autograd.h).
//
//   auto x = Tensor::from(batch).shard({"CPU:0", "CPU:1"}, 0);    // data parallel
//   auto w = Tensor::uniform({784, 64}, -0.1, 0.1, 1).shard({"CPU:0", "CPU:1"}, -1);
//   w.requires_grad_();
//   Tensor loss = cross_entropy(x.matmul(w), labels);
//   loss.backward();                                                // builds w.grad()
//   Tensor w_next = (w - w.grad() * 0.1).detach();
//   realize_all({loss, w_next}, remote, {.keep_outputs = true});    // one graph, one Run
//
// Nothing runs until realize: every op adds nodes to the context's Graph and records the
// node's logical shape and placement (NodeInfo). A realized tensor becomes a leaf backed by
// its result, so the next graph starts from it.
//
// Placement. A tensor lives on one device, or is a MULTI over several: sharded along an
// axis or replicated (README "Multi-device"). Ops on MULTIs are built at the logical level
// and left to the multi pass, within the README's contract: an ALU op's operands are MULTIs
// of one layout or device-less constants (the frontend reshards a replicated or
// single-device operand first: MSELECT / COPY + SHRINK + EXPAND per shard), and a movement
// op that would touch the shard axis first gathers the tensor (replicates it). A
// REDUCE_AXIS over the shard axis is left as it is: the multi pass makes it a per-shard
// reduce plus an ALLREDUCE, which is how gradients of replicated weights get summed.
// Constants (full, zeros, scalars in arithmetic) carry no device: they take the placement
// of what they meet.
//
// Mistakes in the caller's shapes, dtypes or axes are broken invariants of the calling
// program, not input from the network: they abort with a message (even in release builds).
// A Tensor and its context are used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/uop.h"

namespace uop::client {

class Realizer;
class ServerBuffer;
struct TensorImpl;
struct RealizeOptions;

// Where a tensor's values live.
struct Placement {
  std::vector<std::string> devices;  // empty: a device-less constant; one: single-device; more: MULTI
  int64_t axis = -1;                 // MULTI: the shard axis, -1 replicated
  std::vector<int64_t> splits;       // sharded: each shard's size along `axis`, in device order

  bool constant() const { return devices.empty(); }
  bool single() const { return devices.size() == 1; }
  bool multi() const { return devices.size() > 1; }
  bool sharded() const { return multi() && axis >= 0; }
  bool replicated() const { return multi() && axis < 0; }
  // Shard i's offset along the shard axis.
  int64_t offset(size_t i) const;
  std::string str() const;  // "CPU:0", "const", "{CPU:0, CPU:1} axis 0 [4, 4]"
  bool operator==(const Placement&) const = default;

  static Placement on(std::string device) { return Placement{{std::move(device)}, -1, {}}; }
  // `dim` split as evenly as possible, the first shards one larger when it does not divide.
  static Placement shard(std::vector<std::string> devices, int64_t axis, int64_t dim);
  static Placement replicate(std::vector<std::string> devices) { return Placement{std::move(devices), -1, {}}; }
};

// The data behind one leaf BUFFER: a host tensor, a buffer in a session, or both (host data
// uploaded once keeps its server copy for later realizes).
struct LeafStorage {
  Scalar dtype = Scalar::Float32;
  std::vector<int64_t> shape;  // this buffer's logical shape (a shard's, for MULTI leaves)
  std::string device;
  std::optional<HostTensor> host;
  std::shared_ptr<ServerBuffer> server;  // freed on the server when the last holder goes
};

// What the context knows about each node the frontend made.
struct NodeInfo {
  std::vector<int64_t> shape;  // logical
  Placement placement;
  // A layout change the frontend built (shard, to, reshard, gather; possibly with a
  // broadcast): autograd sends the gradient straight to this node, summed to its shape,
  // instead of walking the MSELECT / COPY / MULTI structure underneath.
  const UOp* relayout_of = nullptr;
  bool leaf = false;  // backed by data (BUFFERs); gradients stop here
};

// The Graph every tensor of a program lives in, the nodes' shapes and placements, the
// DEVICE nodes, and the data of leaf BUFFERs (held weakly: tensors own their leaves).
class TensorContext {
 public:
  static std::shared_ptr<TensorContext> make();
  TensorContext(const TensorContext&) = delete;
  TensorContext& operator=(const TensorContext&) = delete;

  Graph& graph() { return *graph_; }
  const NodeInfo& info(const UOp* u) const;  // aborts for a node the frontend did not make
  const NodeInfo* find(const UOp* u) const;
  // The leaf data behind a BUFFER, while a tensor still holds it.
  std::shared_ptr<LeafStorage> storage(const UOp* buffer) const;

  // Frontend internals (tensor*.cc, realize.cc, autograd.cc).
  const UOp* device_node(const std::string& device);
  const UOp* record(const UOp* u, NodeInfo info);
  // A fresh BUFFER for `data` viewed as data->shape. Its UNIQUE id is provisional (counted
  // from kProvisionalUnique): realize renumbers buffers by position (realize.h).
  const UOp* leaf_node(const std::shared_ptr<LeafStorage>& data);
  static constexpr int64_t kProvisionalUnique = int64_t{1} << 40;
  // Tensors with requires_grad, by node: backward() finds them in the loss's graph.
  void watch(const std::shared_ptr<TensorImpl>& t);
  std::vector<std::shared_ptr<TensorImpl>> watchers(const UOp* u) const;
  // Every tensor made in this context, held weakly: what compact() keeps.
  void adopt(const std::shared_ptr<TensorImpl>& t);

  // Forgets every node no living tensor reaches: the nodes of the tensors alive (and what
  // their nodes' records name) are rebuilt in a fresh Graph, the tensors moved onto them,
  // and the old Graph goes. Without it the context grows by every step of a training loop
  // (each realize makes new leaves, so every node of the next step is new). Node pointers
  // from before (Tensor::node(), Graph&) are invalid after it. realize_all calls
  // compact_if_grown() last, when nothing else is using the graph: once the graph has
  // grown past twice what the last compaction kept, and past kCompactNodes.
  void compact();
  void compact_if_grown();
  static constexpr size_t kCompactNodes = size_t{1} << 16;

 private:
  TensorContext() = default;
  std::unique_ptr<Graph> graph_ = std::make_unique<Graph>();
  std::vector<std::weak_ptr<TensorImpl>> tensors_;  // adopt(); pruned by compact()
  size_t tensors_kept_ = 0;                          // tensors_.size() after the last prune
  size_t nodes_kept_ = 0;                            // graph_->size() after the last compact()
  absl::node_hash_map<const UOp*, NodeInfo> info_;  // node map: references stay valid as it grows
  absl::flat_hash_map<const UOp*, std::weak_ptr<LeafStorage>> storage_;
  absl::flat_hash_map<std::string, const UOp*> devices_;
  absl::flat_hash_map<const UOp*, std::vector<std::weak_ptr<TensorImpl>>> watched_;
  int64_t next_unique_ = kProvisionalUnique;
};
using ContextPtr = std::shared_ptr<TensorContext>;
// This thread's default context (made on first use); creation functions use it when
// given no context.
const ContextPtr& default_context();

class Tensor {
 public:
  Tensor() = default;

  // ---- creation
  // A leaf holding `data` (uploaded on the first realize through a session).
  static Tensor from(HostTensor data, const std::string& device = "CPU:0", ContextPtr ctx = nullptr);
  // Device-less constants.
  static Tensor full(std::vector<int64_t> shape, double value, Scalar dtype = Scalar::Float32, ContextPtr ctx = nullptr);
  static Tensor zeros(std::vector<int64_t> shape, Scalar dtype = Scalar::Float32, ContextPtr ctx = nullptr);
  static Tensor ones(std::vector<int64_t> shape, Scalar dtype = Scalar::Float32, ContextPtr ctx = nullptr);
  // Leaves of seeded host data (the same seed, the same values on every machine): uniform
  // in [0, 1) / [low, high), and 0, 1, ..., n-1.
  static Tensor rand(std::vector<int64_t> shape, uint64_t seed, Scalar dtype = Scalar::Float32,
                     const std::string& device = "CPU:0", ContextPtr ctx = nullptr);
  static Tensor uniform(std::vector<int64_t> shape, double low, double high, uint64_t seed,
                        Scalar dtype = Scalar::Float32, const std::string& device = "CPU:0", ContextPtr ctx = nullptr);
  static Tensor arange(int64_t n, Scalar dtype = Scalar::Int32, const std::string& device = "CPU:0",
                       ContextPtr ctx = nullptr);

  // ---- what it is
  bool defined() const { return impl_ != nullptr; }
  // Valid until the next realize in this context (which may compact it:
  // TensorContext::compact).
  const UOp* node() const;
  const std::vector<int64_t>& shape() const;
  int64_t ndim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const;
  Scalar dtype() const;
  const Placement& placement() const;
  const ContextPtr& context() const;
  // A realized tensor: a leaf whose data is on the host or in a session.
  bool realized() const;

  // ---- autograd (autograd.h)
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;  // undefined until backward() reached this leaf
  void set_grad(Tensor g);
  void backward(const Tensor& seed = {}) const;

  // ---- elementwise (operands broadcast NumPy-style; one dtype; scalars take the tensor's)
  Tensor operator-() const;
  Tensor exp() const;   // exp2(x * log2 e)
  Tensor log() const;   // log2(x) * ln 2
  Tensor exp2() const;
  Tensor log2() const;
  Tensor sqrt() const;
  Tensor reciprocal() const;
  Tensor square() const;
  Tensor relu() const;  // max(x, 0)
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor maximum(const Tensor& o) const;
  Tensor minimum(const Tensor& o) const;
  // Comparisons give bool and no gradient.
  Tensor lt(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor cast(Scalar to) const;
  Tensor detach() const;      // the same values, no gradient through it
  Tensor contiguous() const;  // materialized in a buffer of its own

  // ---- reductions (no axes: all of them; negative axes count from the end)
  Tensor sum(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor max(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor mean(std::vector<int64_t> axes = {}, bool keepdim = false) const;
  Tensor softmax(int64_t axis = -1) const;
  Tensor log_softmax(int64_t axis = -1) const;
  // [..., m, k] x [..., k, n], batch dims broadcast.
  Tensor matmul(const Tensor& o) const;

  // ---- movement
  Tensor reshape(std::vector<int64_t> shape) const;  // one dim may be -1
  Tensor permute(std::vector<int64_t> axes) const;
  Tensor transpose(int64_t a = -2, int64_t b = -1) const;
  Tensor expand(std::vector<int64_t> shape) const;  // NumPy broadcast to `shape`
  Tensor pad(std::vector<int64_t> begins, std::vector<int64_t> ends) const;  // zeros
  Tensor shrink(std::vector<int64_t> begins, std::vector<int64_t> ends) const;
  Tensor flip(std::vector<int64_t> axes) const;

  // ---- devices
  // A MULTI over `devices`: sharded along `axis`, or replicated with axis -1. A leaf of host
  // data that needs no gradient is sliced on the host and uploaded per device; anything
  // else becomes per-device shrinks of this tensor followed by COPY.
  Tensor shard(std::vector<std::string> devices, int64_t axis) const;
  // A copy on one device (COPY; a MULTI is gathered).
  Tensor to(const std::string& device) const;

  // ---- realize (realize.h)
  absl::Status realize(Realizer& r) const;
  absl::Status realize(Realizer& r, const RealizeOptions& opts) const;
  // The values of a realized tensor: host data, or downloaded from its session. A MULTI is
  // assembled (shards concatenated; replica 0).
  absl::StatusOr<HostTensor> to_host() const;

  // Frontend internals.
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// cond ? a : b elementwise (cond bool); the gradient goes to the side that was taken.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Mean over the batch of -sum(labels * log_softmax(logits, 1)) for logits [N, C] and labels
// either [N, C] (one-hot or probabilities, the logits' dtype) or [N] class indices (an
// integer dtype).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);

}  // namespace uop::client
