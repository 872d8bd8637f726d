// GlooGroup: a gloo::rendezvous::Context connected through GrpcStore, one tcp device per
// listening address for the whole process (a device is an epoll loop thread; contexts
// share it), and Gloo's new-style ring allreduce. Every call into Gloo sits inside a
// try block in this file; nothing Gloo throws gets past it.
#include "worker/collectives/gloo_allreduce.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/common/linux.h>
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <grpcpp/grpcpp.h>

#include "compiler/support/strings.h"
#include "worker/sandbox.h"
#include "proto/worker.grpc.pb.h"
#include "worker/collectives/reduce.h"
#include "worker/collectives/shm_ring.h"
#include "worker/collectives/rendezvous_client.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;
using Millis = std::chrono::milliseconds;

constexpr Millis kPostMortem{3000};     // how long survivors wait for each other's reports
constexpr Millis kMinConnectStep{1000};

// Thrown by GrpcStore inside Gloo's rendezvous, caught in this file: it carries the code
// and the keys still missing, so the boundary can tell a member that never came from a
// scheduler that cannot be reached.
struct RendezvousError : std::runtime_error {
  RendezvousError(absl::StatusCode c, const std::string& m, std::vector<std::string> keys)
      : std::runtime_error(m), code(c), missing(std::move(keys)) {}
  absl::StatusCode code;
  std::vector<std::string> missing;
};

// gloo's Store over the Rendezvous service, keys under "<group>/". Gloo's get() waits
// for the key (as its own stores do); every wait is bounded by the group's timeout.
class GrpcStore final : public gloo::rendezvous::Store {
 public:
  GrpcStore(RendezvousClient* client, std::string prefix, Millis timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status st = client_->set(prefix_ + key, std::string(data.begin(), data.end()), timeout_);
    if (!st.ok()) throw RendezvousError(st.code(), std::string(st.message()), {});
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = std::move(fetch({key})[0]);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { fetch(keys); }
  // Gloo passes its context's timeout, which connect() shortens for the TCP handshake;
  // the rendezvous keeps the group's own.
  void wait(const std::vector<std::string>& keys, const Millis&) override { fetch(keys); }

 private:
  std::vector<std::string> fetch(const std::vector<std::string>& keys) {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    auto v = client_->get(full, timeout_);
    if (!v.ok()) throw RendezvousError(v.status().code(), std::string(v.status().message()), keys);
    return *std::move(v);
  }

  RendezvousClient* client_;
  const std::string prefix_;
  const Millis timeout_;
};

// Gloo's rendezvous keys are "rank_<i>" (hostnames) and "<i>" (addresses): both mean rank i.
int rank_of_key(const std::string& key) {
  std::string digits = key.rfind("rank_", 0) == 0 ? key.substr(5) : key;
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

absl::StatusOr<std::shared_ptr<gloo::transport::Device>> shared_device(const std::string& hostname) {
  static std::mutex mu;
  static auto* devices = new std::map<std::string, std::shared_ptr<gloo::transport::Device>>();  // never destroyed: loop threads outlive exit
  std::lock_guard lock(mu);
  auto it = devices->find(hostname);
  if (it != devices->end()) return it->second;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    devices->emplace(hostname, device);
    return device;
  } catch (const std::exception& e) {
    return absl::UnavailableError(cat("gloo: cannot listen on ", hostname, ": ", e.what()));
  }
}

// A buffer of up to this many bytes goes with the members' agreement check, which is of a
// fixed size whatever the buffer (header, then the buffer or zeros): a small allreduce is
// one Gloo exchange instead of three (the check, then the ring's reduce-scatter and
// all-gather), each a few thread wake-ups on every member.
constexpr uint64_t kInlineBytes = 16 << 10;
constexpr size_t kMessageBytes = 3 * sizeof(uint64_t) + kInlineBytes;

// Gloo's messages say "Timed out" / "timeout" when a wait ran out; anything else is a
// broken connection.
absl::StatusCode code_of(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos
             ? absl::StatusCode::kDeadlineExceeded
             : absl::StatusCode::kUnavailable;
}

}  // namespace

struct GlooGroup::Impl {
  GlooOptions opts;
  std::unique_ptr<RendezvousClient> client;
  std::unique_ptr<GrpcStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::vector<std::string> members;  // "pid P on H" by rank, for messages
  uint32_t tag = 0;
  absl::Status failure;

  std::string where() const {
    return cat("gloo allreduce in group '", opts.group, "' (rank ", opts.rank, " of ", opts.size, "): ");
  }
  std::string member(int q) const {
    return q >= 0 && q < static_cast<int>(members.size()) && !members[q].empty() ? cat("rank ", q, " (", members[q], ")")
                                                                                : cat("rank ", q);
  }
  absl::Status connect();
  absl::Status lost(const std::string& what);
};

absl::Status GlooGroup::Impl::connect() {
  const int n = opts.size, r = opts.rank;
  std::string host = opts.hostname;
  if (host.empty()) {
    auto h = local_address_toward(opts.rendezvous);
    if (!h.ok()) return absl::UnavailableError(cat(where(), h.status().message()));
    host = *h;
  }
  auto dev = shared_device(host);
  if (!dev.ok()) return absl::UnavailableError(cat(where(), dev.status().message()));
  device = *dev;
  client = std::make_unique<RendezvousClient>(opts.rendezvous,
                                              opts.rendezvous_dial ? *opts.rendezvous_dial : cluster_auth::Dialer{});
  store = std::make_unique<GrpcStore>(client.get(), cat(opts.group, "/"), opts.timeout);
  try {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    store->set(cat("member/", r), [&] {
      std::string s = cat("pid ", static_cast<int64_t>(getpid()), " on ", name, " at ", host);
      return std::vector<char>(s.begin(), s.end());
    }());
    context = std::make_shared<gloo::rendezvous::Context>(r, n);
    // A tcp pair waits 5 x the context timeout for its first connection: scale it so
    // that the whole connect stays within the group's timeout.
    context->setTimeout(std::max(kMinConnectStep, opts.timeout / 5));
    context->connectFullMesh(*store, device);
    context->setTimeout(opts.timeout);
    members.assign(n, "");
    for (int q = 0; q < n; ++q) {
      std::vector<char> v = store->get(cat("member/", q));
      members[q].assign(v.begin(), v.end());
    }
  } catch (const RendezvousError& e) {
    context.reset();
    if (e.code == absl::StatusCode::kDeadlineExceeded) {
      std::vector<int> missing;
      for (const std::string& k : e.missing)
        if (int q = rank_of_key(k.rfind("member/", 0) == 0 ? k.substr(7) : k); q >= 0) missing.push_back(q);
      if (!missing.empty())
        return absl::DeadlineExceededError(cat(where(), missing.size() == 1 ? "rank " : "ranks ", join(missing, ", "),
                                               " never joined (nothing at the rendezvous within ", opts.timeout.count(),
                                               " ms)"));
    }
    return absl::Status(e.code == absl::StatusCode::kDeadlineExceeded ? e.code : absl::StatusCode::kUnavailable,
                        cat(where(), "rendezvous at ", opts.rendezvous, ": ", e.what()));
  } catch (const std::exception& e) {
    context.reset();
    return absl::Status(code_of(e.what()), cat(where(), "cannot connect the group: ", e.what()));
  }
  return absl::OkStatus();
}

// The ring broke. Close our connections first, so that the members blocked on us notice
// now instead of at their timeout; then every survivor reports "failed/<rank>" and
// waits a little for the others' reports: whoever stays silent is the one that is gone.
absl::Status GlooGroup::Impl::lost(const std::string& what) {
  context.reset();
  const auto deadline = std::chrono::steady_clock::now() + std::min(opts.timeout, kPostMortem);
  (void)client->set(cat(opts.group, "/failed/", opts.rank), what, kPostMortem);
  std::vector<int> silent;
  for (int q = 0; q < opts.size; ++q) {
    if (q == opts.rank) continue;
    auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    if (!client->get({cat(opts.group, "/failed/", q)}, std::max(Millis(0), left)).ok()) silent.push_back(q);
  }
  std::string who;
  for (int q : silent) who += cat(who.empty() ? "" : ", ", member(q));
  failure = absl::Status(code_of(what), cat(where(), silent.empty() ? std::string("the ring broke")
                                                                    : cat(who, " stopped answering"),
                                            ": ", what));
  return failure;
}

GlooGroup::GlooGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GlooGroup::~GlooGroup() = default;

absl::StatusOr<std::unique_ptr<GlooGroup>> GlooGroup::connect(const GlooOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  if (options.group.empty() || options.size < 1 || options.rank < 0 || options.rank >= options.size ||
      options.rendezvous.empty())
    return absl::InvalidArgumentError(cat(impl->where(), "needs a group, a rendezvous address and 0 <= rank < size"));
  if (options.size > 1)
    if (absl::Status st = impl->connect(); !st.ok()) return st;
  return std::unique_ptr<GlooGroup>(new GlooGroup(std::move(impl)));
}

absl::Status GlooGroup::allreduce(void* data, uint64_t elements, ReduceOp op, Scalar dtype) {
  Impl& g = *impl_;
  if (!g.failure.ok()) return g.failure;
  auto combine = combine_function(op, dtype);
  const uint64_t esize = static_cast<uint64_t>(std::max(1, scalar_bytes(dtype)));
  if (g.opts.size == 1) return combine.ok() ? absl::OkStatus() : combine.status();
  // What everyone is about to do, exchanged in band (one Gloo allgather of a fixed size,
  // whatever the call): members that disagree all fail with the same INVALID_ARGUMENT
  // instead of corrupting each other. A buffer of up to kInlineBytes rides along.
  const bool inline_data = elements <= kInlineBytes / esize;
  const size_t n = static_cast<size_t>(g.opts.size);
  std::vector<uint8_t> mine(kMessageBytes, 0), all(kMessageBytes * n);
  const uint64_t header[3] = {elements, static_cast<uint64_t>(op), static_cast<uint64_t>(dtype)};
  std::memcpy(mine.data(), header, sizeof header);
  if (inline_data && elements) std::memcpy(mine.data() + sizeof header, data, elements * esize);
  try {
    gloo::AllgatherOptions ag(g.context);
    ag.setInput(mine.data(), mine.size());
    ag.setOutput(all.data(), all.size());
    ag.setTag(g.tag++);
    ag.setTimeout(g.opts.timeout);
    gloo::allgather(ag);
  } catch (const std::exception& e) {
    return g.lost(e.what());
  }
  auto header_of = [&](size_t q) {
    std::array<uint64_t, 3> h;
    std::memcpy(h.data(), all.data() + q * kMessageBytes, sizeof header);
    return h;
  };
  // Every member names the same pair (rank 0 and the first rank unlike it), whichever
  // of them it is itself.
  for (size_t q = 1; q < n; ++q) {
    if (header_of(q) == header_of(0)) continue;
    auto describe = [&](const std::array<uint64_t, 3>& d) {
      return cat(d[0], " ", scalar_name(static_cast<Scalar>(d[2] & 0xff)), " elements (",
                 reduce_op_wire_name(static_cast<ReduceOp>(d[1] & 3)), ")");
    };
    return absl::InvalidArgumentError(cat(g.where(), "the members disagree: rank 0 reduces ", describe(header_of(0)),
                                          ", rank ", q, " reduces ", describe(header_of(q))));
  }
  if (!combine.ok()) return absl::InvalidArgumentError(cat(g.where(), combine.status().message()));
  if (elements == 0) return absl::OkStatus();
  if (elements > UINT64_MAX / esize) return absl::InvalidArgumentError(cat(g.where(), elements, " elements overflow"));
  if (inline_data) {
    // Every member has every input: each reduces them itself in the shm ring's order
    // (shm_ring.h: part j as x[j], then x[j+1] op acc, ...), so all hold the same bits,
    // the shm ring's.
    auto input = [&](size_t q, uint64_t offset) { return all.data() + q * kMessageBytes + sizeof header + offset * esize; };
    for (int j = 0; j < g.opts.size; ++j) {
      const RingPart part = ring_part(elements, g.opts.size, j);
      if (part.count == 0) continue;
      uint8_t* acc = static_cast<uint8_t*>(data) + part.offset * esize;
      std::memcpy(acc, input(static_cast<size_t>(j), part.offset), part.count * esize);
      for (size_t s = 1; s < n; ++s) (*combine)(acc, input((j + s) % n, part.offset), acc, part.count);
    }
    return absl::OkStatus();
  }

  try {
    gloo::AllreduceOptions o(g.context);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    switch (esize) {  // only the element size matters to Gloo: the arithmetic is reduce.h's
      case 1: o.setOutput(static_cast<uint8_t*>(data), elements); break;
      case 2: o.setOutput(static_cast<uint16_t*>(data), elements); break;
      case 4: o.setOutput(static_cast<uint32_t*>(data), elements); break;
      default: o.setOutput(static_cast<uint64_t*>(data), elements); break;
    }
    CombineFn fn = *combine;
    o.setReduceFunction([fn](void* out, const void* a, const void* b, size_t n) { fn(out, a, b, n); });
    o.setTag(g.tag++);
    o.setTimeout(g.opts.timeout);
    gloo::allreduce(o);
  } catch (const std::exception& e) {
    return g.lost(e.what());
  }
  return absl::OkStatus();
}

absl::Status gloo_allreduce(const GlooOptions& options, void* data, uint64_t elements, ReduceOp op, Scalar dtype) {
  auto group = GlooGroup::connect(options);
  if (!group.ok()) return group.status();
  return (*group)->allreduce(data, elements, op, dtype);
}

void gloo_read_system_once() {
  try {
    (void)gloo::interfaceToBusID("lo");
  } catch (const std::exception&) {
    // No PCI devices to list (a container without /sys/bus/pci): Gloo does without.
  }
}

absl::StatusOr<std::string> local_address_toward(const std::string& host_port) {
  // A bare host or v6 address: any port does.
  auto [host, port] = split_host_port(host_port);
  if (port.empty()) port = "0";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return absl::UnavailableError(cat("cannot resolve ", host_port, ": ", gai_strerror(rc)));
  std::string err = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    bool ok = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
              getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    if (!ok) err = std::strerror(errno);
    close(fd);
    if (!ok) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* addr = local.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                                                  : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    inet_ntop(local.ss_family, addr, text, sizeof text);
    freeaddrinfo(res);
    return std::string(text);
  }
  freeaddrinfo(res);
  return absl::UnavailableError(cat("no route to ", host_port, ": ", err));
}

}  // namespace uop
