// UOp: one immutable node of the IR (op, dtype, ordered sources, arg), and Graph: the arena
// that owns nodes and hash-conses them. Inside one Graph, structurally equal nodes are the
// same object, so equality is pointer equality and a shared subexpression exists once.
//
// A Graph is used by one thread at a time. Nodes live as long as their Graph. The
// structural digest (SHA-256, see digest.h) is computed on first use and memoized; it does
// not depend on the Graph, the order nodes were made in, or pointers.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"
#include "compiler/ir/op.h"

namespace uop {

struct Digest {
  std::array<uint8_t, 32> bytes{};

  std::string hex() const;
  std::string short_hex(size_t n = 12) const { return hex().substr(0, n); }
  static std::optional<Digest> from_hex(std::string_view hex);

  auto operator<=>(const Digest&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const Digest& d) { return H::combine(std::move(h), d.bytes); }
};

class Graph;

class UOp {
 public:
  class Passkey {
    friend class Graph;
    Passkey() = default;
  };
  UOp(Passkey, Op op, DType dtype, const UOp* const* src, uint32_t nsrc, const Arg* arg, uint32_t id,
      size_t hash)
      : op_(op), nsrc_(nsrc), id_(id), dtype_(dtype), src_(src), arg_(arg), hash_(hash) {}
  UOp(const UOp&) = delete;
  UOp& operator=(const UOp&) = delete;

  Op op() const { return op_; }
  const DType& dtype() const { return dtype_; }
  std::span<const UOp* const> src() const { return {src_, nsrc_}; }
  const UOp* src(size_t i) const { return src_[i]; }
  size_t num_src() const { return nsrc_; }
  const Arg& arg() const { return *arg_; }
  template <typename T>
  const T& arg_as() const { return std::get<T>(*arg_); }
  template <typename T>
  const T* arg_if() const { return std::get_if<T>(arg_); }
  // Creation order within the owning Graph; dense from 0.
  uint32_t id() const { return id_; }
  // Fast structural hash used for interning (not stable across processes).
  size_t structural_hash() const { return hash_; }
  // SHA-256 over the canonical encoding of (op, dtype, arg, sources' digests).
  const Digest& digest() const;

  bool is(Op op) const { return op_ == op; }
  // CONST's value, if this is a CONST.
  const ConstValue* const_value() const { return op_ == Op::CONST ? &std::get<ConstValue>(*arg_) : nullptr; }

 private:
  friend void compute_digests(const UOp* root);
  Op op_;
  mutable bool has_digest_ = false;
  uint32_t nsrc_;
  uint32_t id_;
  DType dtype_;
  const UOp* const* src_;
  const Arg* arg_;  // owned by the Graph; one shared NoArg for the many nodes without one
  size_t hash_;
  mutable Digest digest_;
};

// Computes and memoizes the digests of `root` and everything below it, without recursion.
void compute_digests(const UOp* root);

static_assert(alignof(UOp) <= alignof(std::max_align_t), "Graph's node chunks come from operator new[]");

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // The one node with these fields, made if it does not exist yet. No semantic checks are
  // done here (the verifier does them); `arg` must be of the op's arg kind.
  const UOp* make(Op op, DType dtype, std::span<const UOp* const> src, Arg arg);
  const UOp* make(Op op, DType dtype, std::initializer_list<const UOp*> src, Arg arg) {
    return make(op, dtype, std::span<const UOp* const>(src.begin(), src.size()), std::move(arg));
  }
  // As above with the op's default arg.
  const UOp* make(Op op, DType dtype, std::span<const UOp* const> src = {});
  const UOp* make(Op op, DType dtype, std::initializer_list<const UOp*> src) {
    return make(op, dtype, std::span<const UOp* const>(src.begin(), src.size()));
  }
  // The same node with some fields replaced; returns `u` itself if nothing changes.
  const UOp* replace_src(const UOp* u, std::span<const UOp* const> src);
  const UOp* replace_dtype(const UOp* u, DType dtype);

  // CONST of `dtype` holding `v` converted with CAST semantics (so 3.7 as int32 is 3).
  const UOp* cnst(DType dtype, ConstValue v);
  const UOp* cnst(DType dtype, double v) { return cnst(dtype, ConstValue::Float(v)); }
  const UOp* cnst_int(DType dtype, int64_t v) { return cnst(dtype, ConstValue::Int(v)); }
  const UOp* cnst_bool(bool v) { return cnst(dtypes::bool_, ConstValue::Bool(v)); }
  const UOp* idx(int64_t v) { return cnst_int(dtypes::index, v); }
  // An ALU op with the usual result dtype: the operands' (bool for comparisons, the
  // second operand's for WHERE).
  const UOp* alu(Op op, std::initializer_list<const UOp*> src);
  const UOp* alu(Op op, std::span<const UOp* const> src);

  size_t size() const { return count_; }

  // A bound for graphs from the network: graph_rewrite, the engine every pass runs on,
  // stops with RESOURCE_EXHAUSTED naming `name` once size() has passed `limit` (0: none).
  // Nodes are still made past it; the rewrite in progress is what stops.
  void set_node_limit(size_t limit, std::string name) {
    node_limit_ = limit;
    node_limit_name_ = std::move(name);
  }
  size_t node_limit() const { return node_limit_; }
  const std::string& node_limit_name() const { return node_limit_name_; }

 private:
  struct Key {
    Op op;
    const DType* dtype;
    std::span<const UOp* const> src;
    const Arg* arg;
    size_t hash;
  };
  struct Hash {
    using is_transparent = void;
    size_t operator()(const UOp* u) const { return u->structural_hash(); }
    size_t operator()(const Key& k) const { return k.hash; }
  };
  struct Eq {
    using is_transparent = void;
    bool operator()(const UOp* a, const UOp* b) const { return a == b; }
    bool operator()(const Key& k, const UOp* u) const;
    bool operator()(const UOp* u, const Key& k) const { return (*this)(k, u); }
  };
  static size_t hash_of(Op op, const DType& dtype, std::span<const UOp* const> src, const Arg& arg);

  // Nodes live in fixed chunks (never moved, one allocation per kChunk nodes); args other
  // than NoArg in a deque beside them. Keeping the variant out of the node keeps nodes
  // small: the largest arg (WMMA's) is several times the size of everything else.
  static constexpr size_t kChunk = 256;
  std::vector<std::unique_ptr<unsigned char[]>> chunks_;
  size_t count_ = 0;
  size_t node_limit_ = 0;
  std::string node_limit_name_;
  std::deque<Arg> args_;
  std::pmr::monotonic_buffer_resource src_pool_;
  absl::flat_hash_set<const UOp*, Hash, Eq> interned_;
};

// Every node reachable from the roots, sources before users, each once. Deterministic:
// a depth-first post-order following source order. Iterative, so any depth is fine.
std::vector<const UOp*> toposort(std::span<const UOp* const> roots);
inline std::vector<const UOp*> toposort(const UOp* root) { return toposort(std::span<const UOp* const>(&root, 1)); }

// `root` with every node that is a key of `replace` swapped for its value; the walk does
// not look inside replaced nodes. Unchanged parts come back as themselves. Iterative.
const UOp* substitute(Graph& g, const UOp* root, const absl::flat_hash_map<const UOp*, const UOp*>& replace);

// The same structure rebuilt in `dst` (another Graph): for handing a subgraph to another
// thread, since a Graph is used by one thread at a time. Iterative.
const UOp* clone_into(Graph& dst, const UOp* root);

// The index by which messages name a node: its position on the wire for decoded graphs
// (codec.h), its position in toposort() for graphs built in memory.
using NodeIndex = absl::flat_hash_map<const UOp*, uint32_t>;
NodeIndex index_by_toposort(const UOp* root);

}  // namespace uop
