// uopd: the scheduler. With no flags it is the embedded default (docs/ARCHITECTURE.md, The service): it listens on
// loopback, starts two CPU workers, keeps its disk cache under the user's cache directory
// and serves Prometheus metrics on loopback. Flags turn on the cluster pieces (a Redis
// tier, remote workers registering by address) and set the limits.
//
// On startup it prints `INTERNAL <host>:<port>` (the listener of its internal services:
// workers register and rendezvous there) and then `LISTENING <host>:<port>` once it
// serves clients (clients and tests started with --listen=127.0.0.1:0 read the ports
// from them). SIGTERM or SIGINT
// drain in-flight requests, then stop the workers; nothing is left running. SIGHUP reloads
// the --tokens-file (server/auth.h: Tenants::adopt), keeping the old tenants when the new
// file does not parse; it is logged either way, and counted in
// uopd_config_reloads_total{result="ok|error"}.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "compiler/backend.h"
#include "compiler/ir/codec.h"
#include "compiler/support/flags.h"
#include "compiler/support/strings.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/auth.h"
#include "server/cache/cluster_key.h"
#include "server/cache/disk_tier.h"
#include "server/cache/memory_tier.h"
#include "server/cache/redis_tier.h"
#include "server/inflight.h"
#include "server/registry_service.h"
#include "server/rendezvous_service.h"
#include "server/service.h"
#include "server/tuner.h"
#include "transport/cluster_auth.h"
#include "transport/tls.h"

namespace uop::server {
namespace {

// Every flag, its default and its help (`uopd --help` is generated from these).
flags::Tool uopd_flags() {
  flags::Tool t("uopd", "uopd: the UOp graph compilation and execution service.",
                "Exit status: 0 after a drain, 1 when it cannot start, 2 for bad usage.");
  flags::Command& c = t.common();
  c.describe("With no flags: listen on 127.0.0.1:7070, start 2 CPU workers, cache compiled kernels under "
             "$XDG_CACHE_HOME/uopd (or ~/.cache/uopd), serve metrics on 127.0.0.1:9464.");
  c.string("listen", "HOST:PORT", "client API address (port 0: any free port)", "127.0.0.1:7070");
  c.string("internal-listen", "HOST:PORT",
           "the internal services (worker Registry, collective Rendezvous), apart from the client API; remote "
           "workers register here (uop-worker --scheduler=HOST:PORT)",
           "127.0.0.1:0");
  c.string("cluster-secret-file", "PATH",
           "the cluster's secret (16+ bytes, e.g. openssl rand -hex 32; the file readable by its owner only): the "
           "internal services require it of every call, remote workers check it on every call from this scheduler "
           "(uop-worker --cluster-secret-file). Without it and without --worker-tls-*, a secret is made at start "
           "that only the embedded workers know");
  c.flag("insecure-internal",
         "no credential on the internal services or toward remote workers: anyone who reaches --internal-listen can "
         "register a worker (and receive tenants' data and kernels) or fill the rendezvous, and anyone who reaches "
         "a worker can use it. Only where nothing untrusted reaches these ports. Remote workers (--workers=0, or a "
         "--internal-listen off loopback) need this, a --cluster-secret-file or --worker-tls-*");
  c.integer("workers", "N",
            "embedded CPU workers, CPU:0..CPU:N-1; 0 waits for remote workers to register (uop-worker --scheduler=...)", 2);
  c.integer("cuda-workers", "N",
            "embedded CUDA workers, CUDA:0..CUDA:N-1; a GPU that cannot be used (no driver, no GPU) is reported unavailable", 0);
  c.string("cuda-arch", "sm_NN", "CUDA arch for a Compile / Explain naming none, and for a CUDA worker that does not report its GPU's",
           "sm_90");
  c.string("worker-binary", "PATH", "the uop-worker to start").shown_default("next to uopd, then PATH");
  c.integer("worker-threads", "N", "threads per worker (0: all cores)", 0);
  c.integer("worker-max-buffer-bytes", "N", "buffer memory per worker").shown_default("the worker's");
  c.integer("worker-max-program-bytes", "N",
            "loaded kernels per worker (uop-worker --max-program-bytes): past it a worker unloads the least recently "
            "launched, which uopd loads again when a Run needs one; 0: none")
      .range(0, INT64_MAX)
      .shown_default("the worker's, 256 MiB");
  c.choice("exec-lane", {"shm", "grpc"},
           "how a Run's Execute and buffer traffic reach embedded workers: a shared-memory lane (16 slots of 1 MiB; "
           "gRPC still for what does not fit) or gRPC only",
           "shm");
  c.string("cache-dir", "DIR", "on-disk compile cache; empty: none").shown_default("$XDG_CACHE_HOME/uopd");
  c.integer("disk-cache-bytes", "N", "its size budget (LRU eviction)", int64_t{4} << 30).shown_default("4 GiB");
  c.integer("memory-cache-bytes", "N", "in-memory compile cache budget (and a quarter of it for the kernels the planner keeps parsed)", int64_t{512} << 20).shown_default("512 MiB");
  c.string("cache-key-file", "PATH",
           "the key that authenticates disk and Redis cache entries (HMAC-SHA256): a file of 32+ random bytes that "
           "only uopd's user may read (mode 0600). Whoever holds it can mint kernels the workers will run. Without "
           "it: a key made on first start in the cache directory (cluster.key)");
  c.string("redis", "HOST:PORT", "a Redis shared by the cluster, as the third cache tier; needs --cache-key-file, the same file on every scheduler");
  c.integer("redis-timeout-ms", "N", "connecting, and each Redis command; a slow Redis is a miss", 200);
  c.string("redis-user", "NAME", "AUTH as this Redis ACL user (with --redis-password-file)");
  c.string("redis-password-file", "PATH",
           "AUTH with this password (the default user's requirepass, or the ACL user's); mode 0600, one trailing "
           "newline ignored");
  c.flag("redis-tls", "speak TLS to Redis, checking its certificate and name");
  c.string("redis-tls-ca", "PEM", "CAs for Redis's certificate").shown_default("the system's trust store");
  c.string("redis-tls-cert", "PEM", "a client certificate, for a Redis that wants one (with --redis-tls-key)");
  c.string("redis-tls-key", "PEM", "its key");
  c.string("redis-tls-server-name", "N", "the name Redis's certificate carries").shown_default("the --redis host");
  c.string("metrics-listen", "HOST:PORT", "Prometheus /metrics; empty: none. An operator port: it takes no credential",
           "127.0.0.1:9464");
  c.flag("metrics-tenant-labels", "also export per-tenant series (tenant names as labels)");
  c.integer("compile-threads", "N",
            "compiles in parallel (apart from RPC threads), shared round robin between tenants, then client connections", 2);
  c.integer("max-kernel-ops", "N", "ops in one kernel (a vector op counted per 16 lanes); a bigger one is refused before LLVM / NVRTC",
            16384);
  c.integer("max-plan-nodes", "N", "nodes planning one graph, or lowering one kernel, may make; past it the request is refused",
            2000000);
  c.integer("max-nodes", "N", "nodes per graph, counted before a request is parsed", 1000000);
  c.integer("max-request-bytes", "N", "one request's size", int64_t{256} << 20).shown_default("256 MiB");
  c.integer("max-request-memory", "N",
            "scheduler memory one request may hold at once: its body as received and parsed, its graph decoded, its "
            "inline outputs",
            int64_t{1} << 30)
      .shown_default("1 GiB");
  c.integer("max-inflight-bytes", "N", "the same, all requests together; over it a request is refused RESOURCE_EXHAUSTED")
      .shown_default("min(4 GiB, memory / 4)");
  c.integer("max-inline-output-bytes", "N",
            "outputs of one Run returned inline; larger ones stay in the session as buffers, downloaded (streamed) and "
            "freed by the client library",
            int64_t{64} << 20)
      .shown_default("64 MiB");
  c.integer("session-bytes", "N", "buffer bytes per session").shown_default("min(4 GiB, a worker's / 4)");
  c.integer("session-buffers", "N", "buffers per session", 4096);
  c.integer("max-sessions", "N", "open sessions, all clients together", 1024);
  c.integer("session-idle-timeout-s", "N", "close sessions idle this long", 600);
  c.integer("max-session-idle-timeout-s", "N", "the longest idle timeout a client may ask for", 86400);
  c.integer("request-deadline-s", "N", "longest time one request may take", 300);
  c.integer("stream-idle-timeout-s", "N",
            "end an Upload whose client sends nothing, or a Download whose client reads nothing, this long", 30);
  c.integer("collective-timeout-ms", "N",
            "how long a collective member waits for its peers: a worker that died or stalled fails the step within it", 30000);
  c.integer("bucket-cap-mb", "N",
            "a step's allreduces of the same op, dtype and devices become one collective over a flat bucket of up to "
            "N MiB per device (like DDP's bucket_cap_mb), decided when the graph is planned; 0: one collective per "
            "allreduce",
            25)
      .range(0, 1 << 20);
  c.flag("sequential-steps",
         "run a plan's steps one after another: a collective never overlaps the kernels after it that do not need "
         "its result (the same bits, slower)");
  c.choice("collective-transport", {"shm", "gloo", "auto"},
           "shm (workers on one host), gloo (TCP, through this scheduler's Rendezvous service) or auto: by the "
           "workers' addresses",
           "auto");
  c.string("search", "off|heuristic|beam[:WIDTH]",
           "loop schedules: off (the heuristic's kernels only), heuristic (and tuning records where they exist: "
           "uop tune, another uopd sharing the cache), beam (and every CPU kernel without a record is searched in "
           "the background after its first run, keeping the WIDTH best schedules per round, default 4; once per "
           "cluster with --redis)",
           "heuristic");
  c.integer("search-budget-s", "N", "the longest one kernel's search may take (uop tune may ask for another)", 30)
      .range(1, 3600);
  c.integer("search-lease-s", "N",
            "with --redis: a search's cluster lease lives this long, renewed every third of it while the search "
            "runs; a server that dies mid-search keeps others from its kernel this long, then one takes it over",
            10)
      .range(1, 3600);
  c.flag("allow-custom", "accept CUSTOM / CUSTOMI / CUSTOM_FUNCTION ops (inline code)");
  c.string("tokens-file", "PATH",
           "tenants, bearer tokens and quotas (format: server/auth.h); every request then needs a token; none: one "
           "anonymous tenant. SIGHUP reloads it: new tenants and tokens work, a token no longer listed is refused, "
           "changed limits apply to new requests; a tenant's sessions, bytes and compiles carry over. A removed "
           "tenant's sessions close when they idle out. A file that does not parse is logged (file:line) and the "
           "tenants in force stay.");
  c.string("tls-cert", "PEM", "serve the client API over TLS with this certificate (and --tls-key)");
  c.string("tls-key", "PEM", "its key");
  c.string("tls-client-ca", "PEM", "and require client certificates signed by this CA (mTLS)");
  c.string("worker-tls-cert", "PEM",
           "mutual TLS between scheduler and workers, with --worker-tls-key and --worker-tls-ca (embedded workers are "
           "started with the same files); the internal services then require client certificates of that CA");
  c.string("worker-tls-key", "PEM", "its key");
  c.string("worker-tls-ca", "PEM", "the CA of the workers' (and the internal services' callers') certificates");
  c.string("worker-tls-server-name", "N", "the name workers' certificates carry").shown_default("their host");
  c.integer("max-tenant-workers", "N",
            "with --tokens-file every tenant gets worker processes of its own (tenant isolation): at most this many at once", 8);
  c.integer("tenant-worker-idle-s", "N",
            "a tenant's worker unused this long (and no session of the tenant on its device) is stopped", 120);
  return t;
}

std::string default_cache_dir() {
  if (const char* x = getenv("XDG_CACHE_HOME"); x && *x) return cat(x, "/uopd");
  if (const char* h = getenv("HOME"); h && *h) return cat(h, "/.cache/uopd");
  return "/tmp/uopd-cache";
}

// uop-worker next to this binary (installed layout), in the build tree's worker/, or PATH.
std::string find_worker(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (auto p : {self / "uop-worker", self.parent_path() / "worker" / "uop-worker"})
    if (std::filesystem::exists(p, ec)) return p.string();
  return "uop-worker";
}

std::vector<SampledFamily> sample(CompileCache& cache, WorkerPool& pool, Planner& planner, SessionManager& sessions,
                                  const Executor& executor, const ByteBudget& inflight, const Tuner& tuner) {
  std::vector<SampledFamily> out;
  const TunerStats t = tuner.stats();
  out.push_back({"uopd_schedule_searches_total", "kernels whose loop schedule was searched (uop tune, --search=beam)", true,
                 {{{}, double(t.searches)}}});
  out.push_back({"uopd_schedule_candidates_timed_total", "schedule candidates timed on a worker", true,
                 {{{}, double(t.candidates_timed)}}});
  out.push_back({"uopd_schedule_candidates_dropped_total", "schedule candidates dropped, by reason", true,
                 {{{{"reason", "compile"}}, double(t.dropped_compile)},
                  {{{"reason", "mismatch"}}, double(t.dropped_mismatch)},
                  {{{"reason", "crash"}}, double(t.dropped_crash)},
                  {{{"reason", "timeout"}}, double(t.dropped_timeout)}}});
  out.push_back({"uopd_schedule_search_leases_total",
                 "searches of a kernel whose cluster lease (Redis) another server held: left to it (held_elsewhere), or "
                 "taken over by it mid-search, stopped without a record (lost)",
                 true,
                 {{{{"outcome", "held_elsewhere"}}, double(t.leases_held_elsewhere)},
                  {{{"outcome", "lost"}}, double(t.leases_lost)}}});
  SampledFamily records{"uopd_tuning_records_total", "tuning records found, by tier (missing: in none)", true, {}};
  for (const auto& [tier, n] : t.record_hits) records.samples.push_back({{{"tier", tier}}, double(n)});
  records.samples.push_back({{{"tier", "missing"}}, double(t.record_misses)});
  out.push_back(records);
  out.push_back({"uopd_tuning_record_errors_total", "tuning records refused (corrupt, truncated, foreign, another build) or tiers that failed",
                 true, {{{}, double(t.record_errors)}}});
  out.push_back({"uopd_tuning_records_written_total", "tuning records written by searches here", true,
                 {{{}, double(t.records_written)}}});
  SampledFamily hits{"uopd_cache_hits_total", "compile cache hits by tier", true, {}};
  SampledFamily misses{"uopd_cache_misses_total", "compile cache misses by tier", true, {}};
  SampledFamily errors{"uopd_cache_errors_total", "compile cache errors by tier (entries that fail authentication or checks, failed tiers)", true, {}};
  for (auto& [tier, st] : cache.stats()) {
    hits.samples.push_back({{{"tier", tier}}, double(st.hits)});
    misses.samples.push_back({{{"tier", tier}}, double(st.misses)});
    errors.samples.push_back({{{"tier", tier}}, double(st.errors + st.put_errors)});
  }
  out.push_back(hits);
  out.push_back(misses);
  out.push_back(errors);
  out.push_back({"uopd_compiles_total", "kernels compiled by this server", true, {{{}, double(cache.computes())}}});
  out.push_back({"uopd_compiles_coalesced_total", "requests that waited for a compile already running", true, {{{}, double(cache.coalesced())}}});
  out.push_back({"uopd_plan_cache_hits_total", "graphs whose plan was cached", true, {{{}, double(planner.plan_hits())}}});
  out.push_back({"uopd_compile_queue_depth", "planning and compile tasks waiting for a compile thread", false, {{{}, double(planner.compile_queue_depth())}}});
  out.push_back({"uopd_compile_tasks_running", "planning and compile tasks on the compile threads", false, {{{}, double(planner.compile_tasks_running())}}});
  out.push_back({"uopd_compile_tasks_abandoned_total", "planning and compile tasks given up because no request waited for them any more (client gone, deadline passed)",
                 true, {{{}, double(planner.tasks_abandoned())}}});
  double up = 0;
  SampledFamily restarts{"uopd_worker_restarts_total", "worker restarts by device", true, {}};
  std::map<std::string, double> restarts_by_device;  // with tenant isolation a device has several processes
  double tenant_workers = 0;
  for (const auto& w : pool.snapshot()) {
    up += w.state == "up";
    restarts_by_device[w.device] += double(w.restarts);
    tenant_workers += !w.tenant.empty() && w.state == "up";
  }
  for (const auto& [device, n] : restarts_by_device) restarts.samples.push_back({{{"device", device}}, n});
  out.push_back({"uopd_workers_up", "workers serving", false, {{{}, up}}});
  out.push_back({"uopd_tenant_workers", "worker processes serving one tenant alone (tenant isolation)", false,
                 {{{}, tenant_workers}}});
  out.push_back(restarts);
  const Executor::ExecuteCounts ex = executor.execute_counts();
  out.push_back({"uopd_worker_executes_total", "Execute calls to workers by transport (lane: shared memory to an embedded worker)",
                 true, {{{{"transport", "lane"}}, double(ex.lane)}, {{{"transport", "grpc"}}, double(ex.grpc)}}});
  out.push_back({"uopd_worker_program_loads_total", "kernels loaded onto workers (again after an unload included)", true,
                 {{{}, double(ex.program_loads)}}});
  out.push_back({"uopd_worker_programs_unloaded_total",
                 "kernels workers unloaded to stay under their program budget (--worker-max-program-bytes)", true,
                 {{{}, double(ex.programs_unloaded)}}});
  const Executor::CollectiveCounts coll = executor.collective_counts();
  out.push_back({"uopd_collective_groups_formed_total",
                 "collective groups formed (each reused by its members' later collectives until one fails or a member leaves)",
                 true, {{{}, double(coll.groups_formed)}}});
  out.push_back({"uopd_collective_groups", "collective groups alive", false, {{{}, double(coll.groups_alive)}}});
  out.push_back({"uopd_collectives_total", "collectives run (a bucket of allreduces is one)", true, {{{}, double(coll.run)}}});
  out.push_back({"uopd_collective_transport_total", "collectives run by transport (shm: one host; gloo: across hosts)", true,
                 {{{{"transport", "shm"}}, double(coll.shm)},
                  {{{"transport", "gloo"}}, double(coll.gloo)},
                  {{{"transport", "nccl"}}, double(coll.nccl)}}});
  out.push_back({"uopd_collectives_running", "collectives whose members are being called now", false,
                 {{{}, double(coll.running)}}});
  out.push_back({"uopd_sessions", "open sessions", false, {{{}, double(sessions.sessions())}}});
  out.push_back({"uopd_buffer_bytes", "bytes held in session buffers", false, {{{}, double(sessions.bytes())}}});
  out.push_back({"uopd_inflight_bytes", "bytes requests hold in the scheduler now (of --max-inflight-bytes)", false,
                 {{{}, double(inflight.in_use())}}});
  out.push_back({"uopd_inflight_refusals_total", "requests refused for want of memory (--max-inflight-bytes, --max-request-memory)",
                 true, {{{}, double(inflight.refusals())}}});
  return out;
}

// With --tokens-file: refusals by limit, auth failures and reloads; per tenant (what it
// holds, its requests refused by each limit) only with --metrics-tenant-labels, since
// the metrics port takes no credential and tenant names are not for everyone.
std::vector<SampledFamily> sample_tenants(const Tenants& tenants, SessionManager& sessions, bool tenant_labels) {
  SampledFamily reqs{"uopd_tenant_requests_total", "requests by tenant (authenticated)", true, {}};
  SampledFamily refused{"uopd_tenant_rejections_total", "requests refused by a tenant limit (rps, compiles, sessions, bytes)", true, {}};
  SampledFamily open{"uopd_tenant_sessions", "open sessions by tenant", false, {}};
  SampledFamily bytes{"uopd_tenant_buffer_bytes", "buffer bytes held by tenant", false, {}};
  std::map<std::string, uint64_t> by_limit;
  for (Tenant* t : tenants.all()) {
    for (auto& [limit, n] : t->rejections()) by_limit[limit] += n;
    if (!tenant_labels) continue;
    reqs.samples.push_back({{{"tenant", t->name()}}, double(t->requests())});
    for (auto& [limit, n] : t->rejections()) refused.samples.push_back({{{"tenant", t->name()}, {"limit", limit}}, double(n)});
    TenantUsage u = sessions.usage(t->name());
    open.samples.push_back({{{"tenant", t->name()}}, double(u.sessions)});
    bytes.samples.push_back({{{"tenant", t->name()}}, double(u.bytes)});
  }
  SampledFamily quota{"uopd_quota_rejections_total", "requests refused by a tenant limit, all tenants together", true, {}};
  for (auto& [limit, n] : by_limit) quota.samples.push_back({{{"limit", limit}}, double(n)});
  std::vector<SampledFamily> out = {
      quota,
      {"uopd_auth_failures_total", "requests without a valid bearer token", true, {{{}, double(tenants.auth_failures())}}},
      {"uopd_config_reloads_total", "tokens file reloads (SIGHUP) that took effect (ok) or were refused, keeping the tenants in force (error)",
       true, {{{{"result", "ok"}}, double(tenants.reloads_ok())}, {{{"result", "error"}}, double(tenants.reloads_failed())}}}};
  if (tenant_labels) out.insert(out.end(), {reqs, refused, open, bytes});
  return out;
}

// SIGHUP: the tokens file again. Either all of it takes effect or none of it does.
void reload_tokens(const std::string& path, Tenants& tenants, SessionManager& sessions) {
  if (path.empty() || !tenants.enabled()) {
    std::cerr << "uopd: SIGHUP: no --tokens-file, nothing to reload\n";
    return;
  }
  auto fresh = Tenants::load(path);
  if (!fresh.ok()) {
    tenants.count_failed_reload();
    std::cerr << "uopd: SIGHUP: error: tokens file " << path << " not reloaded, the tenants in force stay: "
              << fresh.status().message() << "\n";
    return;
  }
  // The session and byte limits first, so that by the time a new token is accepted the
  // new limits hold too. (A CreateSession admitted just before the swap may still set its
  // tenant's old limits; the next session that tenant opens sets the new ones.)
  for (Tenant* t : (*fresh)->all()) {
    TenantQuota q = t->quota();
    sessions.set_limits(SessionOwner{t->name(), q.max_sessions, q.max_bytes});
  }
  auto summary = tenants.adopt(std::move(*fresh));
  if (!summary.ok()) {
    std::cerr << "uopd: SIGHUP: error: tokens file " << path << " not reloaded: " << summary.status().message() << "\n";
    return;
  }
  std::cerr << "uopd: SIGHUP: reloaded tokens file " << path << ": " << *summary << "\n";
}

// The disk and Redis tiers, and the key that authenticates their entries. A cache
// directory that cannot be used is a warning (compiles still work, they are just not kept
// across restarts); a key file that is unsafe, or Redis settings that cannot work, are not.
absl::Status add_persistent_tiers(const flags::Args& f, std::string& cache_dir, std::vector<std::unique_ptr<CacheTier>>& tiers) {
  std::optional<ClusterKey> key;
  std::string key_from = f.get("cache-key-file");
  if (!key_from.empty()) {
    auto k = ClusterKey::from_file(key_from);
    if (!k.ok()) return absl::FailedPreconditionError(cat("--cache-key-file: ", k.status().message()));
    key = *std::move(k);
  } else if (!f.get("redis").empty()) {
    return absl::InvalidArgumentError(
        "--redis needs --cache-key-file: every scheduler sharing a Redis must authenticate cache entries with the "
        "same key (a file of 32+ random bytes only uopd's user can read: head -c 32 /dev/urandom > FILE; chmod 600 FILE)");
  } else if (!cache_dir.empty()) {
    auto k = ClusterKey::in_directory(cache_dir);
    if (absl::IsUnavailable(k.status())) {
      std::cerr << "uopd: warning: no disk cache: " << k.status().message() << "\n";
      cache_dir.clear();
    } else if (!k.ok()) {
      return k.status();
    } else {
      key = *std::move(k);
      key_from = cat(cache_dir, "/", ClusterKey::kFileName);
    }
  }
  if (key) std::cerr << "uopd: cache entries authenticated with key " << key->fingerprint() << " (" << key_from << ")\n";
  if (!cache_dir.empty()) {
    auto disk = std::make_unique<DiskTier>(cache_dir, f.integer("disk-cache-bytes"), *key);
    if (!disk->open_status().ok()) std::cerr << "uopd: warning: " << disk->open_status().message() << "\n";
    tiers.push_back(std::move(disk));
  }
  if (f.get("redis").empty()) {
    for (const char* k : {"redis-user", "redis-password-file", "redis-tls-ca", "redis-tls-cert", "redis-tls-key", "redis-tls-server-name"})
      if (!f.get(k).empty()) return absl::InvalidArgumentError(cat("--", k, " needs --redis"));
    if (f.on("redis-tls")) return absl::InvalidArgumentError("--redis-tls needs --redis");
    return absl::OkStatus();
  }
  const std::string& r = f.get("redis");
  auto colon = r.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(r.substr(colon + 1), &port))
    return absl::InvalidArgumentError("--redis takes HOST:PORT");
  RedisEndpoint ep;
  ep.host = r.substr(0, colon);
  if (ep.host.size() > 2 && ep.host.front() == '[' && ep.host.back() == ']') ep.host = ep.host.substr(1, ep.host.size() - 2);
  ep.port = port;
  ep.user = f.get("redis-user");
  if (const std::string& pw = f.get("redis-password-file"); !pw.empty()) {
    auto secret = read_secret_file(pw, "redis password file", 4096);
    if (!secret.ok()) return absl::FailedPreconditionError(cat("--redis-password-file: ", secret.status().message()));
    ep.password = *std::move(secret);
    if (ep.password.ends_with('\n')) ep.password.pop_back();
    if (ep.password.ends_with('\r')) ep.password.pop_back();
    if (ep.password.empty()) return absl::InvalidArgumentError(cat("--redis-password-file: ", pw, " is empty"));
  }
  ep.tls.enabled = f.on("redis-tls");
  ep.tls.ca_file = f.get("redis-tls-ca");
  ep.tls.cert_file = f.get("redis-tls-cert");
  ep.tls.key_file = f.get("redis-tls-key");
  ep.tls.server_name = f.get("redis-tls-server-name");
  RedisTier::Options ro;
  ro.timeout_ms = static_cast<int>(f.integer("redis-timeout-ms"));
  auto tier = RedisTier::create(std::move(ep), *key, ro);
  if (!tier.ok()) return absl::Status(tier.status().code(), cat("--redis: ", tier.status().message()));
  tiers.push_back(*std::move(tier));
  return absl::OkStatus();
}

// A builder option that takes the reflection plugin (every builder gets it once the
// reflection library is linked) off a server.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
      return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) != nullptr;
    });
  }
};

bool loopback(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]" || host == "::1";
}

// How the internal services and the workers authenticate (transport/cluster_auth.h): the
// cluster secret (--cluster-secret-file, or one made now that only the embedded workers
// learn), mutual TLS (--worker-tls-*), both, or, with --insecure-internal, nothing.
// Where remote workers are expected (no embedded ones, or an internal listener others can
// reach) a secret made here would lock them out: one of the three must be given. Returns
// an exit status, 0 to go on.
int internal_credentials(const flags::Args& f, cluster_auth::Gate* gate, cluster_auth::Dialer* dial, WorkerOptions* wo) {
  const bool insecure = f.on("insecure-internal");
  const std::string& secret_file = f.get("cluster-secret-file");
  tls::TlsFiles worker_tls{f.get("worker-tls-cert"), f.get("worker-tls-key"), f.get("worker-tls-ca")};
  if (insecure && (!secret_file.empty() || worker_tls.any())) {
    std::cerr << "uopd: --insecure-internal turns authentication off: it goes with neither --cluster-secret-file nor --worker-tls-*\n";
    return 2;
  }
  if (worker_tls.any()) {
    if (worker_tls.cert.empty() || worker_tls.key.empty() || worker_tls.ca.empty()) {
      std::cerr << "uopd: worker mutual TLS needs --worker-tls-cert, --worker-tls-key and --worker-tls-ca\n";
      return 2;
    }
    auto client = tls::channel_credentials(worker_tls);
    auto server = client.ok() ? tls::server_credentials(worker_tls, /*require_client_cert=*/true) : client.status();
    if (!server.ok()) { std::cerr << "uopd: " << server.status().message() << "\n"; return 1; }
    dial->tls = *client;
    dial->tls_server_name = f.get("worker-tls-server-name");
    gate->tls = *server;
    for (const char* k : {"cert", "key", "ca"}) wo->extra_args.push_back(cat("--tls-", k, "=", f.get(cat("worker-tls-", k))));
  }
  if (!secret_file.empty()) {
    auto secret = cluster_auth::read_secret_file(secret_file);
    if (!secret.ok()) { std::cerr << "uopd: --cluster-secret-file: " << secret.status().message() << "\n"; return 1; }
    gate->secret = dial->secret = *secret;
  } else if (!worker_tls.any() && !insecure) {
    const std::string& internal = f.get("internal-listen");
    std::string why;
    if (f.integer("workers") == 0 && f.integer("cuda-workers") == 0) why = "no embedded workers";
    else if (!loopback(internal.substr(0, internal.rfind(':')))) why = cat("--internal-listen=", internal, " is off loopback");
    if (!why.empty()) {
      std::cerr << "uopd: remote workers are expected (" << why
                << ") and nothing would authenticate them: give --cluster-secret-file (the workers get the same "
                   "file), --worker-tls-cert/--worker-tls-key/--worker-tls-ca, or --insecure-internal (anyone who "
                   "reaches the internal port is then trusted as a worker)\n";
      return 2;
    }
    gate->secret = dial->secret = cluster_auth::random_secret();
  }
  return 0;
}

int run(int argc, char** argv) {
  const flags::Tool tool = uopd_flags();
  auto parsed = tool.parse(argc, argv);
  if (!parsed.ok()) return tool.usage_error(parsed.status());
  const flags::Args& f = *parsed;
  if (f.help) {
    std::cout << tool.help();
    return 0;
  }
  quiet_protobuf_logs();
  // Signals are taken by one thread with sigwait, so block them before any thread starts.
  // SIGHUP too: it reloads the tokens file (and must never kill the server).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto metrics = Metrics::create(f.get("metrics-listen"));
  if (!metrics.ok()) { std::cerr << "uopd: " << metrics.status().message() << "\n"; return 1; }

  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(f.integer("memory-cache-bytes")));
  std::string cache_dir = f.has("cache-dir") ? f.get("cache-dir") : default_cache_dir();
  if (absl::Status s = add_persistent_tiers(f, cache_dir, tiers); !s.ok()) {
    std::cerr << "uopd: " << s.message() << "\n";
    return absl::IsInvalidArgument(s) ? 2 : 1;
  }
  // A refused entry (forged, corrupt, misfiled) or a failing tier is worth a log line, but a
  // Redis that is down fails every lookup: at most one line per tier every 10 s, the rest
  // counted in uopd_cache_errors_total.
  std::mutex cache_log_mu;
  std::map<std::string, absl::Time, std::less<>> cache_logged;
  CompileCache cache(std::move(tiers), [&](std::string_view tier, const absl::Status& s) {
    std::lock_guard<std::mutex> l(cache_log_mu);
    auto it = cache_logged.try_emplace(std::string(tier), absl::InfinitePast()).first;
    if (absl::Now() - it->second < absl::Seconds(10)) return;
    it->second = absl::Now();
    std::cerr << "uopd: cache " << tier << ": " << s << "\n";
  });

  WorkerOptions wo;
  wo.worker_binary = find_worker(f.get("worker-binary"));
  wo.embedded_cpu_workers = static_cast<int>(f.integer("workers"));
  wo.embedded_cuda_workers = static_cast<int>(f.integer("cuda-workers"));
  wo.threads_per_worker = static_cast<int>(f.integer("worker-threads"));
  wo.exec_lane = f.get("exec-lane") == "shm";
  if (f.has("worker-max-buffer-bytes")) wo.extra_args.push_back(cat("--max-buffer-bytes=", f.get("worker-max-buffer-bytes")));
  if (f.has("worker-max-program-bytes"))
    wo.extra_args.push_back(cat("--max-program-bytes=", f.get("worker-max-program-bytes")));
  cluster_auth::Gate internal_gate;
  cluster_auth::Dialer worker_dial;
  if (int rc = internal_credentials(f, &internal_gate, &worker_dial, &wo); rc != 0) return rc;
  WorkerPool pool(worker_dial);
  if (wo.embedded_cpu_workers > 0 || wo.embedded_cuda_workers > 0) {
    if (absl::Status s = pool.start_embedded(wo); !s.ok()) { std::cerr << "uopd: " << s.message() << "\n"; return 1; }
  }

  PlannerOptions po;
  po.compile_threads = static_cast<int>(std::max<int64_t>(f.integer("compile-threads"), 1));
  po.max_kernel_ops = f.integer("max-kernel-ops");
  po.max_plan_nodes = f.integer("max-plan-nodes");
  po.bucket_cap_bytes = static_cast<uint64_t>(f.integer("bucket-cap-mb")) << 20;
  po.allow_custom = f.on("allow-custom");
  po.keep_source = true;
  // What the planner keeps of the entries it resolved (parsed artifacts) is bounded with
  // the memory tier's budget: a quarter more.
  po.resolved_kernel_bytes = static_cast<uint64_t>(std::max<int64_t>(f.integer("memory-cache-bytes"), 0)) / 4;
  if (auto arch = make_backend("cuda", f.get("cuda-arch")); !arch.ok()) {
    std::cerr << "uopd: --cuda-arch: " << arch.status().message() << "\n";
    pool.shutdown();
    return 2;
  }
  po.default_arch["cuda"] = f.get("cuda-arch");
  Planner planner(po, &cache, CpuTarget::host());
  // Limits that hold without a tokens file too. One session may not take a worker's
  // whole buffer budget (by default 3/4 of its machine's memory: uop-worker).
  const uint64_t memory = usable_memory_bytes();
  const uint64_t worker_budget = !f.has("worker-max-buffer-bytes") ? memory / 4 * 3 : static_cast<uint64_t>(f.integer("worker-max-buffer-bytes"));
  SessionOptions so;
  so.max_bytes = !f.has("session-bytes") ? std::min<uint64_t>(uint64_t{4} << 30, worker_budget / 4)
                                                     : static_cast<uint64_t>(f.integer("session-bytes"));
  so.idle_timeout = absl::Seconds(f.integer("session-idle-timeout-s"));
  so.max_idle_timeout = absl::Seconds(f.integer("max-session-idle-timeout-s"));
  so.max_buffers = f.integer("session-buffers");
  so.max_sessions = f.integer("max-sessions");
  SessionManager sessions(so);
  Executor executor(&pool);
  std::unique_ptr<Tenants> tenants = Tenants::anonymous();
  if (!f.get("tokens-file").empty()) {
    auto loaded = Tenants::load(f.get("tokens-file"));
    if (!loaded.ok()) { std::cerr << "uopd: " << loaded.status().message() << "\n"; pool.shutdown(); return 1; }
    tenants = std::move(*loaded);
    // A tenant's buffers and kernels only in processes of its own (server/workers.h).
    pool.isolate_tenants({static_cast<size_t>(std::max<int64_t>(f.integer("max-tenant-workers"), 1)),
                          absl::Seconds(f.integer("tenant-worker-idle-s")),
                          [&sessions](const std::string& t, const std::string& d) { return sessions.uses_device(t, d); }});
  }
  SearchOptions search;
  if (absl::Status s = parse_search_mode(f.get("search"), &search); !s.ok()) {
    std::cerr << "uopd: " << s.message() << "\n";
    pool.shutdown();
    return 2;
  }
  search.budget = absl::Seconds(f.integer("search-budget-s"));
  search.lease = absl::Seconds(f.integer("search-lease-s"));
  Tuner tuner(search, &planner, &executor, &cache);
  if (search.mode != SearchMode::Off)
    planner.set_schedule_source([&tuner](const PlannedKernel& k, const Backend& b, std::string_view ns) {
      return tuner.recorded_schedule(k, b, ns);
    });
  ServiceDeps deps{&planner, &cache, &sessions, &pool, &executor, metrics->get(), {}};
  deps.tenants = tenants.get();
  deps.tuner = &tuner;
  deps.limits.decode.max_nodes = static_cast<uint32_t>(f.integer("max-nodes"));
  deps.limits.decode.max_bytes = f.integer("max-request-bytes");
  deps.limits.request_deadline = absl::Seconds(f.integer("request-deadline-s"));
  deps.limits.max_inflight_bytes = !f.has("max-inflight-bytes") ? std::min<uint64_t>(uint64_t{4} << 30, memory / 4)
                                                                             : static_cast<uint64_t>(f.integer("max-inflight-bytes"));
  deps.limits.max_request_memory = std::min<uint64_t>(f.integer("max-request-memory"), deps.limits.max_inflight_bytes);
  deps.limits.max_inline_output_bytes = f.integer("max-inline-output-bytes");
  deps.limits.stream_idle_timeout = absl::Seconds(f.integer("stream-idle-timeout-s"));
  UopdService service(deps);
  (*metrics)->add_sampler([&] { return sample(cache, pool, planner, sessions, executor, service.inflight(), tuner); });
  // Anyone who reaches the metrics port can read it: tenant names only when asked for.
  const bool tenant_labels = f.on("metrics-tenant-labels");
  if (tenants->enabled()) (*metrics)->add_sampler([&, tenant_labels] { return sample_tenants(*tenants, sessions, tenant_labels); });

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // The internal services on a listener of their own, without reflection: it serves the
  // client listener only, which lists client services only.
  RegistryService registry(&pool);
  // The rendezvous of collectives between workers on different hosts, and NCCL's.
  RendezvousService rendezvous;
  int internal_port = 0;
  grpc::ServerBuilder internal_builder;
  internal_builder.SetOption(std::make_unique<WithoutReflection>());
  internal_builder.AddListeningPort(f.get("internal-listen"), internal_gate.credentials(), &internal_port);
  internal_builder.RegisterService(&registry);
  internal_builder.RegisterService(&rendezvous);
  std::unique_ptr<grpc::Server> internal_server = internal_builder.BuildAndStart();
  if (!internal_server || internal_port == 0) {
    std::cerr << "uopd: cannot listen on " << f.get("internal-listen") << " (--internal-listen)\n";
    pool.shutdown();
    return 1;
  }
  grpc::ServerBuilder builder;
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> listen_creds = grpc::InsecureServerCredentials();
  if (!f.get("tls-cert").empty() || !f.get("tls-key").empty() || !f.get("tls-client-ca").empty()) {
    tls::TlsFiles api_tls{f.get("tls-cert"), f.get("tls-key"), f.get("tls-client-ca")};
    auto creds = tls::server_credentials(api_tls, !api_tls.ca.empty());
    if (!creds.ok()) { std::cerr << "uopd: " << creds.status().message() << "\n"; pool.shutdown(); return 1; }
    listen_creds = *creds;
  }
  builder.AddListeningPort(f.get("listen"), listen_creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(f.integer("max-request-bytes"), INT32_MAX)));
  // gRPC's own buffers (what it reads before a handler sees a request) under the same
  // budget: past it, gRPC slows reading and sheds streams (RESOURCE_EXHAUSTED) instead
  // of growing.
  grpc::ResourceQuota quota("uopd");
  quota.Resize(static_cast<size_t>(deps.limits.max_inflight_bytes));
  builder.SetResourceQuota(quota);
  builder.SetMaxSendMessageSize(INT32_MAX);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "uopd: cannot listen on " << f.get("listen") << "\n";
    pool.shutdown();
    return 1;
  }
  std::string host = f.get("listen").substr(0, f.get("listen").rfind(':'));
  // Workers reach the rendezvous at the internal listener; a wildcard address is
  // advertised as this host's name.
  std::string internal_host = f.get("internal-listen").substr(0, f.get("internal-listen").rfind(':'));
  std::string rendezvous_host = internal_host;
  if (internal_host == "0.0.0.0" || internal_host == "[::]" || internal_host.empty()) {
    char name[256] = {};
    rendezvous_host = gethostname(name, sizeof name - 1) == 0 ? name : "127.0.0.1";
  }
  const std::string& transport = f.get("collective-transport");
  executor.set_collective_options({cat(rendezvous_host, ":", internal_port), &rendezvous.store(),
                                   absl::Milliseconds(f.integer("collective-timeout-ms")), transport == "auto" ? "" : transport,
                                   f.on("sequential-steps")});
  std::cout << "INTERNAL " << internal_host << ":" << internal_port << std::endl;
  std::cout << "LISTENING " << host << ":" << port << std::endl;
  // One write: std::cerr is unbuffered, so a line made of many << reaches a reader (a test
  // waiting for "uopd: serving") in pieces.
  std::cerr << cat("uopd: serving on ", host, ":", port, " (internal services on ", internal_host, ":", internal_port,
                   ", ", internal_gate.authenticates() ? "authenticated" : "unauthenticated: --insecure-internal", "), ",
                   wo.embedded_cpu_workers, " CPU workers, cache ", cache_dir.empty() ? std::string("in memory only") : cache_dir,
                   f.get("redis").empty() ? "" : cat(" + redis ", f.get("redis")),
                   (*metrics)->address().empty() ? "" : cat(", metrics on http://", (*metrics)->address(), "/metrics"), "\n");

  // Idle sessions close on their own.
  std::atomic<bool> stopping{false};
  std::thread reaper([&] {
    while (!stopping) {
      for (int i = 0; i < 10 && !stopping; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      service.free_buffers(sessions.reap_idle(absl::Now()));
    }
  });

  int sig = 0;
  for (;;) {
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig != SIGHUP) break;
    reload_tokens(f.get("tokens-file"), *tenants, sessions);
  }
  std::cerr << "uopd: signal " << sig << ", draining\n";
  // Drain: with the listener still open, every new request is refused with a clear
  // UNAVAILABLE ("uopd is shutting down") and the health service reports NOT_SERVING, while
  // the requests in flight finish (or the drain deadline passes); then their answers get a
  // moment to leave. gRPC's Server::Shutdown is not called: it cancels every call it has
  // accepted but not yet handed to a handler with a bare CANCELLED (no message), and
  // clients retrying during the drain keep some calls in that state at any moment. Leaving
  // instead closes the connections: a call cut off that way fails UNAVAILABLE (the socket
  // closed), as clear and as retryable as the refusals.
  service.begin_drain();
  if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) health->SetServingStatus(false);
  // (Handlers count themselves before they look at the drain flag: one that got past it is
  // counted. Refusals are counted too, for microseconds.)
  absl::Time drain_until = absl::Now() + absl::Seconds(30);
  auto drain = [&] {
    while (service.in_flight() > 0 && absl::Now() < drain_until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  drain();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  drain();
  stopping = true;
  reaper.join();
  pool.shutdown();
  std::cerr << "uopd: stopped\n";
  std::fflush(nullptr);
  // Nothing is left to flush (cache entries are published whole before a request answers),
  // and gRPC's and the metrics server's teardown can take seconds: leave now.
  std::_Exit(0);
}

}  // namespace
}  // namespace uop::server

int main(int argc, char** argv) { return uop::server::run(argc, argv); }
