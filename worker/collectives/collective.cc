// Validation of a CollectiveRequest (the scheduler's mistakes are INVALID_ARGUMENT before
// any peer is involved) and the dispatch to a transport.
#include "worker/collectives/collective.h"

#include <chrono>

#include "compiler/ir/dtype.h"
#include "compiler/support/strings.h"
#include "worker/collectives/gloo_allreduce.h"
#include "worker/collectives/reduce.h"
#include "worker/collectives/shm_ring.h"

namespace uop {

absl::Status run_collective(const CollectiveSpec& spec, void* data, uint64_t data_bytes,
                            const std::function<bool()>& cancelled) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(cat("collective in group '", spec.group, "': ", why));
  };
  if (spec.group.empty()) return absl::InvalidArgumentError("a collective needs a group name");
  if (spec.size < 1 || spec.rank < 0 || spec.rank >= spec.size)
    return bad(cat("rank ", spec.rank, " is not in a group of ", spec.size));
  auto op = reduce_op_from_wire(spec.op);
  if (!op) return bad(cat("unknown op '", spec.op, "' (add, mul, max or min)"));
  auto dtype = scalar_from_name(spec.dtype);
  if (!dtype || *dtype == Scalar::Void) return bad(cat("unknown dtype '", spec.dtype, "'"));
  if (auto fn = combine_function(*op, *dtype); !fn.ok()) return bad(std::string(fn.status().message()));
  const uint64_t esize = static_cast<uint64_t>(scalar_bytes(*dtype));
  if (spec.elements > data_bytes / esize)
    return bad(cat(spec.elements, " ", spec.dtype, " elements need ", spec.elements > UINT64_MAX / esize ? 0 : spec.elements * esize,
                   " bytes, the buffer has ", data_bytes));
  const std::chrono::milliseconds timeout(spec.timeout_ms ? spec.timeout_ms : kDefaultCollectiveTimeoutMs);

  if (spec.transport == "shm") {
    ShmRingOptions o;
    o.group = spec.group;
    o.rank = spec.rank;
    o.size = spec.size;
    o.timeout = timeout;
    o.cancelled = cancelled;
    return shm_allreduce(o, data, spec.elements, *op, *dtype);
  }
  if (spec.transport == "gloo") {
    if (spec.rendezvous.empty()) return bad("gloo needs the scheduler's rendezvous address");
    GlooOptions o;
    o.group = spec.group;
    o.rank = spec.rank;
    o.size = spec.size;
    o.rendezvous = spec.rendezvous;
    o.timeout = timeout;
    return gloo_allreduce(o, data, spec.elements, *op, *dtype);
  }
  if (spec.transport == "nccl")
    return absl::UnimplementedError(cat("collective in group '", spec.group,
                                        "': nccl needs CUDA workers; this worker has no CUDA runtime yet"));
  return bad(cat("unknown transport '", spec.transport, "' (shm, gloo or nccl)"));
}

}  // namespace uop
