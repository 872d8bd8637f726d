// Validation of a CollectiveRequest (the scheduler's mistakes are INVALID_ARGUMENT before
// any peer is involved) and the dispatch to a transport.
#include "worker/collectives/collective.h"

#include <chrono>

#include "compiler/ir/dtype.h"
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
};

// What every transport needs of a spec and its buffer.
absl::StatusOr<Checked> check_spec(const CollectiveSpec& spec, uint64_t data_bytes) {
  if (spec.group.empty()) return absl::InvalidArgumentError("a collective needs a group name");
  if (spec.size < 1 || spec.rank < 0 || spec.rank >= spec.size)
    return bad(spec, cat("rank ", spec.rank, " is not in a group of ", spec.size));
  auto op = reduce_op_from_wire(spec.op);
  if (!op) return bad(spec, cat("unknown op '", spec.op, "' (add, mul, max or min)"));
  auto dtype = scalar_from_name(spec.dtype);
  if (!dtype || *dtype == Scalar::Void) return bad(spec, cat("unknown dtype '", spec.dtype, "'"));
  if (auto fn = combine_function(*op, *dtype); !fn.ok()) return bad(spec, std::string(fn.status().message()));
  const uint64_t esize = static_cast<uint64_t>(scalar_bytes(*dtype));
  if (spec.elements > data_bytes / esize)
    return bad(spec, cat(spec.elements, " ", spec.dtype, " elements need ",
                         spec.elements > UINT64_MAX / esize ? 0 : spec.elements * esize, " bytes, the buffer has ",
                         data_bytes));
  return Checked{*op, *dtype, std::chrono::milliseconds(spec.timeout_ms ? spec.timeout_ms : kDefaultCollectiveTimeoutMs)};
}

}  // namespace

absl::Status run_collective(const CollectiveSpec& spec, void* data, uint64_t data_bytes,
                            const std::function<bool()>& cancelled) {
  auto checked = check_spec(spec, data_bytes);
  if (!checked.ok()) return checked.status();
  const auto [op, dtype, timeout] = *checked;

  if (spec.transport == "shm") {
    ShmRingOptions o;
    o.group = spec.group;
    o.rank = spec.rank;
    o.size = spec.size;
    o.timeout = timeout;
    o.cancelled = cancelled;
    return shm_allreduce(o, data, spec.elements, op, dtype);
  }
  if (spec.transport == "gloo") {
    if (spec.rendezvous.empty()) return bad(spec, "gloo needs the scheduler's rendezvous address");
    if (in_sandbox() && !is_numeric_host(spec.rendezvous))
      return absl::FailedPreconditionError(
          cat("collective '", spec.group, "': the rendezvous ", spec.rendezvous,
              " is a host name, which a sandboxed worker cannot resolve (it opens no files, /etc/hosts included): "
              "give the scheduler an address to listen on (uopd --listen=IP:PORT), or run workers with --seccomp=off"));
    GlooOptions o;
    o.group = spec.group;
    o.rank = spec.rank;
    o.size = spec.size;
    o.rendezvous = spec.rendezvous;
    o.rendezvous_dial = spec.rendezvous_dial;
    o.timeout = timeout;
    return gloo_allreduce(o, data, spec.elements, op, dtype);
  }
  if (spec.transport == "nccl")
    return bad(spec, "nccl reduces GPU memory and this buffer is in host memory (a CPU worker's)");
  return bad(spec, cat("unknown transport '", spec.transport, "' (shm, gloo or nccl)"));
}

absl::Status run_collective(const CollectiveSpec& spec, const DeviceBufferRef& buffer,
                            const std::function<bool()>& cancelled) {
  auto checked = check_spec(spec, buffer.bytes);
  if (!checked.ok()) return checked.status();
  const auto [op, dtype, timeout] = *checked;
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
