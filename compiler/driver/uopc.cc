// uopc: the offline compiler driver. Reads a graph (`.json` or `.uopb`) and prints,
// verifies, digests, simplifies, converts, explains, compiles or runs it. Everything it
// does is in the compiler library; this file parses arguments and formats results.
//
// Exit codes: 0 ok, 1 invalid input (the graph, a file, or --check found a difference),
// 2 usage.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "compiler/backend.h"
#include "compiler/explain.h"
#include "compiler/interp/interp.h"
#include "compiler/interp/npy.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verifier.h"
#include "compiler/passes/symbolic.h"
#include "compiler/pipeline.h"
#include "compiler/support/flags.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"
#include "local/local_runner.h"

namespace uop {
namespace {

constexpr int kOk = 0, kInvalid = 1, kUsage = 2;

// Every command with its options; `uopc help` is generated from these.
flags::Tool uopc_flags() {
  flags::Tool t("uopc", "uopc: the UOp graph compiler, offline.",
                "Inputs and outputs are named by the graph's `names` (a BUFFER or PARAM for inputs, an output of the "
                "root SINK or a PARAM for outputs). Every command verifies its input first.\n"
                "Exit status: 0 ok, 1 invalid input or --check mismatch, 2 usage.");
  t.common().describe("GRAPH is a graph file: protobuf JSON (*.json) or binary (*.uopb), see proto/uop.proto.");
  t.common().flag("allow-custom", "accept CUSTOM / CUSTOMI / CUSTOM_FUNCTION (inline code)");
  t.command("print", "print the graph as a tree ([index] OP(arg) : dtype)").positional("GRAPH");
  t.command("verify", "check the graph against the rules of its stage")
      .positional("GRAPH")
      .choice("stage", {"tensor", "kernel", "linear"}, "verify as this IR level instead of detecting it");
  t.command("digest", "print the structural digest (SHA-256) of the root").positional("GRAPH");
  t.command("simplify", "apply the symbolic rules (constant folding, identities, index arithmetic) and print the result")
      .positional("GRAPH")
      .string("o", "OUT", "also write the result to OUT");
  t.command("convert", "re-encode GRAPH as OUT (format from OUT's extension)").positional("GRAPH").positional("OUT");
  flags::Command& explain = t.command("explain", "print the IR after each stage of the pipeline (`uopc help` lists the stages)")
                                .positional("GRAPH");
  explain.string("stage", "NAME", "only this pipeline stage");
  explain.string("backend", "NAME", "lower and compile for this target: cpu (the default) or cuda");
  explain.string("arch", "ARCH", "the target's arch (cuda: sm_80, sm_90, ...; cpu: host)");
  flags::Command& compile =
      t.command("compile", "compile every kernel for a target (this CPU by default): name, digest, time, ABI").positional("GRAPH");
  compile.string("backend", "NAME", "compile for this target: cpu (the default) or cuda");
  compile.string("arch", "ARCH", "the target's arch (cuda: sm_80, sm_90, ...; cpu: host)");
  compile.string("schedule", "[DIGEST=]TEXT",
                 "compile the kernel whose digest starts with DIGEST (without one: the graph's only kernel) with this "
                 "loop schedule, e.g. split(1,8,upcast);thread(0), instead of the target's heuristic");
  flags::Command& run = t.command("run", "compile and run on this CPU").positional("GRAPH");
  run.string("in", "NAME=FILE.npy", "bind the input called NAME").repeatable();
  run.string("random", "SEED", "fill unbound inputs with seeded random values");
  run.string("out", "NAME=FILE.npy", "write the output called NAME; without any, outputs are summarized on stdout")
      .repeatable();
  run.flag("check", "also run the reference interpreter and exit 1 if any output differs beyond the dtype's tolerance");
  return t;
}

const flags::Tool& tool() {
  static const flags::Tool t = uopc_flags();
  return t;
}

int usage_error(const std::string& msg) { return tool().usage_error(msg); }
int invalid(const std::string& msg) {
  std::cerr << "uopc: " << msg << "\n";
  return kInvalid;
}

using flags::Args;

// Reads and verifies a graph file; prints the error and sets *rc on failure.
std::optional<DecodedGraph> load(const std::string& path, const Args& a, int* rc) {
  auto g = read_graph_file(path);
  if (!g.ok()) {
    *rc = invalid(std::string(g.status().message()));
    return std::nullopt;
  }
  VerifyOptions opts;
  opts.index = &g->index;
  opts.allow_custom = a.on("allow-custom");
  std::string st = a.command == "verify" ? a.get("stage") : "";
  if (st == "tensor") opts.stage = Stage::Tensor;
  else if (st == "kernel") opts.stage = Stage::Kernel;
  else if (st == "linear") opts.stage = Stage::Linear;
  else if (!st.empty() && a.command == "verify") {
    *rc = usage_error(cat("unknown stage '", st, "' (tensor, kernel or linear)"));
    return std::nullopt;
  }
  if (absl::Status s = verify(*g->graph, g->root, opts); !s.ok()) {
    *rc = invalid(cat(path, ": ", s.message()));
    return std::nullopt;
  }
  return std::move(*g);
}

PipelineOptions pipeline_options(const Args& a, const DecodedGraph& g) {
  PipelineOptions o;
  o.allow_custom = a.on("allow-custom");
  o.index = &g.index;
  return o;
}

int cmd_print(const Args& a, DecodedGraph& g) {
  NodeNames names;
  for (auto& [n, u] : g.names) names[u] = n;
  std::cout << print_tree(g.root, &g.index, &names);
  return kOk;
}

int cmd_verify(const Args& a, DecodedGraph& g) {
  Stage st = detect_stage(g.root);
  std::string s = a.get("stage");
  if (!s.empty()) st = s == "tensor" ? Stage::Tensor : s == "kernel" ? Stage::Kernel : Stage::Linear;
  std::cout << a.positional[0] << ": ok (" << stage_name(st) << " level, " << toposort(g.root).size()
            << " nodes, digest " << g.root->digest().short_hex() << ")\n";
  return kOk;
}

int cmd_digest(const Args&, DecodedGraph& g) {
  std::cout << g.root->digest().hex() << "\n";
  return kOk;
}

int cmd_simplify(const Args& a, DecodedGraph& g) {
  size_t before = toposort(g.root).size();
  auto r = simplify(*g.graph, g.root);
  if (!r.ok()) return invalid(std::string(r.status().message()));
  std::cout << print_tree(*r);
  std::cout << "# " << before << " -> " << toposort(*r).size() << " nodes, digest " << (*r)->digest().short_hex() << "\n";
  if (a.has("o")) {
    // Names follow their nodes where the node survived the rewrite.
    auto live = index_by_toposort(*r);
    Names names;
    for (auto& [n, u] : g.names)
      if (live.contains(u)) names.emplace_back(n, u);
    if (absl::Status s = write_graph_file(a.get("o"), *r, names); !s.ok()) return invalid(std::string(s.message()));
  }
  return kOk;
}

int cmd_convert(const Args& a, DecodedGraph& g) {
  if (absl::Status s = write_graph_file(a.positional[1], g.root, g.names); !s.ok()) return invalid(std::string(s.message()));
  return kOk;
}

// A LINEAR reads best as a numbered list of ops with their sources.
// The target --backend / --arch name (the CPU of this machine by default).
absl::StatusOr<std::shared_ptr<const Backend>> backend_of(const Args& a) {
  return make_backend(a.get("backend"), a.get("arch"));
}

int cmd_explain(const Args& a, DecodedGraph& g) {
  if (absl::Status s = check_stage_name(a.get("stage")); !s.ok()) return usage_error(std::string(s.message()));
  auto backend = backend_of(a);
  if (!backend.ok()) return usage_error(std::string(backend.status().message()));
  auto stages = explain(*g.graph, g.root, **backend, pipeline_options(a, g), a.get("stage"));
  if (!stages.ok()) return invalid(std::string(stages.status().message()));
  for (const ExplainedStage& s : *stages) {
    std::cout << "=== " << s.name << (s.kernel.empty() ? "" : cat(" [", s.kernel, "]")) << "\n" << s.text;
    if (!s.text.empty() && s.text.back() != '\n') std::cout << "\n";
  }
  return kOk;
}

int cmd_compile(const Args& a, DecodedGraph& g) {
  auto backend = backend_of(a);
  if (!backend.ok()) return usage_error(std::string(backend.status().message()));
  const Backend& b = **backend;
  if (absl::Status s = b.available(); !s.ok()) return invalid(cat("target ", b.name(), ": ", s.message()));
  auto plan = plan_graph(*g.graph, g.root, pipeline_options(a, g));
  if (!plan.ok()) return invalid(std::string(plan.status().message()));
  std::cout << "target " << b.target_id() << ", " << b.build_id() << "\n";
  // --schedule: a schedule's text has no '=', so what comes before one is a digest.
  std::string sched_digest, sched_text;
  if (a.has("schedule")) {
    const std::string& v = a.get("schedule");
    size_t eq = v.find('=');
    sched_text = eq == std::string::npos ? v : v.substr(eq + 1);
    sched_digest = eq == std::string::npos ? "" : v.substr(0, eq);
    absl::flat_hash_set<Digest> kernels;
    for (const KernelPlan& k : plan->kernels) kernels.insert(k.kernel->digest());
    if (sched_digest.empty() && kernels.size() != 1)
      return usage_error(cat("--schedule without a digest needs a graph of one kernel; this one has ", kernels.size()));
    if (std::none_of(kernels.begin(), kernels.end(), [&](const Digest& d) { return d.hex().starts_with(sched_digest); }))
      return usage_error(cat("--schedule: the graph has no kernel whose digest starts with '", sched_digest, "'"));
  }
  absl::flat_hash_map<Digest, std::string> seen;
  for (const KernelPlan& k : plan->kernels) {
    Digest d = k.kernel->digest();
    std::cout << k.name << "  " << d.short_hex(16);
    if (auto it = seen.find(d); it != seen.end()) {
      std::cout << "  (same kernel as " << it->second << ")\n";
      continue;
    }
    seen.emplace(d, k.name);
    auto t0 = std::chrono::steady_clock::now();
    PipelineOptions po = pipeline_options(a, g);
    std::string applied;
    if (a.has("schedule") && d.hex().starts_with(sched_digest)) po.schedule = sched_text;
    po.applied_schedule = &applied;
    auto linear = b.lower(*g.graph, k.kernel, po, k.name);
    if (!linear.ok()) return invalid(std::string(linear.status().message()));
    auto art = b.compile(*linear);
    if (!art.ok()) return invalid(std::string(art.status().message()));
    art->abi.schedule = applied;
    double ms = ms_since(t0);
    std::cout << cat("  ", ms, " ms, ", art->object.size(), " bytes\n") << abi_text(art->abi);
  }
  return kOk;
}

// NAME=FILE pairs of a repeatable option.
std::optional<std::vector<std::pair<std::string, std::string>>> pairs(const Args& a, const std::string& opt, std::string* err) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& v : a.all(opt)) {
    auto eq = v.find('=');
    if (eq == std::string::npos || eq == 0) { *err = cat("--", opt, " takes NAME=FILE.npy, got '", v, "'"); return std::nullopt; }
    out.emplace_back(v.substr(0, eq), v.substr(eq + 1));
  }
  return out;
}

int cmd_run(const Args& a, DecodedGraph& g) {
  std::string err;
  auto ins = pairs(a, "in", &err);
  auto outs = pairs(a, "out", &err);
  if (!ins || !outs) return usage_error(err);
  std::optional<uint64_t> seed;
  if (a.has("random")) {
    try { seed = std::stoull(a.get("random")); } catch (...) { return usage_error("--random takes a number"); }
  }
  Stage stage = detect_stage(g.root);
  Op input_op = stage == Stage::Kernel ? Op::PARAM : Op::BUFFER;
  std::map<std::string, const UOp*> by_name;
  for (auto& [n, u] : g.names) by_name[n] = u;
  NodeNames label;
  for (auto& [n, u] : g.names) label[u] = n;

  absl::flat_hash_map<const UOp*, HostTensor> inputs;
  for (auto& [name, file] : *ins) {
    auto it = by_name.find(name);
    if (it == by_name.end() || it->second->op() != input_op)
      return usage_error(cat("the graph has no input named '", name, "' (inputs are named ", op_name(input_op), "s)"));
    auto t = read_npy(file);
    if (!t.ok()) return invalid(std::string(t.status().message()));
    inputs[it->second] = std::move(*t);
  }
  // Every input left unbound: random with --random, else an error (kernel-level outputs
  // are PARAMs too: those nobody reads start at zero).
  uint64_t k = 0;
  for (const UOp* u : toposort(g.root)) {
    if (u->op() != input_op || inputs.contains(u)) continue;
    bool read_only = true;
    if (stage == Stage::Kernel) {
      for (const UOp* v : toposort(g.root))
        if (v->op() == Op::STORE && v->src(0)->src(0) == u) read_only = false;
      if (!read_only) continue;
    }
    DType dt = u->op() == Op::PARAM ? u->dtype().pointee() : u->dtype();
    int64_t n = u->op() == Op::PARAM ? u->arg_as<ParamArg>().size : u->arg_as<BufferArg>().size;
    if (!seed) {
      std::string name = label.contains(u) ? label[u] : print_node(u, &g.index);
      return usage_error(cat("input ", name, " is not bound: give --in ", label.contains(u) ? label[u] : "NAME", "=FILE.npy or --random SEED"));
    }
    inputs[u] = HostTensor::random(dt.scalar, {n}, *seed + k++);
  }
  // Shapes of .npy inputs do not matter, only their element count (a BUFFER is 1-D).
  for (auto& [u, t] : inputs) t.shape = {t.numel()};

  LocalRunner runner;
  std::vector<KernelReport> report;
  auto got = runner.run(*g.graph, g.root, inputs, &report, pipeline_options(a, g));
  if (!got.ok()) return invalid(std::string(got.status().message()));
  for (const KernelReport& r : report)
    std::cerr << cat("kernel ", r.name, " ", r.digest.short_hex(), r.compiled ? cat(": compiled in ", r.lower_ms + r.compile_ms, " ms") : std::string(": cached"), "\n");

  // The outputs and their names.
  std::vector<std::string> out_names;
  std::vector<const UOp*> out_nodes;
  if (stage == Stage::Kernel) {
    std::vector<const UOp*> params;
    for (const UOp* u : toposort(g.root))
      if (u->op() == Op::PARAM) params.push_back(u);
    std::sort(params.begin(), params.end(), [](const UOp* x, const UOp* y) { return x->arg_as<ParamArg>().slot < y->arg_as<ParamArg>().slot; });
    out_nodes = params;
  } else {
    out_nodes.assign(g.root->src().begin(), g.root->src().end());
  }
  for (size_t i = 0; i < out_nodes.size(); ++i)
    out_names.push_back(label.contains(out_nodes[i]) ? label[out_nodes[i]] : cat("out", i));

  int rc = kOk;
  if (a.on("check")) {
    std::vector<HostTensor> want;
    if (stage == Stage::Kernel) {
      std::vector<HostTensor> bufs;
      for (const UOp* p : out_nodes) {
        auto it = inputs.find(p);
        bufs.push_back(it != inputs.end() ? it->second : HostTensor::zeros(p->dtype().scalar, {p->arg_as<ParamArg>().size}));
      }
      std::vector<HostTensor*> ptrs;
      for (auto& b : bufs) ptrs.push_back(&b);
      absl::flat_hash_map<std::string, int64_t> vars;
      if (absl::Status s = interpret_kernel(g.root, ptrs, vars); !s.ok()) return invalid(cat("interpreter: ", s.message()));
      want = std::move(bufs);
    } else {
      auto w = interpret(*g.graph, g.root, inputs);
      if (!w.ok()) return invalid(cat("interpreter: ", w.status().message()));
      want = std::move(*w);
    }
    for (size_t i = 0; i < want.size(); ++i) {
      CompareResult c = compare(want[i], (*got)[i]);
      std::cout << "check " << out_names[i] << ": " << (c.ok ? "ok" : "MISMATCH") << "\n";
      if (!c.ok) {
        std::cout << c.message << "\n";
        rc = kInvalid;
      }
    }
  }
  std::map<std::string, std::string> out_files(outs->begin(), outs->end());
  for (auto& [name, file] : out_files)
    if (std::find(out_names.begin(), out_names.end(), name) == out_names.end())
      return usage_error(cat("the graph has no output named '", name, "' (outputs: ", join(out_names, ", "), ")"));
  for (size_t i = 0; i < out_names.size(); ++i) {
    if (auto it = out_files.find(out_names[i]); it != out_files.end()) {
      if (absl::Status s = write_npy(it->second, (*got)[i]); !s.ok()) return invalid(std::string(s.message()));
    } else if (out_files.empty()) {
      std::cout << out_names[i] << " = " << (*got)[i].str(12) << "\n";
    }
  }
  return rc;
}


int run(int argc, char** argv) {
  auto args = tool().parse(argc, argv);
  if (!args.ok()) return tool().usage_error(args.status());
  if (args->help) {
    std::cout << tool().help(args->command);
    if (args->command.empty() || args->command == "explain") {
      std::cout << "\nstages (explain --stage):\n";
      for (const StageInfo& s : pipeline_stages()) std::cout << "  " << s.name << ": " << s.what << "\n";
    }
    return kOk;
  }
  if (args->command.empty()) {
    std::cerr << tool().help();
    return kUsage;
  }
  // The tool checked the command and its arguments; each command's GRAPH comes first.
  using Run = std::function<int(const Args&, DecodedGraph&)>;
  static const std::map<std::string, Run> kCommands = {
      {"print", cmd_print},       {"verify", cmd_verify},   {"digest", cmd_digest}, {"simplify", cmd_simplify},
      {"convert", cmd_convert},   {"explain", cmd_explain}, {"compile", cmd_compile}, {"run", cmd_run},
  };
  int rc = kOk;
  auto g = load(args->positional[0], *args, &rc);
  if (!g) return rc;
  return kCommands.at(args->command)(*args, *g);
}

}  // namespace
}  // namespace uop

int main(int argc, char** argv) { return uop::run(argc, argv); }
