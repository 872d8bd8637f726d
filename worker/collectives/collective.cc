// Validation of a CollectiveRequest (the scheduler's mistakes are INVALID_ARGUMENT before
// any peer is involved) and the dispatch to a transport.
#include "worker/collectives/collective.h"

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "compiler/ir/dtype.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "worker/collectives/gloo_allreduce.h"
#include "worker/collectives/nccl_allreduce.h"
#include "worker/collectives/reduce.h"
#include "worker/collectives/shm_ring.h"
#include "worker/sandbox.h"

namespace uop {
namespace {

absl::Status bad(const CollectiveSpec& spec, const std::string& why) {
  return absl::InvalidArgumentError(cat("collective in group '", spec.group, "': ", why));
}

struct Checked {
  ReduceOp op;
  Scalar dtype;
  std::chrono::milliseconds timeout;
  std::vector<uint64_t> counts;  // elements of each buffer
  uint64_t total = 0;            // their sum
};

// What every transport needs of a spec and its buffers (their sizes in bytes).
absl::StatusOr<Checked> check_spec(const CollectiveSpec& spec, std::span<const uint64_t> buffer_bytes) {
  if (spec.group.empty()) return absl::InvalidArgumentError("a collective needs a group name");
  if (spec.size < 1 || spec.rank < 0 || spec.rank >= spec.size)
    return bad(spec, cat("rank ", spec.rank, " is not in a group of ", spec.size));
  auto op = reduce_op_from_wire(spec.op);
  if (!op) return bad(spec, cat("unknown op '", spec.op, "' (add, mul, max or min)"));
  auto dtype = scalar_from_name(spec.dtype);
  if (!dtype || *dtype == Scalar::Void) return bad(spec, cat("unknown dtype '", spec.dtype, "'"));
  if (auto fn = combine_function(*op, *dtype); !fn.ok()) return bad(spec, std::string(fn.status().message()));
  if (spec.bucket.size() > kMaxBucketBuffers)
    return bad(spec, cat("a bucket of ", spec.bucket.size(), " buffers (at most ", kMaxBucketBuffers, ")"));
  Checked c{*op, *dtype, std::chrono::milliseconds(spec.timeout_ms ? spec.timeout_ms : kDefaultCollectiveTimeoutMs)};
  c.counts = spec.bucket.empty() ? std::vector<uint64_t>{spec.elements} : spec.bucket;
  if (c.counts.size() != buffer_bytes.size())
    return bad(spec, cat("a bucket of ", c.counts.size(), " buffers, given ", buffer_bytes.size()));
  const uint64_t esize = static_cast<uint64_t>(scalar_bytes(*dtype));
  for (size_t i = 0; i < c.counts.size(); ++i) {
    const uint64_t n = c.counts[i];
    if (n > buffer_bytes[i] / esize)
      return bad(spec, cat(c.counts.size() > 1 ? cat("bucket buffer ", i, ": ") : std::string(), n, " ", spec.dtype,
                           " elements need ", n > UINT64_MAX / esize ? 0 : n * esize, " bytes, the buffer has ",
                           buffer_bytes[i]));
    c.total += n;  // no overflow: each is at most its buffer's bytes, and they all fit in memory
  }
  return c;
}

// A formed group of this process: its transport's state, kept between calls when the
// group lives (keep_group), else for one call.
struct Group {
  std::mutex mu;  // one call at a time: the members' calls must line up
  std::string transport;
  int rank = 0, size = 0;
  std::unique_ptr<ShmRing> shm;
  std::unique_ptr<GlooGroup> gloo;
  std::vector<uint8_t> staging;  // a bucket's flat copy, kept for the next call
  uint64_t last_use = 0;
  bool formed() const { return shm || gloo; }
};

// The living groups, by name. At most kMaxLiveGroups: the least recently used goes (its
// members' scheduler dropped it long ago, or it would have been used).
class LiveGroups {
 public:
  static constexpr size_t kMaxLiveGroups = 16;
  static LiveGroups& get() {
    static auto* g = new LiveGroups();  // never destroyed: a call may still hold a group at exit
    return *g;
  }
  std::shared_ptr<Group> find_or_add(const std::string& name) {
    std::lock_guard l(mu_);
    auto [it, added] = groups_.try_emplace(name);
    if (added) {
      it->second = std::make_shared<Group>();
      if (groups_.size() > kMaxLiveGroups) {
        auto oldest = groups_.end();
        for (auto i = groups_.begin(); i != groups_.end(); ++i)
          if (i != it && (oldest == groups_.end() || i->second->last_use < oldest->second->last_use)) oldest = i;
        groups_.erase(oldest);
      }
    }
    it->second->last_use = ++clock_;
    return it->second;
  }
  void drop(const std::string& name, const Group* g) {
    std::lock_guard l(mu_);
    if (auto it = groups_.find(name); it != groups_.end() && it->second.get() == g) groups_.erase(it);
  }
  size_t size() {
    std::lock_guard l(mu_);
    return groups_.size();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
  uint64_t clock_ = 0;
};

// Joins (shm) or connects (gloo) the group.
absl::Status form(Group& g, const CollectiveSpec& spec, const Checked& c, const std::function<bool()>& cancelled) {
  g.transport = spec.transport;
  g.rank = spec.rank;
  g.size = spec.size;
  if (spec.transport == "shm") {
    ShmRingOptions o;
    o.group = spec.group;
    o.rank = spec.rank;
    o.size = spec.size;
    o.timeout = c.timeout;
    o.cancelled = cancelled;
    auto ring = ShmRing::join(o);
    if (!ring.ok()) return ring.status();
    g.shm = std::move(*ring);
    return absl::OkStatus();
  }
  GlooOptions o;
  o.group = spec.group;
  o.rank = spec.rank;
  o.size = spec.size;
  o.rendezvous = spec.rendezvous;
  o.rendezvous_dial = spec.rendezvous_dial;
  o.timeout = c.timeout;
  auto group = GlooGroup::connect(o);
  if (!group.ok()) return group.status();
  g.gloo = std::move(*group);
  return absl::OkStatus();
}

absl::Status reduce_one(Group& g, void* data, uint64_t elements, const Checked& c, std::span<const uint64_t> parts = {}) {
  return g.shm ? g.shm->allreduce(data, elements, c.op, c.dtype, parts) : g.gloo->allreduce(data, elements, c.op, c.dtype);
}

// The buffers' allreduce on a formed group. A bucket is copied into one flat buffer,
// reduced by one allreduce and copied back. So that every element is reduced in the
// order it would be alone: for the shm ring the flat buffer holds every buffer's ring
// part 0, then every part 1, ..., and the ring is given those part sizes (an element's
// order depends only on its part); Gloo between two members combines each element once
// (x op y: the same bits either way round), between more in an order of its own, so
// there each buffer goes through the group alone.
absl::Status reduce_buffers(Group& g, std::span<const HostBuffer> buffers, const Checked& c) {
  if (c.counts.size() == 1) return reduce_one(g, buffers[0].data, c.counts[0], c);
  const uint64_t esize = static_cast<uint64_t>(scalar_bytes(c.dtype));
  if (g.gloo && g.size > 2) {
    for (size_t i = 0; i < buffers.size(); ++i)
      if (c.counts[i] > 0) RETURN_IF_ERROR(reduce_one(g, buffers[i].data, c.counts[i], c));
    return absl::OkStatus();
  }
  g.staging.resize(c.total * esize);
  uint8_t* flat = g.staging.data();
  const int parts = g.shm ? g.size : 1;
  std::vector<uint64_t> part_sizes(parts, 0);
  auto walk = [&](bool pack) {
    uint64_t at = 0;
    for (int j = 0; j < parts; ++j)
      for (size_t i = 0; i < buffers.size(); ++i) {
        const RingPart p = parts == 1 ? RingPart{0, c.counts[i]} : ring_part(c.counts[i], parts, j);
        uint8_t* b = static_cast<uint8_t*>(buffers[i].data) + p.offset * esize;
        if (p.count) pack ? std::memcpy(flat + at * esize, b, p.count * esize) : std::memcpy(b, flat + at * esize, p.count * esize);
        at += p.count;
        if (pack) part_sizes[j] += p.count;
      }
  };
  walk(true);
  RETURN_IF_ERROR(reduce_one(g, flat, c.total, c, g.shm ? std::span<const uint64_t>(part_sizes) : std::span<const uint64_t>()));
  walk(false);
  return absl::OkStatus();
}

}  // namespace

size_t live_collective_groups() { return LiveGroups::get().size(); }

absl::Status run_collective(const CollectiveSpec& spec, void* data, uint64_t data_bytes,
                            const std::function<bool()>& cancelled) {
  const HostBuffer one{data, data_bytes};
  return run_collective(spec, std::span<const HostBuffer>(&one, 1), cancelled);
}

absl::Status run_collective(const CollectiveSpec& spec, std::span<const HostBuffer> buffers,
                            const std::function<bool()>& cancelled) {
  std::vector<uint64_t> sizes;
  for (const HostBuffer& b : buffers) sizes.push_back(b.bytes);
  ASSIGN_OR_RETURN(const Checked c, check_spec(spec, sizes));

  if (spec.transport == "gloo") {
    if (spec.rendezvous.empty()) return bad(spec, "gloo needs the scheduler's rendezvous address");
    if (in_sandbox() && !is_numeric_host(spec.rendezvous))
      return absl::FailedPreconditionError(
          cat("collective '", spec.group, "': the rendezvous ", spec.rendezvous,
              " is a host name, which a sandboxed worker cannot resolve (it opens no files, /etc/hosts included): "
              "give the scheduler an address to listen on (uopd --listen=IP:PORT), or run workers with --seccomp=off"));
  } else if (spec.transport == "nccl") {
    return bad(spec, "nccl reduces GPU memory and this buffer is in host memory (a CPU worker's)");
  } else if (spec.transport != "shm") {
    return bad(spec, cat("unknown transport '", spec.transport, "' (shm, gloo or nccl)"));
  }

  if (!spec.keep_group) {
    Group g;
    RETURN_IF_ERROR(form(g, spec, c, cancelled));
    return reduce_buffers(g, buffers, c);
  }
  std::shared_ptr<Group> g = LiveGroups::get().find_or_add(spec.group);
  std::lock_guard l(g->mu);
  absl::Status st;
  if (!g->formed()) {
    st = form(*g, spec, c, cancelled);
  } else if (g->transport != spec.transport || g->rank != spec.rank || g->size != spec.size) {
    return bad(spec, cat("the group was formed as rank ", g->rank, " of ", g->size, " over ", g->transport,
                         ", this call is rank ", spec.rank, " of ", spec.size, " over ", spec.transport));
  } else if (g->shm) {
    g->shm->rebind(c.timeout, cancelled);
  }
  if (st.ok()) st = reduce_buffers(*g, buffers, c);
  if (g->shm) g->shm->rebind(c.timeout, {});  // `cancelled` is this call's only
  // A failed group is done for: the scheduler forms the next one under another name.
  if (!st.ok()) LiveGroups::get().drop(spec.group, g.get());
  return st;
}

absl::Status run_collective(const CollectiveSpec& spec, const DeviceBufferRef& buffer,
                            const std::function<bool()>& cancelled) {
  const uint64_t bytes[1] = {buffer.bytes};
  ASSIGN_OR_RETURN(const Checked checked, check_spec(spec, bytes));
  if (checked.counts.size() != 1) return bad(spec, "nccl reduces one buffer at a time (no bucket)");
  if (spec.keep_group) return bad(spec, "nccl forms its communicator for each call (keep_group is for shm and gloo)");
  const ReduceOp op = checked.op;
  const Scalar dtype = checked.dtype;
  const auto timeout = checked.timeout;
  if (spec.transport != "nccl")
    return bad(spec, cat("transport '", spec.transport, "' reduces host memory, this buffer is in GPU memory"));
  if (spec.size > 1 && spec.rendezvous.empty()) return bad(spec, "nccl needs the scheduler's rendezvous address");
  if (auto type = nccl_datatype(dtype); !type.ok()) return bad(spec, std::string(type.status().message()));
  if (!buffer.context) return bad(spec, "a GPU buffer needs its CUDA context");
  NcclOptions o;
  o.group = spec.group;
  o.rank = spec.rank;
  o.size = spec.size;
  o.rendezvous = spec.rendezvous;
  o.rendezvous_dial = spec.rendezvous_dial;
  o.timeout = timeout;
  o.cancelled = cancelled;
  o.context = buffer.context;
  return nccl_allreduce(o, static_cast<cu::DevicePtr>(buffer.address), spec.elements, op, dtype);
}

}  // namespace uop
