// Executors for imported models and the backend-test case runner of model_runner.h.
#include "client/onnx/model_runner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "compiler/onnx/tensor_proto.h"
#include "compiler/interp/interp.h"
#include "compiler/support/strings.h"
#include "compiler/onnx/import_context.h"

namespace uop::onnx_import {

namespace fs = std::filesystem;

namespace {
constexpr int64_t kInlineInputBytes = int64_t{1} << 20;
}

absl::StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(cat("cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::StatusOr<std::vector<HostTensor>> run_on_session(client::Session& s, const ImportedModel& m,
                                                       std::vector<client::KernelProfile>* profile) {
  std::vector<client::Input> inputs;
  for (const auto& [node, data] : m.bindings) {
    HostTensor flat = data;
    flat.shape = {flat.numel()};
    client::Input in;
    in.node = node;
    if (flat.nbytes() > kInlineInputBytes) {
      auto id = s.upload_tensor(flat);
      if (!id.ok()) return id.status();
      in.value = *id;
    } else {
      in.value = std::move(flat);
    }
    inputs.push_back(std::move(in));
  }
  auto r = s.run(m.root, m.names, inputs, /*keep_outputs=*/true, /*profile=*/profile != nullptr);
  if (!r.ok()) return r.status();
  if (profile) *profile = std::move(r->profile);
  if (r->outputs.size() != m.outputs.size())
    return absl::InternalError(cat("uopd returned ", r->outputs.size(), " outputs for ", m.outputs.size()));
  std::vector<HostTensor> out;
  for (const client::RunOutput& o : r->outputs) {
    auto t = o.kept() ? s.download_tensor(o) : absl::StatusOr<HostTensor>(o.tensor);
    if (!t.ok()) return t.status();
    out.push_back(std::move(*t));
    if (o.kept()) (void)s.free_buffer(o.buffer_id);
  }
  return out;
}

absl::StatusOr<std::vector<HostTensor>> run_interpreted(const ImportedModel& m) {
  absl::flat_hash_map<const UOp*, HostTensor> inputs;
  for (const auto& [node, data] : m.bindings) {
    HostTensor flat = data;
    flat.shape = {flat.numel()};
    inputs[node] = std::move(flat);
  }
  return interpret(*m.graph, m.root, inputs);
}

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "PASS";
    case Verdict::Fail: return "FAIL";
    case Verdict::Unsupported: return "UNSUPPORTED";
  }
  return "?";
}

Tolerance onnx_tolerance() { return Tolerance{1e-3, 1e-7, 0}; }

namespace {

// input_0.pb, input_1.pb, ... in numeric order.
std::vector<std::string> numbered(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<int, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) != 0 || n.size() < prefix.size() + 4 || n.substr(n.size() - 3) != ".pb") continue;
    std::string num = n.substr(prefix.size(), n.size() - prefix.size() - 3);
    if (num.empty() || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    found.emplace_back(std::stoi(num), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [i, p] : found) out.push_back(p);
  return out;
}

CaseResult fail(CaseResult r, Verdict v, std::string why) {
  r.verdict = v;
  r.reason = std::move(why);
  return r;
}

Verdict verdict_for(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnimplemented ? Verdict::Unsupported : Verdict::Fail;
}

}  // namespace

CaseResult run_case(const std::string& dir, const Executor& run) {
  CaseResult r;
  fs::path d(dir);
  r.name = d.filename().string();
  if (r.name.empty()) r.name = d.parent_path().filename().string();
  auto model = read_file((d / "model.onnx").string());
  if (!model.ok()) return fail(r, Verdict::Fail, std::string(model.status().message()));
  if (auto ops = operator_types(*model); ops.ok()) r.op_types = *ops;
  auto unsupported = unsupported_operators(*model);
  if (!unsupported.ok()) return fail(r, Verdict::Fail, std::string(unsupported.status().message()));
  if (!unsupported->empty())
    return fail(r, Verdict::Unsupported, cat("unsupported operator", unsupported->size() > 1 ? "s" : "", ": ", join(*unsupported, ", ")));
  auto declared = model_inputs(*model);
  if (!declared.ok()) return fail(r, Verdict::Fail, std::string(declared.status().message()));

  for (const ModelInput& in : *declared)
    if (!in.dtype) return fail(r, Verdict::Unsupported, cat("model input '", in.name, "' is not a tensor of a supported type"));
  std::vector<fs::path> sets;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(d, ec))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return fail(r, Verdict::Fail, "no test_data_set_* directory");

  for (const fs::path& set : sets) {
    std::string where = sets.size() > 1 ? cat(set.filename().string(), ": ") : "";
    std::map<std::string, HostTensor> inputs;
    std::vector<std::string> in_files = numbered(set, "input_");
    for (size_t i = 0; i < in_files.size(); ++i) {
      auto t = read_tensor_proto(in_files[i]);
      if (!t.ok()) return fail(r, verdict_for(t.status()), cat(where, t.status().message()));
      // Inputs are matched by position (the files' names are optional in the format).
      if (i >= declared->size()) return fail(r, Verdict::Fail, cat(where, "more input files than model inputs"));
      // The test data stores bfloat16 tensors as their uint16 bit patterns.
      if (t->tensor.dtype == Scalar::UInt16 && (*declared)[i].dtype == Scalar::BFloat16) t->tensor.dtype = Scalar::BFloat16;
      inputs[(*declared)[i].name] = std::move(t->tensor);
    }
    auto imported = import_model(*model, inputs);
    if (!imported.ok()) return fail(r, verdict_for(imported.status()), cat(where, imported.status().message()));
    std::vector<std::string> out_files = numbered(set, "output_");
    if (out_files.size() != imported->outputs.size())
      return fail(r, Verdict::Fail, cat(where, out_files.size(), " expected outputs for ", imported->outputs.size(), " model outputs"));
    std::vector<HostTensor> expected;
    for (const std::string& f : out_files) {
      auto t = read_tensor_proto(f);
      if (!t.ok()) return fail(r, verdict_for(t.status()), cat(where, t.status().message()));
      expected.push_back(std::move(t->tensor));
    }
    auto got = run(*imported);
    if (!got.ok()) return fail(r, Verdict::Fail, cat(where, absl::StatusCodeToString(got.status().code()), ": ", got.status().message()));
    for (size_t i = 0; i < expected.size(); ++i) {
      HostTensor g = (*got)[i];
      const std::string& name = imported->outputs[i].name;
      if (g.dtype == Scalar::BFloat16 && expected[i].dtype == Scalar::UInt16) g.dtype = Scalar::UInt16;  // as above
      if (g.dtype != expected[i].dtype)
        return fail(r, Verdict::Fail, cat(where, "output '", name, "' is ", scalar_name(g.dtype), ", expected ", scalar_name(expected[i].dtype)));
      const Dims& shape = imported->outputs[i].shape;
      if (shape != expected[i].shape)
        return fail(r, Verdict::Fail, cat(where, "output '", name, "' has shape ", shape_str(shape), ", expected ", shape_str(expected[i].shape)));
      if (g.numel() != expected[i].numel())
        return fail(r, Verdict::Fail, cat(where, "output '", name, "' came back with ", g.numel(), " elements"));
      g.shape = shape;
      CompareResult cr = compare(expected[i], g, onnx_tolerance());
      if (!cr.ok) return fail(r, Verdict::Fail, cat(where, "output '", name, "': ", cr.message));
    }
  }
  r.verdict = Verdict::Pass;
  return r;
}

}  // namespace uop::onnx_import
