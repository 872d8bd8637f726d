// uop: the remote twin of uopc. Reads and verifies a graph here, then has a uopd server
// compile, run or explain it (the client links no compiler backend: docs/ARCHITECTURE.md, Arrows). The
// server comes from --server, UOPD_ADDRESS or the default address; --embedded starts a
// private uopd for the duration of the command instead.
//
// Exit codes, as uopc: 0 ok, 1 invalid input or a failure (the server's message is
// printed), 2 usage.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "client/client.h"
#include "client/embedded_server.h"
#ifdef UOP_WITH_ONNX
#include "client/onnx/onnx_cli.h"
#endif
#include "compiler/interp/npy.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verifier.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using cli::Args;
using cli::kInvalid;
using cli::kOk;
using cli::kUsage;

// Inputs larger than this go to the server as buffers, streamed in chunks; smaller ones
// travel inside the Run request.
constexpr size_t kInlineInputBytes = 1u << 20;

#ifdef UOP_WITH_ONNX
constexpr bool kWithOnnx = true;
#else
constexpr bool kWithOnnx = false;
#endif

const flags::Tool& tool() {
  static const flags::Tool t = cli::uop_flags(kWithOnnx);
  return t;
}

int usage_error(const std::string& msg) { return tool().usage_error(msg); }
int invalid(const std::string& msg) {
  std::cerr << "uop: " << msg << "\n";
  return kInvalid;
}
// A failure from the server: its message as is when the input was at fault (it names the
// node and rule), with the code otherwise (UNAVAILABLE, DEADLINE_EXCEEDED, ...).
// The code of the last failure, so that the end of an embedded server's log is shown only
// when the server may be at fault, not for the user's own mistakes.
absl::StatusCode last_failure = absl::StatusCode::kOk;
int failed(const absl::Status& s, const std::string& path = "") {
  last_failure = s.code();
  if (s.code() == absl::StatusCode::kInvalidArgument)
    return invalid(path.empty() ? std::string(s.message()) : cat(path, ": ", s.message()));
  return invalid(cat(absl::StatusCodeToString(s.code()), ": ", s.message()));
}

// Reads and verifies the graph; what the server would refuse anyway is refused here
// before any connection, with the same messages as uopc. CUSTOM ops pass: whether they
// run is the server's decision.
std::optional<DecodedGraph> load(const std::string& path, int* rc) {
  auto g = read_graph_file(path);
  if (!g.ok()) {
    *rc = invalid(std::string(g.status().message()));
    return std::nullopt;
  }
  VerifyOptions opts;
  opts.index = &g->index;
  opts.allow_custom = true;
  if (absl::Status s = verify(*g->graph, g->root, opts); !s.ok()) {
    *rc = invalid(cat(path, ": ", s.message()));
    return std::nullopt;
  }
  return std::move(*g);
}

// What `run` prepares before it talks to anyone: bound inputs and the output names.
struct RunPlan {
  std::vector<client::Input> inputs;
  std::vector<std::string> out_names;             // as uopc names them, for checking --out
  std::map<std::string, std::string> out_files;  // --out NAME -> FILE
};

// Mirrors uopc run: --in by name, then --random for every unbound input in toposort order
// with seeds SEED, SEED+1, ... (so both tools feed a graph the same values).
std::optional<RunPlan> plan_run(const Args& a, const DecodedGraph& g, int* rc) {
  auto ins = cli::name_file_pairs(a, "in");
  auto outs = cli::name_file_pairs(a, "out");
  if (!ins.ok() || !outs.ok()) {
    *rc = usage_error(std::string((ins.ok() ? outs.status() : ins.status()).message()));
    return std::nullopt;
  }
  std::optional<uint64_t> seed;
  if (a.has("random") || a.command == "bench") {  // bench: random inputs unless bound
    auto s = cli::parse_seed(a.get("random"));
    if (!s.ok()) { *rc = usage_error(std::string(s.status().message())); return std::nullopt; }
    seed = *s;
  }
  Stage stage = detect_stage(g.root);
  Op input_op = stage == Stage::Kernel ? Op::PARAM : Op::BUFFER;
  std::map<std::string, const UOp*> by_name;
  NodeNames label;
  for (auto& [n, u] : g.names) by_name[n] = u, label[u] = n;

  absl::flat_hash_map<const UOp*, HostTensor> bound;
  for (auto& [name, file] : *ins) {
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second->op() != input_op) {
      *rc = usage_error(cat("the graph has no input named '", name, "' (inputs are named ", op_name(input_op), "s)"));
      return std::nullopt;
    }
    auto t = read_npy(file);
    if (!t.ok()) { *rc = invalid(std::string(t.status().message())); return std::nullopt; }
    bound[it->second] = std::move(*t);
  }
  std::vector<const UOp*> order = toposort(g.root);
  std::vector<const UOp*> unbound;
  for (const UOp* u : order) {
    if (u->op() != input_op || bound.contains(u)) continue;
    // At kernel level the PARAMs a STORE writes are outputs; the server starts them at zero.
    if (stage == Stage::Kernel) {
      bool written = false;
      for (const UOp* v : order)
        if (v->op() == Op::STORE && v->src().size() > 0 && v->src(0)->src().size() > 0 && v->src(0)->src(0) == u) written = true;
      if (written) continue;
    }
    unbound.push_back(u);
  }
  uint64_t k = 0;
  for (const UOp* u : unbound) {
    if (!seed) {
      std::string name = label.contains(u) ? label[u] : print_node(u, &g.index);
      *rc = usage_error(cat("input ", name, " is not bound: give --in ", label.contains(u) ? label[u] : "NAME",
                            "=FILE.npy or --random SEED"));
      return std::nullopt;
    }
    DType dt = u->op() == Op::PARAM ? u->dtype().pointee() : u->dtype();
    int64_t n = u->op() == Op::PARAM ? u->arg_as<ParamArg>().size : u->arg_as<BufferArg>().size;
    bound[u] = HostTensor::random(dt.scalar, {n}, *seed + k++);
  }

  RunPlan plan;
  for (const UOp* u : order) {
    auto it = bound.find(u);
    if (it == bound.end()) continue;
    HostTensor t = std::move(it->second);
    t.shape = {t.numel()};  // a BUFFER is flat: only the element count of a .npy matters
    client::Input in;
    if (label.contains(u)) in.node = label[u];
    else in.node = u;
    in.value = std::move(t);
    plan.inputs.push_back(std::move(in));
  }
  std::vector<const UOp*> out_nodes;
  if (stage == Stage::Kernel) {
    for (const UOp* u : order)
      if (u->op() == Op::PARAM) out_nodes.push_back(u);
    std::sort(out_nodes.begin(), out_nodes.end(),
              [](const UOp* x, const UOp* y) { return x->arg_as<ParamArg>().slot < y->arg_as<ParamArg>().slot; });
  } else {
    out_nodes.assign(g.root->src().begin(), g.root->src().end());
  }
  for (size_t i = 0; i < out_nodes.size(); ++i)
    plan.out_names.push_back(label.contains(out_nodes[i]) ? label[out_nodes[i]] : cat("out", i));
  for (auto& [name, file] : *outs) {
    if (std::find(plan.out_names.begin(), plan.out_names.end(), name) == plan.out_names.end()) {
      *rc = usage_error(cat("the graph has no output named '", name, "' (outputs: ", join(plan.out_names, ", "), ")"));
      return std::nullopt;
    }
    plan.out_files[name] = file;
  }
  return plan;
}

// Everything a command needs once connected.
struct Context {
  const Args& args;
  DecodedGraph* graph;  // null for stats
  client::Client& client;
};

// Inputs over kInlineInputBytes become buffers of the session, streamed in chunks.
absl::Status upload_large_inputs(client::Session& session, std::vector<client::Input>& inputs) {
  for (client::Input& in : inputs) {
    auto* t = std::get_if<HostTensor>(&in.value);
    if (!t || static_cast<size_t>(t->nbytes()) <= kInlineInputBytes) continue;
    auto id = session.upload_tensor(*t);
    if (!id.ok()) return id.status();
    in.value = *id;
  }
  return absl::OkStatus();
}

int cmd_run(Context& c, RunPlan& plan) {
  const std::string& path = c.args.positional[0];
  std::vector<std::string> devices;
  if (c.args.has("device")) devices.push_back(c.args.get("device"));
  auto session = c.client.create_session(devices);
  if (!session.ok()) return failed(session.status());
  // Large inputs stream into buffers in chunks; outputs stay on the server and stream back
  // the same way, so no message ever has to hold a whole tensor.
  if (absl::Status st = upload_large_inputs(*session, plan.inputs); !st.ok()) return failed(st);
  const bool profile = c.args.has("profile");
  auto result = session->run(c.graph->root, c.graph->names, plan.inputs, /*keep_outputs=*/true, profile);
  if (!result.ok()) return failed(result.status(), path);
  for (const client::Kernel& k : result->kernels)
    std::cerr << "kernel " << k.name << " " << k.digest.substr(0, 12) << ": " << client::describe_cache(k) << "\n";
  if (profile) std::cout << cli::profile_table(result->profile);

  std::vector<std::string> got_names;
  for (const client::RunOutput& o : result->outputs) got_names.push_back(o.name);
  for (auto& [name, file] : plan.out_files)
    if (std::find(got_names.begin(), got_names.end(), name) == got_names.end())
      return invalid(cat("uopd returned no output named '", name, "' (it returned: ", join(got_names, ", "), ")"));
  for (const client::RunOutput& o : result->outputs) {
    auto it = plan.out_files.find(o.name);
    if (it == plan.out_files.end() && !plan.out_files.empty()) continue;
    absl::StatusOr<HostTensor> t = o.kept() ? session->download_tensor(o) : absl::StatusOr<HostTensor>(o.tensor);
    if (!t.ok()) return failed(t.status());
    if (it != plan.out_files.end()) {
      if (absl::Status s = write_npy(it->second, *t); !s.ok()) return invalid(std::string(s.message()));
    } else {
      std::cout << o.name << " = " << t->str(12) << "\n";
    }
  }
  return kOk;
}

absl::Status write_file(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(cat("cannot create ", dir, ": ", ec.message()));
  std::string path = cat(dir, "/", name);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return absl::InvalidArgumentError(cat("cannot write ", path));
  return absl::OkStatus();
}

// `uop bench GRAPH`: one session, the inputs uploaded once (large ones) or inline, then
// the graph run --warmup and --iterations times (each Run finds its plan cached).
int cmd_bench(Context& c, RunPlan& plan) {
  const std::string& path = c.args.positional[0];
  std::vector<std::string> devices;
  if (c.args.has("device")) devices.push_back(c.args.get("device"));
  auto t0 = std::chrono::steady_clock::now();
  auto session = c.client.create_session(devices);
  if (!session.ok()) return failed(session.status());
  if (absl::Status st = upload_large_inputs(*session, plan.inputs); !st.ok()) return failed(st);
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto samples = cli::bench_runs([&] { return session->run(c.graph->root, c.graph->names, plan.inputs); },
                                 c.args.integer("warmup"), c.args.integer("iterations"));
  if (!samples.ok()) return failed(samples.status(), path);
  std::cout << cli::bench_report(path, *samples, load_ms, c.args.on("json"));
  return kOk;
}

int cmd_compile(Context& c) {
  const std::string& path = c.args.positional[0];
  auto target = client::parse_target(c.args.has("target") ? c.args.get("target") : "cpu");
  if (!target.ok()) return usage_error(std::string(target.status().message()));
  std::string bin_dir = c.args.get("binary-out"), src_dir = c.args.get("source-out");
  std::vector<client::KernelSchedule> schedules;
  if (c.args.has("schedule")) {
    // A schedule's text has no '=': what comes before one is the kernel's digest.
    std::string v = c.args.get("schedule");
    size_t eq = v.find('=');
    schedules.push_back(eq == std::string::npos ? client::KernelSchedule{"", v}
                                                : client::KernelSchedule{v.substr(0, eq), v.substr(eq + 1)});
  }
  auto r = c.client.compile(c.graph->root, c.graph->names, *target, !bin_dir.empty(), !src_dir.empty(), schedules);
  if (!r.ok()) return failed(r.status(), path);
  std::cout << "graph " << r->graph_digest.substr(0, 16) << ", target " << client::target_str(*target) << " on "
            << c.client.address() << (r->plan_cached ? ", plan cached" : "") << "\n";
  std::set<std::string> file_names;
  for (const client::Kernel& k : r->kernels) {
    std::cout << k.name << "  " << k.digest.substr(0, 16) << "  " << client::describe_cache(k);
    if (!k.binary.empty()) std::cout << ", " << k.binary.size() << " bytes";
    std::cout << "\n";
    for (absl::string_view line : absl::StrSplit(k.abi, '\n', absl::SkipEmpty())) std::cout << "    " << line << "\n";
    // Kernel names are unique within a graph; the digest settles it if they were not.
    std::string base = cli::file_name_for(k.name);
    if (!file_names.insert(base).second) base = cat(base, "-", k.digest.substr(0, 12));
    if (!bin_dir.empty()) {
      if (k.binary.empty()) return invalid(cat("uopd sent no binary for kernel ", k.name));
      if (absl::Status s = write_file(bin_dir, cat(base, cli::binary_extension(*target)), k.binary); !s.ok()) return failed(s);
    }
    if (!src_dir.empty()) {
      if (k.source.empty()) return invalid(cat("uopd sent no source for kernel ", k.name));
      if (absl::Status s = write_file(src_dir, cat(base, cli::source_extension(*target)), k.source); !s.ok()) return failed(s);
    }
  }
  return kOk;
}

int cmd_explain(Context& c) {
  const std::string& path = c.args.positional[0];
  auto target = client::parse_target(c.args.has("target") ? c.args.get("target") : "cpu");
  if (!target.ok()) return usage_error(std::string(target.status().message()));
  auto stages = c.client.explain(c.graph->root, c.graph->names, c.args.get("stage"), *target);
  if (!stages.ok()) return failed(stages.status(), path);
  // uopc refuses an unknown stage; a server that answers with nothing means the same.
  if (stages->empty() && c.args.has("stage"))
    return invalid(cat("uopd showed nothing for stage '", c.args.get("stage"), "'"));
  for (const client::ExplainStage& s : *stages) {
    std::cout << "=== " << s.name << (s.kernel.empty() ? "" : cat(" [", s.kernel, "]")) << "\n" << s.text;
    if (!s.text.empty() && s.text.back() != '\n') std::cout << "\n";
  }
  return kOk;
}

int cmd_stats(Context& c) {
  auto s = c.client.stats();
  if (!s.ok()) return failed(s.status());
  std::cout << "uopd at " << c.client.address() << ", compiler " << s->compiler_build_id << "\n"
            << "sessions " << s->sessions << ", buffers " << s->buffers << " (" << s->buffer_bytes << " bytes)\n"
            << "kernels compiled " << s->compiles << ", run " << s->kernels_run << "\n"
            << "worker executes: " << s->worker_executes_lane << " shared-memory lane, " << s->worker_executes_grpc
            << " gRPC\n"
            << "compile cache: hits " << s->cache_hits_memory << " memory, " << s->cache_hits_disk << " disk, "
            << s->cache_hits_redis << " redis; misses " << s->cache_misses << "; coalesced " << s->cache_coalesced
            << "; errors " << s->cache_errors << "\n"
            << "plan cache: hits " << s->plan_cache_hits << ", misses " << s->plan_cache_misses << "\n"
            << "compile pool: " << s->compile_tasks_running << " running, " << s->compile_queue_depth << " waiting; "
            << s->compiles_in_progress << " requests compiling\n"
            << "schedule search (" << s->search << "): " << s->searches << " searches, " << s->candidates_timed
            << " candidates timed; dropped " << s->candidates_dropped_compile << " compile, "
            << s->candidates_dropped_mismatch << " mismatch, " << s->candidates_dropped_crash << " crash, "
            << s->candidates_dropped_timeout << " timeout; leases " << s->leases_held_elsewhere
            << " held elsewhere, " << s->leases_lost << " lost\n"
            << "tuning records: found " << s->tuning_records_memory << " memory, " << s->tuning_records_disk << " disk, "
            << s->tuning_records_redis << " redis; missing " << s->tuning_record_misses << "; refused "
            << s->tuning_record_errors << "; written " << s->tuning_records_written << "\n"
            << "workers: " << s->workers.size() << "\n";
  for (const client::WorkerStatus& w : s->workers) {
    std::cout << "  " << w.id << "  " << w.device << "  " << w.state;
    if (!w.address.empty()) std::cout << "  " << w.address;
    if (w.pid) std::cout << "  pid " << w.pid;
    std::cout << "  restarts " << w.restarts << "\n";
    if (!w.last_error.empty()) std::cout << "    last error: " << w.last_error << "\n";
  }
  return kOk;
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

int run(int argc, char** argv) {
  auto args = tool().parse(argc, argv);
  if (!args.ok()) return tool().usage_error(args.status());
  const Args& a = *args;
  if (a.help) {
    std::cout << tool().help(a.command);
    return kOk;
  }
  if (a.command.empty()) {
    std::cerr << tool().help();
    return kUsage;
  }
#ifdef UOP_WITH_ONNX
  if (onnx_import::is_onnx_command(a)) return onnx_import::onnx_command(a, self_exe());
#endif
  if (a.on("embedded") && a.has("server")) return usage_error("--embedded and --server exclude each other");
  auto client_options = cli::client_options(a, std::getenv("UOPD_TOKEN"));
  if (!client_options.ok()) return usage_error(std::string(client_options.status().message()));
  client::ClientOptions options = *client_options;
  if (a.has("target") && !client::parse_target(a.get("target")).ok())
    return usage_error(std::string(client::parse_target(a.get("target")).status().message()));

  // Everything local first: a bad file or option fails before any server is involved.
  int rc = kOk;
  std::optional<DecodedGraph> graph;
  std::optional<RunPlan> plan;
  if (a.command != "stats") {
#ifdef UOP_WITH_ONNX
    if (onnx_import::is_onnx_graph_command(a)) {
      auto imported = onnx_import::import_graph(a);
      if (!imported.ok()) return invalid(std::string(imported.status().message()));
      graph = std::move(*imported);
    }
#endif
    if (!graph) graph = load(a.positional[0], &rc);
    if (!graph) return rc;
  }
  if (a.command == "run" || a.command == "bench") {
    plan = plan_run(a, *graph, &rc);
    if (!plan) return rc;
  }

  // Declared before the client, so the client (and its sessions) go first and the
  // embedded server stops after they have said goodbye.
  std::unique_ptr<client::EmbeddedServer> embedded;
  if (a.on("embedded")) {
    auto path = client::find_uopd(a.get("uopd"), self_exe(), std::getenv("PATH"));
    if (!path.ok()) return invalid(std::string(path.status().message()));
    auto started = client::EmbeddedServer::start(*path);
    if (!started.ok()) return failed(started.status());
    embedded = std::move(*started);
    options.address = embedded->address();
  } else {
    options.address = cli::server_address(a, std::getenv("UOPD_ADDRESS"));
  }
  {
    auto conn = client::Client::connect(options);
    if (!conn.ok()) {
      rc = failed(conn.status());
    } else {
      Context c{a, graph ? &*graph : nullptr, **conn};
      if (a.command == "run") rc = cmd_run(c, *plan);
      else if (a.command == "bench") rc = cmd_bench(c, *plan);
      else if (a.command == "compile") rc = cmd_compile(c);
      else if (a.command == "explain") rc = cmd_explain(c);
      else if (a.command == "tune") rc = cli::tune_graph(c.client, c.graph->root, c.graph->names, a, a.positional[0], std::cout);
      else rc = cmd_stats(c);
    }
    bool users_fault = last_failure == absl::StatusCode::kOk || last_failure == absl::StatusCode::kInvalidArgument ||
                       last_failure == absl::StatusCode::kNotFound || last_failure == absl::StatusCode::kOutOfRange;
    if (rc != kOk && embedded && !users_fault) {
      std::string log = embedded->log_tail();
      if (!log.empty()) std::cerr << "uop: the embedded uopd's log ends:\n" << log << "\n";
    }
  }
  if (embedded)
    if (absl::Status s = embedded->stop(); !s.ok()) std::cerr << "uop: warning: embedded uopd: " << s.message() << "\n";
  return rc;
}

}  // namespace
}  // namespace uop

int main(int argc, char** argv) { return uop::run(argc, argv); }
