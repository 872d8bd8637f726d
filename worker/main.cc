// uop-worker: one process per device (docs/ARCHITECTURE.md, The service). Serves the Worker service over the CPU
// runtime or, with --device=cuda:N, over GPU N through the CUDA driver loaded at run time;
// announces its bound address as one `LISTENING host:port` line on stdout (the embedded
// scheduler waits for it), or, when its device cannot be used (no driver, no GPU), one
// `UNAVAILABLE <why>` line and exit status 3, so that the scheduler marks the device
// unavailable instead of restarting it. With --scheduler it registers itself with a
// remote scheduler's Registry, and again every --heartbeat-seconds, so that a scheduler
// that restarted learns it back; --name=auto lets the scheduler pick its cluster-wide name.
// It serves its scheduler only: every call must carry the secret (uopd's for an embedded
// worker, the cluster's for one started elsewhere) or come over mutual TLS.
// SIGTERM / SIGINT drain: stop accepting, let in-flight calls finish, exit 0. With
// --health-check=ADDR it is a client instead: grpc.health.v1 Check of ADDR, exit 0 / 1.
// A CPU worker runs its kernels in a sandbox (sandbox.h), entered once start-up is done.
// Logs go to stderr.
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compiler/abi/cpu_target.h"
#include "compiler/support/flags.h"
#include "compiler/support/strings.h"
#include "proto/worker.grpc.pb.h"
#include "transport/cluster_auth.h"
#include "transport/tls.h"
#include "worker/collectives/gloo_allreduce.h"
#include "worker/collectives/shm_ring.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/cpu/cpu_program.h"
#include "worker/cuda/cuda_device.h"
#include "worker/launch_watchdog.h"
#include "worker/sandbox.h"
#include "worker/worker_service.h"

namespace uop {
namespace {

// Every flag and its help (`uop-worker --help` is generated from these).
const flags::Tool& worker_flags() {
  static const flags::Tool* tool = [] {
    auto* t = new flags::Tool(
        "uop-worker", "uop-worker: serves one device to a uopd scheduler (proto/worker.proto).",
        "Prints `LISTENING HOST:PORT` on stdout once serving, or `UNAVAILABLE <why>` when the device cannot be used. "
        "Exit status: 0 after a clean shutdown, 1 on a startup failure or a drain that ran out of time, 2 for bad "
        "usage, 3 when the device is unavailable (no CUDA driver, no such GPU), 4 after a kernel fault lost the CUDA "
        "context (start it again), 5 when a launch did not stop past its deadline (start it again).");
    flags::Command& c = t->common();
    c.string("device", "cpu:N|cuda:N", "the device this worker serves", "cpu:0");
    c.string("listen", "HOST:PORT", "where to listen", "127.0.0.1:0").shown_default("127.0.0.1:0, an ephemeral port");
    c.integer("threads", "N", "cpu: kernel threads").range(0, 4096).shown_default("the machine's hardware threads");
    c.integer("max-buffer-bytes", "N", "budget for all buffers together; 0: none")
        .shown_default("cpu 3/4 of RAM, cuda 15/16 of the GPU's free memory");
    c.integer("max-program-bytes", "N",
              "budget for loaded kernels together (each counts its object plus 64 KiB); past it the least recently "
              "launched are unloaded, and the scheduler loads one again when it next needs it; 0: none",
              256 << 20)
        .range(0, INT64_MAX);
    c.string("scheduler", "HOST:PORT",
             "register with this scheduler's Registry (retries until it works), then again every heartbeat: a "
             "restarted scheduler learns this worker back within one period");
    c.string("advertise", "HOST[:PORT]", "the address to register")
        .shown_default("the listen address, or this host's name when listening on a wildcard address");
    c.integer("heartbeat-seconds", "N", "how often to register again (0: register once)", 5).range(0, 86400);
    c.string("name", "KIND:N|auto",
             "the cluster-wide name clients use for this worker. auto: the scheduler picks the lowest free name of "
             "the device's kind (CUDA:0, CUDA:1, ...), the same one again for the same --instance; e.g. one GPU per "
             "pod: --device=cuda:0 --name=auto")
        .shown_default("its --device");
    c.string("instance", "ID",
             "with --name=auto: this worker's stable identity, by which it gets its name back after it or the "
             "scheduler restarts (a pod's node name, say, when the address changes)")
        .shown_default("the advertised address");
    c.integer("drain-seconds", "N", "on SIGTERM, how long in-flight calls may take", 30).range(0, 86400);
    c.string("cluster-secret-file", "PATH",
             "the cluster's secret (16+ bytes, e.g. openssl rand -hex 32; the file readable by its owner only): every "
             "call to this worker must carry it (the grpc.health.v1 Check aside), and the worker presents it to the "
             "scheduler (Registry, Rendezvous). The scheduler has the same file (uopd --cluster-secret-file)");
    c.string("tls-cert", "PEM",
             "mutual TLS, with --tls-key and --tls-ca: serve with this certificate, accept only callers whose "
             "certificate chains to the CA, and register with the scheduler over TLS the same way (alone or with "
             "the secret)");
    c.string("tls-key", "PEM", "its key");
    c.string("tls-ca", "PEM", "the CA callers' (and the scheduler's) certificates chain to");
    c.flag("insecure",
           "accept calls from anyone who can reach --listen: no secret, no TLS (a worker serves only its scheduler: "
           "without one of these three it does not start)");
    c.integer("embedded", "PID",
              "started by uopd itself (PID: its process id): exit when the parent dies. Without PID, a parent of pid 1 "
              "means it died already, which is wrong where uopd itself is pid 1 (a container without an init): uopd "
              "always passes its pid")
        .range(1, INT32_MAX)
        .value_optional();
    c.integer("secret-fd", "N",
              "embedded: read the secrets from inherited descriptor N (uopd passes it): the one callers must present, "
              "a newline, the one to present to the scheduler")
        .range(3, 1 << 20);
    c.integer("lane-fd", "N",
              "embedded: also serve Execute and buffer reads and writes through the shared-memory execute lane behind "
              "inherited descriptor N (uopd passes it)")
        .range(3, 1 << 20);
    c.choice("seccomp", {"on", "off"},
             "run kernels in a sandbox: Landlock (writes only beneath /dev/shm) and a seccomp allowlist of what a "
             "kernel runner needs, entered before serving; a refused system call kills the worker by SIGSYS. "
             "Sandboxed, the worker resolves --scheduler's name once, at start-up")
        .shown_default("on for cpu on x86_64, off for cuda, whose driver opens device files on demand");
    c.integer("stop-grace-ms", "N",
              "a launch past its deadline (or whose caller went away) is told to stop; one still running N ms later "
              "ends the worker (exit status 5) for a restart",
              3000)
        .range(1, 3600000);
    c.string("health-check", "HOST:PORT",
             "do not serve: ask the worker (or uopd) at HOST:PORT for its grpc.health.v1 status (3 s deadline; with "
             "the --tls-* flags over mutual TLS), print it, exit 0 if SERVING, else 1 (a container healthcheck)");
    return t;
  }();
  return *tool;
}

constexpr int kExitDeviceUnavailable = 3;
constexpr int kExitContextLost = 4;

struct Flags {
  std::string device = "CPU:0";
  std::string listen = "127.0.0.1:0";
  int threads = 0;
  std::optional<uint64_t> max_buffer_bytes;
  uint64_t max_program_bytes = 0;
  std::string scheduler;
  std::string advertise;
  int heartbeat_seconds = 5;
  std::string name;      // "", "auto" or a canonical KIND:N
  std::string instance;
  std::string health_check;
  int drain_seconds = 30;
  bool embedded = false;
  pid_t parent_pid = 0;  // --embedded=PID; 0: not given
  int lane_fd = -1;      // --lane-fd=N
  int secret_fd = -1;    // --secret-fd=N
  std::string cluster_secret_file;
  bool insecure = false;
  tls::TlsFiles tls;
  std::string seccomp;   // "on", "off", "" (by device)
  int stop_grace_ms = 3000;
  std::string scheduler_target;  // what the Registrar dials: --scheduler, resolved if sandboxed
};

template <typename... Args>
void log(const Args&... args) {
  std::string line = cat("uop-worker[", static_cast<int64_t>(getpid()), "] ", args..., "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

int usage_error(const std::string& msg) { return worker_flags().usage_error(msg); }

// "cpu:0" / "CPU:0" -> "CPU:0", "cuda:1" -> "CUDA:1": device names are exact, so spell
// them one way.
std::optional<std::string> canonical_device(const std::string& d) {
  auto colon = d.find(':');
  if (colon == std::string::npos) return std::nullopt;
  std::string kind = d.substr(0, colon), digits = d.substr(colon + 1);
  if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  int n = std::stoi(digits);
  if (n > 4096) return std::nullopt;
  if (kind == "cpu" || kind == "CPU") return cat("CPU:", n);
  if (kind == "cuda" || kind == "CUDA") return cat("CUDA:", n);
  return std::nullopt;
}

// Returns an exit code to stop with, or nullopt to run.
std::optional<int> parse(int argc, char** argv, Flags* f) {
  auto parsed = worker_flags().parse(argc, argv);
  if (!parsed.ok()) return worker_flags().usage_error(parsed.status());
  const flags::Args& a = *parsed;
  if (a.help) {
    std::fputs(worker_flags().help().c_str(), stdout);
    return 0;
  }
  for (const char* k : {"instance", "health-check", "cluster-secret-file"})
    if (a.has(k) && a.get(k).empty()) return usage_error(cat("--", k, " needs a value"));
  auto d = canonical_device(a.get("device"));
  if (!d) return usage_error(cat("--device: '", a.get("device"), "' is not a device (cpu:N or cuda:N)"));
  f->device = *d;
  f->listen = a.get("listen");
  f->threads = static_cast<int>(a.integer("threads"));
  if (a.has("max-buffer-bytes")) f->max_buffer_bytes = static_cast<uint64_t>(a.integer("max-buffer-bytes"));
  f->max_program_bytes = static_cast<uint64_t>(a.integer("max-program-bytes"));
  f->scheduler = a.get("scheduler");
  f->advertise = a.get("advertise");
  f->heartbeat_seconds = static_cast<int>(a.integer("heartbeat-seconds"));
  if (a.has("name")) {
    std::string value = a.get("name");
    auto n = value == "auto" ? std::optional<std::string>(value) : canonical_device(value);
    if (!n) return usage_error(cat("--name: '", value, "' is not a device name (KIND:N) or auto"));
    f->name = *n;
  }
  f->instance = a.get("instance");
  f->health_check = a.get("health-check");
  f->drain_seconds = static_cast<int>(a.integer("drain-seconds"));
  f->embedded = a.has("embedded");
  f->parent_pid = static_cast<pid_t>(a.integer("embedded"));
  if (a.has("lane-fd")) f->lane_fd = static_cast<int>(a.integer("lane-fd"));
  if (a.has("secret-fd")) f->secret_fd = static_cast<int>(a.integer("secret-fd"));
  f->cluster_secret_file = a.get("cluster-secret-file");
  f->insecure = a.on("insecure");
  f->tls = {a.get("tls-cert"), a.get("tls-key"), a.get("tls-ca")};
  f->seccomp = a.get("seccomp");
  f->stop_grace_ms = static_cast<int>(a.integer("stop-grace-ms"));

  if ((!f->name.empty() || !f->instance.empty()) && f->scheduler.empty())
    return usage_error("--name and --instance name this worker to a scheduler: give --scheduler too");
  if (!f->instance.empty() && f->name != "auto") return usage_error("--instance goes with --name=auto");
  if (f->secret_fd >= 0 && !f->cluster_secret_file.empty())
    return usage_error("--secret-fd (from uopd) and --cluster-secret-file: give one");
  if (f->insecure && (f->secret_fd >= 0 || !f->cluster_secret_file.empty() || f->tls.any()))
    return usage_error("--insecure accepts callers without credentials: it goes with no secret and no --tls-*");
  if (f->seccomp == "on" && f->device.rfind("CUDA:", 0) == 0)
    return usage_error("--seccomp=on is for CPU workers: the CUDA driver opens device files on demand");
  if (!f->name.empty() && f->name != "auto" && f->name.substr(0, f->name.find(':')) != f->device.substr(0, f->device.find(':')))
    return usage_error(cat("--name=", f->name, ": a ", f->device, " worker's name is of its kind"));
  return std::nullopt;
}

// "127.0.0.1:0" + 5123 -> "127.0.0.1:5123"; "[::1]:0" -> "[::1]:5123".
std::string host_of(const std::string& addr) {
  auto colon = addr.rfind(':');
  return colon == std::string::npos ? addr : addr.substr(0, colon);
}

std::string advertised_address(const Flags& f, int port) {
  std::string host = host_of(f.listen);
  if (!f.advertise.empty()) {
    // HOST:PORT as given, or just HOST with the bound port.
    bool has_port = f.advertise.rfind(':') != std::string::npos && f.advertise.back() != ']' &&
                    std::count(f.advertise.begin(), f.advertise.end(), ':') == 1;
    return has_port ? f.advertise : cat(f.advertise, ":", port);
  }
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    // A wildcard is not an address anyone can dial.
    char name[256] = {};
    host = gethostname(name, sizeof name - 1) == 0 ? std::string(name) : "localhost";
  }
  return cat(host, ":", port);
}

// Registers with the scheduler until it works, then again every --heartbeat-seconds (a
// no-op for a scheduler that knows us; how a restarted one learns us back), until stop().
// Logs what changes (registered, lost, registered again, a new name), not each heartbeat.
// stop() also cancels a call in progress, so that draining never waits on a slow scheduler.
class Registrar {
 public:
  Registrar(const Flags& f, cluster_auth::Dialer dial, std::string address)
      : f_(f), dial_(std::move(dial)), address_(std::move(address)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Registrar() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mu_);  // loop() checks stop_ under mu_ before each call
      if (!stop_.HasBeenNotified()) stop_.Notify();
      if (current_) current_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop();
  std::unique_ptr<uopd::worker::v1::Registry::Stub> connect() const;
  const Flags& f_;
  const cluster_auth::Dialer dial_;
  const std::string address_;
  absl::Notification stop_;
  std::mutex mu_;
  grpc::ClientContext* current_ = nullptr;  // the Register call in progress
  std::thread thread_;
};

// A fresh channel after every failure: a scheduler that comes back may be at a new IP
// behind the same name (a channel re-resolves at most every 30 s) and an old channel may
// sit in a long reconnect backoff.
std::unique_ptr<uopd::worker::v1::Registry::Stub> Registrar::connect() const {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  if (f_.scheduler_target != f_.scheduler) {  // resolved for the sandbox: certificates still name the host
    args.SetSslTargetNameOverride(host_of(f_.scheduler));
    args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, f_.scheduler);
  }
  return uopd::worker::v1::Registry::NewStub(dial_.channel(f_.scheduler_target, args));
}

void Registrar::loop() {
  const Flags& f = f_;
  const std::string& address = address_;
  absl::Notification* stop = &stop_;
  const absl::Duration heartbeat = absl::Seconds(f.heartbeat_seconds);
  const absl::Duration max_backoff = f.heartbeat_seconds > 0 ? std::min(absl::Seconds(5), heartbeat) : absl::Seconds(5);
  std::unique_ptr<uopd::worker::v1::Registry::Stub> stub;
  absl::Duration backoff = absl::Milliseconds(100);
  bool registered = false;
  std::string name;        // what the scheduler last called us
  std::string last_error;  // the last failure logged
  while (!stop->HasBeenNotified()) {
    if (!stub) stub = connect();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    uopd::worker::v1::RegisterRequest req;
    req.set_address(address);
    req.set_device(f.device);
    req.set_name(f.name);
    if (f.name == "auto") {
      req.set_instance(f.instance);
      req.set_previous_name(name);
    }
    uopd::worker::v1::RegisterResponse resp;
    {
      std::lock_guard lock(mu_);
      if (stop->HasBeenNotified()) return;
      current_ = &ctx;
    }
    grpc::Status st = stub->Register(&ctx, req, &resp);
    {
      std::lock_guard lock(mu_);
      current_ = nullptr;
    }
    if (st.ok()) {
      // A scheduler that predates names registers us as our device and says nothing.
      std::string now_name = resp.name().empty() ? f.device : resp.name();
      std::string as = now_name == f.device ? std::string() : cat(" as ", now_name);
      if (!registered) {
        log(name.empty() ? "registered " : "registered again ", address, " (", f.device, ")", as,
            " with the scheduler at ", f.scheduler, " (", resp.worker_id(), ")");
      } else if (now_name != name) {
        log("the scheduler at ", f.scheduler, " now serves this worker as ", now_name, " (was ", name, ")");
      }
      registered = true;
      name = now_name;
      last_error.clear();
      backoff = absl::Milliseconds(100);
      if (f.heartbeat_seconds == 0) return;
      stop->WaitForNotificationWithTimeout(heartbeat);
      continue;
    }
    if (stop->HasBeenNotified()) return;
    stub.reset();
    // gRPC leaves some messages empty (UNIMPLEMENTED for a method the server lacks); the
    // client port serves no Registry, so say where workers register.
    std::string why = st.error_message().empty() ? cat("gRPC status ", static_cast<int>(st.error_code()))
                                                 : st.error_message();
    if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED)
      why += " (a uopd client port? workers register at its internal listener, --internal-listen, printed as "
             "INTERNAL host:port)";
    if (registered) {
      log("lost the scheduler at ", f.scheduler, ": ", why, "; registering again");
      registered = false;
    } else if (why != last_error) {
      log("cannot register with the scheduler at ", f.scheduler, ": ", why, "; retrying (every ",
          absl::FormatDuration(max_backoff), " at most)");
    }
    last_error = why;
    stop->WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, max_backoff);
  }
}

// --health-check=ADDR: grpc.health.v1.Health/Check for the whole server (service ""),
// spoken with a generic stub: the request is empty, the response is field 1, a varint.
int health_check(const Flags& f) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (f.tls.any()) {
    auto tls_creds = tls::channel_credentials(f.tls);
    if (!tls_creds.ok()) {
      std::fprintf(stderr, "uop-worker: %s\n", std::string(tls_creds.status().message()).c_str());
      return 1;
    }
    creds = *tls_creds;
  }
  grpc::GenericStub stub(grpc::CreateChannel(f.health_check, creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  absl::Notification done;
  grpc::Status st;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   st = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!st.ok()) {
    std::printf("%s: %s\n", f.health_check.c_str(), st.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok())
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  // HealthCheckResponse.status: 0 UNKNOWN (an empty message), 1 SERVING, 2 NOT_SERVING.
  int status = bytes.size() == 2 && bytes[0] == 0x08 ? static_cast<unsigned char>(bytes[1]) : 0;
  static constexpr const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  std::printf("%s: %s\n", f.health_check.c_str(), status < 4 ? kNames[status] : "UNKNOWN");
  return status == 1 ? 0 : 1;
}

// Who may call this worker, and how it calls the scheduler.
struct Credentials {
  cluster_auth::Gate gate;
  cluster_auth::Dialer dial;
};

// --secret-fd: what uopd wrote there (the secret callers present, a newline, the one to
// present to the scheduler), read to its end.
absl::StatusOr<std::pair<std::string, std::string>> read_secret_fd(int fd) {
  std::string all;
  char buf[1024];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::FailedPreconditionError(cat("--secret-fd=", fd, ": ", strerrordesc_np(errno)));
    if (n == 0) break;
    all.append(buf, static_cast<size_t>(n));
    if (all.size() > 2 * cluster_auth::kMaxSecretBytes) return absl::InvalidArgumentError(cat("--secret-fd=", fd, ": too long"));
  }
  close(fd);
  size_t nl = all.find('\n');
  if (nl == std::string::npos || nl < cluster_auth::kMinSecretBytes)
    return absl::InvalidArgumentError(cat("--secret-fd=", fd, ": no secret there"));
  return std::make_pair(all.substr(0, nl), all.substr(nl + 1));
}

// From --secret-fd or --cluster-secret-file, and --tls-*: an exit status when they cannot
// be used, or when there are none and no --insecure.
std::variant<Credentials, int> credentials(const Flags& f) {
  Credentials c;
  if (f.tls.any()) {
    if (f.tls.cert.empty() || f.tls.key.empty() || f.tls.ca.empty())
      return usage_error("mutual TLS needs --tls-cert, --tls-key and --tls-ca");
    auto server = tls::server_credentials(f.tls, /*require_client_cert=*/true);
    auto client = server.ok() ? tls::channel_credentials(f.tls) : server.status();
    if (!client.ok()) {
      log(client.status().message());
      return 1;
    }
    c.gate.tls = *server;
    c.dial.tls = *client;
  }
  if (f.secret_fd >= 0) {
    auto got = read_secret_fd(f.secret_fd);
    if (!got.ok()) {
      log(got.status().message());
      return 1;
    }
    c.gate.secret = std::move(got->first);
    c.dial.secret = std::move(got->second);
  } else if (!f.cluster_secret_file.empty()) {
    auto secret = cluster_auth::read_secret_file(f.cluster_secret_file);
    if (!secret.ok()) {
      log(secret.status().message());
      return 1;
    }
    c.gate.secret = c.dial.secret = *secret;
  }
  if (!c.gate.authenticates() && !f.insecure)
    return usage_error("a worker serves its scheduler only: give --cluster-secret-file (the scheduler's), or "
                       "--tls-cert/--tls-key/--tls-ca, or --insecure to accept anyone who can reach --listen");
  // Liveness probes (Kubernetes' gRPC probes, --health-check) carry no credentials, and
  // the answer says only SERVING or NOT_SERVING.
  c.gate.open_methods = {"/grpc.health.v1.Health/Check"};
  return c;
}

// Set when a kernel fault lost the CUDA context: the worker drains and exits for a restart.
std::atomic<bool> context_lost{false};

// The device is unusable: say so on stderr for people and on stdout for the scheduler,
// which reads this line where it waits for LISTENING and then stops restarting us.
int device_unavailable(const std::string& device, std::string_view why) {
  std::string msg = cat(device, " is unavailable: ", why);
  std::fprintf(stderr, "uop-worker: %s\n", msg.c_str());
  std::printf("UNAVAILABLE %s\n", msg.c_str());
  std::fflush(stdout);
  return kExitDeviceUnavailable;
}

// The CUDA backend for "CUDA:<n>", or an exit status (the device is unavailable).
std::variant<std::unique_ptr<CudaDevice>, int> open_cuda(const std::string& device) {
  auto driver = CudaDriver::load();
  if (!driver.ok()) return device_unavailable(device, std::string(driver.status().message()));
  CudaDeviceOptions o;
  o.ordinal = std::stoi(device.substr(device.find(':') + 1));
  o.on_context_lost = [](const absl::Status& why) {
    log("the CUDA context is lost: ", why.message(), "; draining and exiting so that the worker starts again");
    context_lost.store(true);
    kill(getpid(), SIGTERM);  // taken by the main thread's sigwait, like any stop request
  };
  auto dev = CudaDevice::open(*driver, std::move(o));
  if (!dev.ok()) return device_unavailable(device, std::string(dev.status().message()));
  log(device, " is ", (*dev)->name(), " (", (*dev)->arch(), "), CUDA driver ", (*driver)->version());
  return *std::move(dev);
}

uint64_t default_buffer_budget() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4 * 3;
}

int run(int argc, char** argv) {
  Flags f;
  if (auto rc = parse(argc, argv, &f)) return *rc;
  if (!f.health_check.empty()) return health_check(f);

  if (f.embedded) {
    // The scheduler owns us: when it dies, so do we (drained like any SIGTERM). If it
    // died before this line ran, we were reparented already and nobody will ask for us.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (f.parent_pid ? getppid() != f.parent_pid : getppid() == 1) return 0;
  }
  auto creds = credentials(f);
  if (auto* rc = std::get_if<int>(&creds)) return *rc;
  Credentials& auth = std::get<Credentials>(creds);
  // SIGTERM / SIGINT are taken by sigwait on the main thread: blocked before any thread
  // starts, so every thread inherits the mask, with the default disposition restored (a
  // shell's background job may come with SIG_IGN, and sigwait never sees an ignored
  // signal). A reader that goes away (SIGPIPE) must not kill us.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // The sandbox's first layer goes on before any thread exists (Landlock binds only the
  // thread that asks, and what it starts after).
  const bool sandboxed =
      f.seccomp == "on" || (f.seccomp.empty() && f.device.rfind("CPU:", 0) == 0 && sandbox_available());
  if (std::string why; sandboxed && !confine_files(shm_directory(), &why))
    log("files are not confined (", why, "): only the seccomp filter keeps the worker from them, and it cannot "
        "stop a path relative to /dev/shm from leading out of it (../)");

  WorkerRuntimeOptions opts;
  opts.device = f.device;
  opts.threads = f.threads;
  opts.rendezvous_dial = std::make_shared<const cluster_auth::Dialer>(auth.dial);
  opts.watchdog.grace = absl::Milliseconds(f.stop_grace_ms);
  opts.max_program_bytes = f.max_program_bytes;
  std::unique_ptr<DeviceBackend> backend;
  if (f.device.rfind("CUDA:", 0) == 0) {
    // After the signal mask: the driver starts threads of its own.
    auto cuda = open_cuda(f.device);
    if (auto* rc = std::get_if<int>(&cuda)) return *rc;
    auto& dev = std::get<std::unique_ptr<CudaDevice>>(cuda);
    uint64_t budget = 0;
    if (auto mem = dev->memory_info(); mem.ok()) budget = mem->first / 16 * 15;
    opts.max_buffer_bytes = f.max_buffer_bytes ? *f.max_buffer_bytes : budget;
    backend = std::move(dev);
  } else {
    opts.target = CpuTarget::host().id();
    opts.max_buffer_bytes = f.max_buffer_bytes ? *f.max_buffer_bytes : default_buffer_budget();
  }
  if (!backend) backend = std::make_unique<CpuBackend>(opts.target, opts.threads);
  WorkerRuntime runtime(opts, std::move(backend));
  WorkerService service(&runtime);
  // The execute lane, when uopd gave one: a lane that cannot be used is only slower
  // (uopd sees it unserved and makes every call over gRPC).
  std::shared_ptr<ExecLane> lane;
  if (f.lane_fd >= 0) {
    auto attached = ExecLane::attach(f.lane_fd);
    absl::Status s = attached.ok() ? (*attached)->serve(lane_handler(&runtime)) : attached.status();
    if (s.ok()) lane = std::move(*attached);
    else log("not serving the execute lane: ", s.message());
  }
  auto in_flight = [&] { return service.in_flight() + (lane ? lane->in_flight() : 0); };

  int port = 0;
  // grpc.health.v1.Health (Kubernetes' grpc probes, grpc_health_probe): SERVING while it
  // serves, NOT_SERVING once it drains. Must be enabled before the builder is made.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(f.listen, auth.gate.credentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(256 << 20);  // program objects and write chunks
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    log("cannot listen on ", f.listen);
    return 1;
  }
  std::string listening = cat(host_of(f.listen), ":", port);
  f.scheduler_target = f.scheduler;
  if (sandboxed) {
    // Before anything is served or announced: what would otherwise happen lazily under
    // the filter (the JIT, the time zone, Gloo's look at /sys, resolving the scheduler)
    // happens now.
    absl::Status s = CpuProgram::start_jit();
    tzset();
    gloo_read_system_once();
    if (s.ok() && !f.scheduler.empty()) {
      auto target = dial_target(f.scheduler);
      if (target.ok()) f.scheduler_target = *target;
      else s = target.status();
    }
    if (s.ok()) s = enter_sandbox(shm_directory());
    if (!s.ok()) {
      log("cannot enter the sandbox: ", s.message(), " (--seccomp=off runs without it)");
      return 1;
    }
  }
  std::printf("LISTENING %s\n", listening.c_str());
  std::fflush(stdout);
  WorkerInfo info = runtime.info();
  log("serving ", f.device, " (", info.backend, " ", info.target, ") on ", listening,
      info.threads ? cat(" with ", info.threads, " threads") : std::string(), ", buffer budget ",
      opts.max_buffer_bytes ? cat(opts.max_buffer_bytes, " bytes") : std::string("unlimited"), ", program budget ",
      opts.max_program_bytes ? cat(opts.max_program_bytes, " bytes") : std::string("unlimited"),
      sandboxed ? ", sandboxed" : "");

  std::unique_ptr<Registrar> registrar;
  if (!f.scheduler.empty()) registrar = std::make_unique<Registrar>(f, auth.dial, advertised_address(f, port));

  int sig = 0;
  sigwait(&stop_signals, &sig);
  log("got signal ", sig, ": draining (up to ", f.drain_seconds, " s)");
  if (registrar) registrar->stop();
  if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) health->SetServingStatus(false);
  // A kernel cannot be interrupted: past the drain time (plus a little) give up. A second
  // SIGINT (an impatient ^C) means now; more SIGTERMs (the scheduler's own after the
  // parent-death signal, say) only repeat the request.
  sigset_t interrupt;
  sigemptyset(&interrupt);
  sigaddset(&interrupt, SIGINT);
  std::thread([interrupt, drain = f.drain_seconds] {
    timespec wait{drain + 5, 0};
    siginfo_t info;
    int again = sigtimedwait(&interrupt, &info, &wait);
    log(again > 0 ? "second interrupt: exiting now" : "drain timed out: exiting with calls still running");
    std::_Exit(1);
  }).detach();
  // Shutdown refuses new calls at once but returns only when every client has closed its
  // connection too, and an idle gRPC client notices the GOAWAY only when its backup
  // poller runs (every 5 s). Drained means no handler running: then the last responses
  // get a moment to leave, and we go whether or not Shutdown has returned.
  absl::Notification shut;
  std::thread closer([&] {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(f.drain_seconds));
    shut.Notify();
  });
  for (;;) {
    if (shut.WaitForNotificationWithTimeout(absl::Milliseconds(20))) break;
    if (in_flight() > 0) continue;
    // A call accepted just before Shutdown may not have reached its handler yet.
    if (shut.WaitForNotificationWithTimeout(absl::Milliseconds(300)) || in_flight() == 0) break;
  }
  log("drained, exiting");
  // Leave now, without destructors: nothing is left to flush or hand back (buffers and
  // programs are this process's memory), the closer may still be waiting on idle clients,
  // and gRPC's own teardown (grpc_shutdown joining its executor threads, one of which may
  // sit in a poll for seconds) would keep the scheduler waiting for our exit.
  std::fflush(stdout);
  std::_Exit(context_lost.load() ? kExitContextLost : 0);
}

}  // namespace
}  // namespace uop

int main(int argc, char** argv) { return uop::run(argc, argv); }
