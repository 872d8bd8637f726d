// Running an imported ONNX model (importer.h) and the ONNX backend-test cases: a case
// directory in the standard layout (model.onnx, test_data_set_*/input_*.pb and
// output_*.pb) is imported once per data set, run, and compared with the expected outputs
// at the backend tests' default tolerances (rtol 1e-3, atol 1e-7; ints and bools exact).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "compiler/onnx/importer.h"
#include "compiler/interp/host_tensor.h"

namespace uop::onnx_import {

// Something that runs an imported model and gives its outputs in the model's order.
using Executor = std::function<absl::StatusOr<std::vector<HostTensor>>(const ImportedModel&)>;

// Through a session of uopd: inputs over 1 MiB are uploaded as buffers first, outputs are
// kept in the session and downloaded. With `profile`, the run is profiled and its
// kernels' rows (RunResult::profile) land there.
absl::StatusOr<std::vector<HostTensor>> run_on_session(client::Session& s, const ImportedModel& m,
                                                       std::vector<client::KernelProfile>* profile = nullptr);
// Through the reference interpreter in this process (slow; for checking the importer).
absl::StatusOr<std::vector<HostTensor>> run_interpreted(const ImportedModel& m);

absl::StatusOr<std::string> read_file(const std::string& path);

enum class Verdict { Pass, Fail, Unsupported };
std::string_view verdict_name(Verdict v);  // "PASS", "FAIL", "UNSUPPORTED"

struct CaseResult {
  std::string name;  // the directory's last component
  Verdict verdict = Verdict::Fail;
  std::string reason;                 // empty for a pass
  std::vector<std::string> op_types;  // the model's operators (for per-op counts)
};

// The ONNX backend tests' default tolerance.
Tolerance onnx_tolerance();

// Runs every data set of the case. UNSUPPORTED when the importer refuses the model or a
// tensor type (UNIMPLEMENTED), FAIL for anything else that goes wrong or differs.
CaseResult run_case(const std::string& dir, const Executor& run);

}  // namespace uop::onnx_import
