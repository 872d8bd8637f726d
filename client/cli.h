// The pieces of the `uop` command that are not about talking to the server: its command
// line (declared with compiler/support/flags.h), the connection options and server address
// it gives, and the names of files it writes.
// Apart from uop_main.cc so that tests reach them without a server.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "compiler/support/flags.h"

namespace uop::cli {

// Exit codes, as uopc: 0 ok, 1 invalid input or a failure, 2 usage.
inline constexpr int kOk = 0, kInvalid = 1, kUsage = 2;

using flags::Args;

// The command line of `uop`: every command with its options and help. `onnx`: with the
// ONNX verbs (run MODEL.onnx takes run's options; onnx-test its own).
flags::Tool uop_flags(bool onnx);

// `uop bench`: one run as timed here (wall) and as the server accounts it.
struct BenchSample {
  double wall_ms = 0, plan_ms = 0, compile_ms = 0, run_ms = 0, collective_ms = 0;
};
// `run` `warmup` times untimed, then `iterations` times, timed; the first failure stops it.
absl::StatusOr<std::vector<BenchSample>> bench_runs(const std::function<absl::StatusOr<client::RunResult>()>& run,
                                                     int64_t warmup, int64_t iterations);
// min / p50 / p99 / mean latency, runs per second, and the mean of each part: plan,
// compile (with the cache lookups), worker kernels and transfers (run_ms), collectives,
// and what is left: the client and the RPC. One JSON object with `json`.
std::string bench_report(const std::string& what, const std::vector<BenchSample>& samples, double load_ms, bool json);

// What the connection options say (--deadline, --token or $UOPD_TOKEN, --tls*); the address
// is the caller's (server_address, or an embedded server's). INVALID_ARGUMENT for the user.
absl::StatusOr<client::ClientOptions> client_options(const Args& a, const char* token_env);

// The NAME=FILE values of a repeatable option, in order.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> name_file_pairs(const Args& a, const std::string& opt);

absl::StatusOr<uint64_t> parse_seed(std::string_view text);         // --random
absl::StatusOr<absl::Duration> parse_seconds(std::string_view text); // --deadline: "60", "0.5"

// --server when given, else the UOPD_ADDRESS environment value when set and not empty,
// else client::kDefaultAddress.
std::string server_address(const Args& a, const char* env_value);

// A kernel name as a file name: letters, digits, '_', '-' and '.' kept, anything else
// '_'; never empty, never "." or "..".
std::string file_name_for(std::string_view kernel_name);
// What a compiled kernel's binary and source are called on disk for this target:
// cpu ".o" / ".ll", cuda ".cubin" / ".cu".
std::string_view binary_extension(const client::Target& t);
std::string_view source_extension(const client::Target& t);

// `uop run --profile`'s table, in the order given (the server's: slowest first): kernel,
// launches, total ms, per-launch ms, GFLOPS, GB/s and its schedule, one row per kernel;
// a rate without an estimate is "-".
std::string profile_table(const std::vector<client::KernelProfile>& profile);

// `uop tune`: the graph compiled, then each kernel tuned by the server in turn (--width,
// --budget), a line of progress each: its time before / after, candidates timed and
// dropped, the schedule kept; then the totals. 0, or 1 after printing why not.
int tune_graph(client::Client& client, const UOp* root, const Names& names, const Args& a, const std::string& path,
               std::ostream& out);

}  // namespace uop::cli
