// `uop run MODEL.onnx` and `uop onnx-test`: see onnx_cli.h.
#include "client/onnx/onnx_cli.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "client/embedded_server.h"
#include "compiler/onnx/importer.h"
#include "client/onnx/model_runner.h"
#include "compiler/interp/npy.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop::onnx_import {

namespace {

using cli::kInvalid;
using cli::kOk;
using cli::kUsage;

int usage_error(const std::string& msg) {
  std::cerr << "uop: " << msg << "\nrun 'uop help' for usage\n";
  return kUsage;
}
int invalid(const std::string& msg) {
  std::cerr << "uop: " << msg << "\n";
  return kInvalid;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The server connection of one command: an embedded uopd (declared first, so it stops
// after the client and session are gone) or the one --server / UOPD_ADDRESS names.
struct Service {
  std::unique_ptr<client::EmbeddedServer> embedded;
  std::unique_ptr<client::Client> client;
  std::optional<client::Session> session;

  ~Service() {
    session.reset();
    client.reset();
    if (embedded)
      if (absl::Status s = embedded->stop(); !s.ok()) std::cerr << "uop: warning: embedded uopd: " << s.message() << "\n";
  }
};

absl::Status connect(const cli::Args& a, const std::string& self_exe, Service& svc) {
  ASSIGN_OR_RETURN(client::ClientOptions options, cli::client_options(a, std::getenv("UOPD_TOKEN")));
  if (a.on("embedded")) {
    auto path = client::find_uopd(a.get("uopd"), self_exe, std::getenv("PATH"));
    if (!path.ok()) return path.status();
    // No disk cache: a private server for one command leaves nothing behind.
    auto started = client::EmbeddedServer::start(*path, {"--cache-dir="});
    if (!started.ok()) return started.status();
    svc.embedded = std::move(*started);
    options.address = svc.embedded->address();
  } else {
    options.address = cli::server_address(a, std::getenv("UOPD_ADDRESS"));
  }
  auto conn = client::Client::connect(options);
  if (!conn.ok()) return conn.status();
  svc.client = std::move(*conn);
  std::vector<std::string> devices;
  if (a.has("device")) devices.push_back(a.get("device"));
  auto session = svc.client->create_session(devices);
  if (!session.ok()) return session.status();
  svc.session.emplace(std::move(*session));
  return absl::OkStatus();
}

std::string message(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kInvalidArgument) return std::string(s.message());
  return cat(absl::StatusCodeToString(s.code()), ": ", s.message());
}

// The --in files of a model command, and the shapes they fix for LoadModel.
struct GivenInputs {
  std::map<std::string, HostTensor> tensors;
  std::map<std::string, std::vector<int64_t>> shapes;
};
absl::StatusOr<GivenInputs> read_inputs(const std::vector<std::pair<std::string, std::string>>& ins) {
  GivenInputs out;
  for (auto& [name, file] : ins) {
    ASSIGN_OR_RETURN(HostTensor t, read_npy(file));
    out.shapes[name] = t.shape;
    out.tensors[name] = std::move(t);
  }
  return out;
}

int run_model(const cli::Args& a, const std::string& self_exe) {
  const std::string& path = a.positional[0];
  auto ins = cli::name_file_pairs(a, "in");
  auto outs = cli::name_file_pairs(a, "out");
  if (!ins.ok() || !outs.ok()) return usage_error(std::string((ins.ok() ? outs.status() : ins.status()).message()));
  if (a.has("random")) return usage_error("--random is for UOp graphs; an ONNX model takes --in NAME=FILE.npy");
  auto model = read_file(path);
  if (!model.ok()) return invalid(std::string(model.status().message()));
  // The model is imported by uopd (LoadModel): its weights go up once, into the session,
  // and only the inputs travel with the run. Inputs fix the shapes it is imported for.
  auto given = read_inputs(*ins);
  if (!given.ok()) return invalid(std::string(given.status().message()));
  std::map<std::string, HostTensor>& inputs = given->tensors;
  Service svc;
  if (absl::Status s = connect(a, self_exe, svc); !s.ok()) return invalid(message(s));
  auto loaded = svc.session->load_model(*model, given->shapes);
  if (!loaded.ok()) return invalid(cat(path, ": ", message(loaded.status())));
  for (const client::ModelTensor& in : loaded->inputs)
    if (!inputs.contains(in.name)) return usage_error(cat("model input '", in.name, "' is not bound: give --in ", in.name, "=FILE.npy"));
  std::map<std::string, std::string> out_files;
  for (auto& [name, file] : *outs) {
    bool found = false;
    for (const auto& o : loaded->outputs) found |= o.name == name;
    if (!found) {
      std::vector<std::string> names;
      for (const auto& o : loaded->outputs) names.push_back(o.name);
      return usage_error(cat("the model has no output named '", name, "' (outputs: ", join(names, ", "), ")"));
    }
    out_files[name] = file;
  }
  std::vector<client::Input> bound;
  for (auto& [name, t] : inputs) bound.push_back({name, std::move(t)});
  const bool profile = a.has("profile");
  auto got = svc.session->run_model(loaded->id, bound, /*keep_outputs=*/false, profile);
  if (!got.ok()) return invalid(cat(path, ": ", message(got.status())));
  if (profile) std::cout << cli::profile_table(got->profile);
  for (size_t i = 0; i < got->outputs.size() && i < loaded->outputs.size(); ++i) {
    HostTensor t = std::move(got->outputs[i].tensor);
    t.shape = loaded->outputs[i].shape;
    const std::string& name = loaded->outputs[i].name;
    auto it = out_files.find(name);
    if (it != out_files.end()) {
      if (absl::Status s = write_npy(it->second, t); !s.ok()) return invalid(std::string(s.message()));
    } else if (out_files.empty()) {
      std::cout << name << " = " << t.str(12) << "\n";
    }
  }
  return kOk;
}

// `uop bench MODEL.onnx`: the model loaded into uopd once (its import and weights upload
// are the load time), inputs from --in or seeded random values of each input's shape,
// uploaded once when large; then RunModel --warmup and --iterations times.
int bench_model(const cli::Args& a, const std::string& self_exe) {
  const std::string& path = a.positional[0];
  auto ins = cli::name_file_pairs(a, "in");
  if (!ins.ok()) return usage_error(std::string(ins.status().message()));
  auto seed = cli::parse_seed(a.get("random"));
  if (!seed.ok()) return usage_error(std::string(seed.status().message()));
  auto model = read_file(path);
  if (!model.ok()) return invalid(std::string(model.status().message()));
  auto given = read_inputs(*ins);
  if (!given.ok()) return invalid(std::string(given.status().message()));
  Service svc;
  if (absl::Status s = connect(a, self_exe, svc); !s.ok()) return invalid(message(s));
  auto t0 = std::chrono::steady_clock::now();
  auto loaded = svc.session->load_model(*model, given->shapes);
  if (!loaded.ok()) return invalid(cat(path, ": ", message(loaded.status())));
  std::vector<client::Input> bound;
  uint64_t k = 0;
  for (const client::ModelTensor& in : loaded->inputs) {
    auto it = given->tensors.find(in.name);
    HostTensor t = it != given->tensors.end() ? std::move(it->second) : HostTensor::random(in.dtype, in.shape, *seed + k++);
    client::Input b{in.name, std::move(t)};
    // Large inputs go up once, as buffers, like the weights.
    if (std::get<HostTensor>(b.value).nbytes() > (int64_t{1} << 20)) {
      auto id = svc.session->upload_tensor(std::get<HostTensor>(b.value));
      if (!id.ok()) return invalid(message(id.status()));
      b.value = *id;
    }
    bound.push_back(std::move(b));
  }
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto samples = cli::bench_runs([&] { return svc.session->run_model(loaded->id, bound); }, a.integer("warmup"),
                                 a.integer("iterations"));
  if (!samples.ok()) return invalid(cat(path, ": ", message(samples.status())));
  std::cout << cli::bench_report(path, *samples, load_ms, a.on("json"));
  return kOk;
}

// `uop tune MODEL.onnx --in ...`: imported here (its graph is what the server plans; the
// weights stay here, the search runs on scratch buffers), then tuned kernel by kernel.
int tune_model(const cli::Args& a, const std::string& self_exe) {
  const std::string& path = a.positional[0];
  auto ins = cli::name_file_pairs(a, "in");
  if (!ins.ok()) return usage_error(std::string(ins.status().message()));
  auto bytes = read_file(path);
  if (!bytes.ok()) return invalid(std::string(bytes.status().message()));
  auto given = read_inputs(*ins);
  if (!given.ok()) return invalid(std::string(given.status().message()));
  auto model = import_model(*bytes, given->tensors);
  if (!model.ok()) return invalid(cat(path, ": ", message(model.status())));
  Service svc;
  if (absl::Status s = connect(a, self_exe, svc); !s.ok()) return invalid(message(s));
  return cli::tune_graph(*svc.client, model->root, model->names, a, path, std::cout);
}

absl::StatusOr<std::vector<std::string>> case_dirs(const cli::Args& a) {
  std::vector<std::string> dirs = a.positional;
  std::string root = a.get("root");
  if (a.has("cases-from")) {
    std::ifstream f(a.get("cases-from"));
    if (!f) return absl::NotFoundError(cat("cannot read ", a.get("cases-from")));
    std::string line;
    while (std::getline(f, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      dirs.push_back(root.empty() ? line : cat(root, "/", line));
    }
  } else if (!root.empty()) {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root, ec))
      if (e.is_directory()) found.push_back(e.path().string());
    if (ec) return absl::NotFoundError(cat("cannot list ", root, ": ", ec.message()));
    std::sort(found.begin(), found.end());
    dirs.insert(dirs.end(), found.begin(), found.end());
  }
  if (a.has("shard")) {
    std::string s = a.get("shard");
    size_t slash = s.find('/');
    int64_t i = -1, n = -1;
    if (slash != std::string::npos) {
      i = std::atoll(s.substr(0, slash).c_str());
      n = std::atoll(s.substr(slash + 1).c_str());
    }
    if (n <= 0 || i < 0 || i >= n) return absl::InvalidArgumentError(cat("--shard wants I/N with 0 <= I < N, not '", s, "'"));
    std::vector<std::string> mine;
    for (size_t k = 0; k < dirs.size(); ++k)
      if (static_cast<int64_t>(k) % n == i) mine.push_back(dirs[k]);
    dirs = std::move(mine);
  }
  return dirs;
}

int onnx_test(const cli::Args& a, const std::string& self_exe) {
  auto dirs = case_dirs(a);
  if (!dirs.ok()) return usage_error(std::string(dirs.status().message()));
  if (dirs->empty()) return usage_error("no cases: give CASE_DIR..., --cases-from LIST or --root DIR");
  Service svc;
  Executor exec;
  if (a.has("interp")) {
    exec = run_interpreted;
  } else {
    if (absl::Status s = connect(a, self_exe, svc); !s.ok()) return invalid(message(s));
    exec = [&svc](const ImportedModel& m) { return run_on_session(*svc.session, m); };
  }
  int64_t passed = 0, failed = 0, skipped = 0;
  // Per operator: cases that use it, and how they ended.
  std::map<std::string, std::array<int64_t, 3>> by_op;
  std::map<std::string, int64_t> unsupported_ops;
  for (const std::string& dir : *dirs) {
    CaseResult r = run_case(dir, exec);
    std::cout << verdict_name(r.verdict) << " " << r.name;
    if (!r.reason.empty()) {
      std::string reason = r.reason;
      for (char& ch : reason)
        if (ch == '\n') ch = ' ';
      if (reason.size() > 400) reason = cat(reason.substr(0, 400), "...");
      std::cout << ": " << reason;
    }
    std::cout << std::endl;
    int k = r.verdict == Verdict::Pass ? 0 : r.verdict == Verdict::Fail ? 1 : 2;
    (k == 0 ? passed : k == 1 ? failed : skipped)++;
    for (const std::string& op : r.op_types) by_op[op][k]++;
    if (r.verdict == Verdict::Unsupported && r.reason.rfind("unsupported operator", 0) == 0) {
      std::string list = r.reason.substr(r.reason.find(": ") + 2);
      size_t at = 0;
      while (at <= list.size()) {
        size_t comma = list.find(", ", at);
        unsupported_ops[list.substr(at, comma == std::string::npos ? std::string::npos : comma - at)]++;
        if (comma == std::string::npos) break;
        at = comma + 2;
      }
    }
  }
  if (a.has("by-op")) {
    std::cout << "\nby operator (cases using it: passed / failed / unsupported):\n";
    for (auto& [op, n] : by_op) std::cout << "  " << op << " " << n[0] << " / " << n[1] << " / " << n[2] << "\n";
    std::cout << "operators without a handler (cases):";
    for (auto& [op, n] : unsupported_ops) std::cout << " " << op << " (" << n << ")";
    std::cout << "\n\n";
  }
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped" << std::endl;
  return failed == 0 ? kOk : kInvalid;
}

}  // namespace

bool is_onnx_command(const cli::Args& a) {
  if (a.command == "onnx-test") return true;
  return (a.command == "run" || a.command == "bench" || a.command == "tune") && a.positional.size() == 1 &&
         ends_with(a.positional[0], ".onnx");
}

bool is_onnx_graph_command(const cli::Args& a) {
  return (a.command == "compile" || a.command == "explain") && a.positional.size() == 1 &&
         ends_with(a.positional[0], ".onnx");
}

absl::StatusOr<DecodedGraph> import_graph(const cli::Args& a) {
  const std::string& path = a.positional[0];
  ASSIGN_OR_RETURN(auto ins, cli::name_file_pairs(a, "in"));
  ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  ASSIGN_OR_RETURN(GivenInputs given, read_inputs(ins));
  // As uopd imports a model it holds (LoadModel): for the shapes alone, so the graph is
  // the one `uop run` runs.
  auto model = import_for_shapes(bytes, given.shapes);
  if (!model.ok()) return absl::Status(model.status().code(), cat(path, ": ", message(model.status())));
  DecodedGraph g;
  g.graph = std::move(model->graph);
  g.root = model->root;
  g.names = std::move(model->names);
  return g;
}

int onnx_command(const cli::Args& a, const std::string& self_exe) {
  if (a.on("embedded") && a.has("server")) return usage_error("--embedded and --server exclude each other");
  if (a.command == "onnx-test") return onnx_test(a, self_exe);
  if (a.command == "bench") return bench_model(a, self_exe);
  if (a.command == "tune") return tune_model(a, self_exe);
  return run_model(a, self_exe);
}

}  // namespace uop::onnx_import
