// Argument parsing and naming for the `uop` command; see cli.h.
#include "client/cli.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop::cli {

flags::Tool uop_flags(bool onnx) {
  flags::Tool t("uop", "uop: the UOp graph compiler, as a service (uopd).",
                "run prints each kernel's cache status on stderr (\"miss, compiled in 12 ms\", \"hit (memory)\"). "
                "Inputs and outputs are named by the graph's `names`, as for uopc.\n"
                "Exit status: 0 ok, 1 invalid input or a failure (the server's message is printed), 2 usage.");
  flags::Command& common = t.common();
  common.describe("GRAPH is a graph file: protobuf JSON (*.json) or binary (*.uopb), see proto/uop.proto. It is "
                  "read and verified here, then compiled, run or explained by a uopd server.");
  common.string("server", "HOST:PORT", "the uopd to use").shown_default(cat("$UOPD_ADDRESS, else ", client::kDefaultAddress));
  common.flag("embedded", "start a private uopd for this command, stop it after");
  common.string("uopd", "PATH", "the uopd that --embedded starts").shown_default("server/uopd of this build tree, else uopd on PATH");
  common.string("deadline", "SECONDS", "limit for each request", "60");
  common.string("token", "TOKEN", "the tenant's bearer token for a uopd started with --tokens-file").shown_default("$UOPD_TOKEN");
  common.flag("tls", "talk TLS (on too when a --tls-* file is given)");
  common.string("tls-ca", "PEM", "CA that the server's certificate chains to");
  common.string("tls-cert", "PEM", "this client's certificate, for a server that requires one (uopd --tls-client-ca)");
  common.string("tls-key", "PEM", "its key");

  flags::Command& run = t.command("run", onnx ? "compile and run on the server's device; a MODEL.onnx is loaded into "
                                                "uopd, which imports it and keeps its weights (--in for every model input)"
                                              : "compile and run on the server's device");
  run.positional("GRAPH");
  run.string("in", "NAME=FILE.npy", "bind the input called NAME").repeatable();
  run.string("random", "SEED", "fill unbound inputs with seeded random values (the same values as `uopc run --random SEED`)");
  run.string("out", "NAME=FILE.npy", "write the output called NAME; without any, outputs are summarized on stdout").repeatable();
  run.string("device", "NAME", "the server's device to run on").shown_default("its first CPU");
  run.flag("profile", "time every kernel launch on the workers and print a table, slowest first: launches, total and "
                      "per-launch ms, GFLOPS and GB/s (from the compiler's estimate) and the kernel's schedule");

  flags::Command& compile = t.command("compile", onnx ? "compile every kernel: name, digest, cache status and tier, ABI; GRAPH or "
                                                        "MODEL.onnx (imported here as uopd imports it, nothing uploaded)"
                                                      : "compile every kernel: name, digest, cache status and tier, ABI");
  compile.positional("GRAPH");
  compile.string("target", "cpu|cuda:sm_NN", "what to compile for", "cpu");
  compile.string("binary-out", "DIR", "write each kernel's object (NAME.o) or cubin (NAME.cubin)");
  compile.string("source-out", "DIR", "write each kernel's source (NAME.ll or NAME.cu)");
  compile.string("schedule", "[DIGEST=]TEXT",
                 "compile the kernel of that digest or digest prefix (without one: the graph's only kernel) with this loop schedule, "
                 "e.g. split(1,8,upcast);thread(0), instead of the target's heuristic");

  flags::Command& explain = t.command("explain", onnx ? "print the IR after each stage of the server's pipeline; GRAPH or "
                                                        "MODEL.onnx (imported here)"
                                                      : "print the IR after each stage of the server's pipeline");
  explain.positional("GRAPH");
  explain.string("stage", "NAME", "only this stage (a name the server does not know: it answers with the list)");
  explain.string("target", "cpu|cuda:sm_NN", "lower for this target", "cpu");
  if (onnx) {
    // A MODEL.onnx is imported here for these two (client/onnx/onnx_cli.h, import_graph).
    compile.string("in", "NAME=FILE.npy", "a MODEL.onnx's input, for its shape (as uop run's)").repeatable();
    explain.string("in", "NAME=FILE.npy", "a MODEL.onnx's input, for its shape (as uop run's)").repeatable();
  }

  flags::Command& tune = t.command("tune", onnx ? "search each kernel's loop schedule for the server's CPU ahead of time "
                                                  "(GRAPH or MODEL.onnx, imported here): its progress, and each kernel's "
                                                  "time before / after; the winners are recorded for every later compile"
                                                : "search each kernel's loop schedule for the server's CPU ahead of time: "
                                                  "its progress, and each kernel's time before / after; the winners are "
                                                  "recorded for every later compile");
  tune.positional("GRAPH");
  tune.integer("width", "N", "schedules kept per round").shown_default("the server's").range(1, 64);
  tune.integer("budget", "SECONDS", "the most one kernel's search may take (with --deadline above it)")
      .shown_default("the server's --search-budget-s")
      .range(1, 3600);
  if (onnx) tune.string("in", "NAME=FILE.npy", "a MODEL.onnx's input, for its shape (as uop run's)").repeatable();
  t.command("stats", "the server's counters: workers, caches, plans, sessions");

  flags::Command& bench = t.command("bench", onnx ? "load once, run N times in one session: latency min / p50 / p99, runs "
                                                    "per second and where the time went; GRAPH or MODEL.onnx (loaded "
                                                    "into uopd once)"
                                                  : "load once, run N times in one session: latency min / p50 / p99, runs "
                                                    "per second and where the time went");
  bench.positional("GRAPH");
  bench.integer("iterations", "N", "timed runs", 20).range(1, 1'000'000);
  bench.integer("warmup", "N", "runs before the timed ones (compiles, plan cache, first-touch)", 3).range(0, 1'000'000);
  bench.string("in", "NAME=FILE.npy", "bind the input called NAME").repeatable();
  bench.string("random", "SEED", "the seed of the random values of unbound inputs", "0");
  bench.flag("json", "one JSON object on stdout, for scripts");
  bench.string("device", "NAME", "the server's device to run on").shown_default("its first CPU");

  if (onnx) {
    flags::Command& test = t.command("onnx-test",
                                     "run ONNX backend-test cases (model.onnx, test_data_set_*/): PASS / FAIL / "
                                     "UNSUPPORTED per case, then `N passed, N failed, N skipped`; exit 1 if any failed");
    test.rest("CASE_DIR");
    test.string("cases-from", "LIST", "case directories, one a line (# comments), under --root");
    test.string("root", "DIR", "the directory LIST names are relative to; alone: every case directory in it");
    test.string("shard", "I/N", "only the cases at positions I, I+N, I+2N, ...");
    test.flag("interp", "the reference interpreter in this process, no server");
    test.flag("by-op", "a summary by operator, and the unsupported ones");
    test.string("device", "NAME", "the server's device to run on").shown_default("its first CPU");
  }
  return t;
}

absl::StatusOr<std::vector<BenchSample>> bench_runs(const std::function<absl::StatusOr<client::RunResult>()>& run,
                                                     int64_t warmup, int64_t iterations) {
  for (int64_t i = 0; i < warmup; ++i) RETURN_IF_ERROR(run().status());
  std::vector<BenchSample> out;
  out.reserve(static_cast<size_t>(iterations));
  for (int64_t i = 0; i < iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(client::RunResult r, run());
    double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    out.push_back({wall, r.plan_ms, r.compile_ms, r.run_ms, r.collective_ms});
  }
  return out;
}

namespace {
// The value at quantile q of sorted values (nearest rank).
double quantile(const std::vector<double>& sorted, double q) {
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}
// `s` as a JSON string's contents.
std::string json_escaped(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}
std::string fixed(double v, int digits = 3) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}
}  // namespace

std::string bench_report(const std::string& what, const std::vector<BenchSample>& samples, double load_ms, bool json) {
  std::vector<double> wall;
  double plan = 0, compile = 0, run = 0, collective = 0, total = 0;
  for (const BenchSample& s : samples) {
    wall.push_back(s.wall_ms);
    plan += s.plan_ms, compile += s.compile_ms, run += s.run_ms, collective += s.collective_ms, total += s.wall_ms;
  }
  std::sort(wall.begin(), wall.end());
  const double n = static_cast<double>(samples.size());
  const double mean = total / n;
  // What the server's timings do not cover: the client, the RPC and the network.
  const double client = std::max(0.0, mean - (plan + compile + run + collective) / n);
  const double per_second = total > 0 ? 1000.0 * n / total : 0;
  std::ostringstream o;
  if (json) {
    o << "{\"what\": \"" << json_escaped(what) << "\", \"iterations\": " << samples.size() << ", \"load_ms\": " << fixed(load_ms)
      << ", \"min_ms\": " << fixed(wall.front()) << ", \"p50_ms\": " << fixed(quantile(wall, 0.5))
      << ", \"p99_ms\": " << fixed(quantile(wall, 0.99)) << ", \"mean_ms\": " << fixed(mean)
      << ", \"runs_per_second\": " << fixed(per_second, 2) << ", \"mean_plan_ms\": " << fixed(plan / n)
      << ", \"mean_compile_ms\": " << fixed(compile / n) << ", \"mean_run_ms\": " << fixed(run / n)
      << ", \"mean_collective_ms\": " << fixed(collective / n) << ", \"mean_client_ms\": " << fixed(client) << "}\n";
    return o.str();
  }
  o << what << ": " << samples.size() << " runs (loaded in " << fixed(load_ms) << " ms)\n"
    << "  latency ms   min " << fixed(wall.front()) << "   p50 " << fixed(quantile(wall, 0.5)) << "   p99 "
    << fixed(quantile(wall, 0.99)) << "   mean " << fixed(mean) << "\n"
    << "  runs/s       " << fixed(per_second, 2) << "\n"
    << "  per run, ms  plan " << fixed(plan / n) << "   compile + cache lookups " << fixed(compile / n)
    << "   worker kernels + transfers " << fixed(run / n);
  if (collective > 0) o << "   collectives " << fixed(collective / n);
  o << "   client + RPC " << fixed(client) << "\n";
  return o.str();
}

absl::StatusOr<client::ClientOptions> client_options(const Args& a, const char* token_env) {
  client::ClientOptions options;
  if (a.has("deadline")) {
    ASSIGN_OR_RETURN(options.deadline, parse_seconds(a.get("deadline")));
  }
  if (a.has("token")) options.bearer_token = a.get("token");
  else if (token_env && *token_env) options.bearer_token = token_env;
  options.tls = a.on("tls");
  options.tls_ca = a.get("tls-ca");
  options.tls_cert = a.get("tls-cert");
  options.tls_key = a.get("tls-key");
  return options;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> name_file_pairs(const Args& a, const std::string& opt) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& v : a.all(opt)) {
    auto eq = v.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
      return absl::InvalidArgumentError(cat("--", opt, " takes NAME=FILE.npy, got '", v, "'"));
    out.emplace_back(v.substr(0, eq), v.substr(eq + 1));
  }
  return out;
}

absl::StatusOr<uint64_t> parse_seed(std::string_view text) {
  uint64_t v = 0;
  if (text.empty() || text[0] == '-' || !absl::SimpleAtoi(absl::string_view(text.data(), text.size()), &v))
    return absl::InvalidArgumentError(cat("--random takes a number, got '", text, "'"));
  return v;
}

absl::StatusOr<absl::Duration> parse_seconds(std::string_view text) {
  double v = 0;
  if (!absl::SimpleAtod(absl::string_view(text.data(), text.size()), &v) || !(v > 0) || v > 1e7)
    return absl::InvalidArgumentError(cat("--deadline takes a positive number of seconds, got '", text, "'"));
  return absl::Seconds(v);
}

std::string server_address(const Args& a, const char* env_value) {
  if (a.has("server")) return a.get("server");
  if (env_value && *env_value) return env_value;
  return client::kDefaultAddress;
}

std::string file_name_for(std::string_view kernel_name) {
  std::string out;
  for (char c : kernel_name) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    out.push_back(keep ? c : '_');
  }
  if (out.empty() || out == "." || out == "..") out = cat("kernel", out);
  return out;
}

std::string_view binary_extension(const client::Target& t) { return t.backend == "cuda" ? ".cubin" : ".o"; }
std::string_view source_extension(const client::Target& t) { return t.backend == "cuda" ? ".cu" : ".ll"; }

std::string profile_table(const std::vector<client::KernelProfile>& profile) {
  std::vector<std::vector<std::string>> rows{{"kernel", "launches", "total ms", "per launch ms", "GFLOPS", "GB/s", "schedule"}};
  auto fixed = [](double v, int digits) { return absl::StrFormat("%.*f", digits, v); };
  for (const client::KernelProfile& k : profile)
    rows.push_back({k.name, cat(k.launches), fixed(k.total_ms, 3), fixed(k.per_launch_ms, 3),
                    k.flops > 0 && k.total_ms > 0 ? fixed(k.gflops, 2) : "-",
                    k.bytes > 0 && k.total_ms > 0 ? fixed(k.gbytes_per_s, 2) : "-", k.schedule});
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      // The name and the schedule left-aligned, the numbers right-aligned.
      const bool left = i == 0 || i + 1 == r.size();
      std::string pad(width[i] - r[i].size(), ' ');
      line += (i ? "  " : "") + (left ? r[i] + (i + 1 == r.size() ? "" : pad) : pad + r[i]);
    }
    out += line + "\n";
  }
  return out;
}

int tune_graph(client::Client& client, const UOp* root, const Names& names, const Args& a, const std::string& path,
               std::ostream& out) {
  // Compiled first: the kernels to tune, each compiled once the usual way.
  auto compiled = client.compile(root, names);
  if (!compiled.ok()) {
    std::cerr << "uop: " << path << ": " << compiled.status().message() << "\n";
    return 1;
  }
  const uint32_t width = a.has("width") ? static_cast<uint32_t>(a.integer("width")) : 0;
  const uint32_t budget = a.has("budget") ? static_cast<uint32_t>(a.integer("budget")) : 0;
  const size_t n = compiled->kernels.size();
  out << "tuning " << n << " kernel" << (n == 1 ? "" : "s") << " of " << path << " on " << client.address() << std::endl;
  double before = 0, after = 0, seconds = 0;
  for (size_t i = 0; i < n; ++i) {
    const client::Kernel& k = compiled->kernels[i];
    out << absl::StrFormat("[%d/%d] %s %s: ", i + 1, n, k.name, k.digest.substr(0, 12)) << std::flush;
    auto t = client.tune(root, names, k.digest, width, budget);
    if (!t.ok()) {
      out << "failed\n";
      std::cerr << "uop: " << path << ": kernel " << k.name << ": " << t.status().message() << "\n";
      return 1;
    }
    seconds += t->seconds;
    if (!t->skipped.empty()) {
      out << "not searched: " << t->skipped << "\n";
      continue;
    }
    before += t->before_ms;
    after += t->after_ms;
    out << absl::StrFormat("before %.4f ms, after %.4f ms (%.2fx)", t->before_ms, t->after_ms,
                           t->after_ms > 0 ? t->before_ms / t->after_ms : 1.0);
    if (t->from_record) {
      out << ", from its record";
    } else {
      out << absl::StrFormat(", %d candidates timed in %.1f s", t->candidates_timed, t->seconds);
      const uint64_t dropped = t->dropped_compile + t->dropped_mismatch + t->dropped_crash + t->dropped_timeout;
      if (dropped)
        out << absl::StrFormat(" (dropped: %d compile, %d mismatch, %d crash, %d timeout)", t->dropped_compile,
                               t->dropped_mismatch, t->dropped_crash, t->dropped_timeout);
    }
    out << "\n    schedule " << (!t->schedule.empty() ? t->schedule : t->heuristic_schedule.empty() ? std::string("the heuristic's") : "the heuristic's: " + t->heuristic_schedule) << "\n";
  }
  out << absl::StrFormat("total: before %.4f ms, after %.4f ms per run of every kernel once (%.2fx), %.1f s tuning\n",
                         before, after, after > 0 ? before / after : 1.0, seconds);
  return 0;
}

}  // namespace uop::cli
