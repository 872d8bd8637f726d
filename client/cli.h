// The pieces of the `uop` command that are not about talking to the server: argument
// parsing (uopc's conventions: `--name=value` or `--name value`, repeatable options, a
// command and positional files), the server address, and the names of files it writes.
// Apart from uop_main.cc so that tests reach them without a server.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace uop::cli {

// Exit codes, as uopc: 0 ok, 1 invalid input or a failure, 2 usage.
inline constexpr int kOk = 0, kInvalid = 1, kUsage = 2;

struct Args {
  std::string command;
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> options;  // name without "--" -> every value given
  bool has(const std::string& k) const { return options.count(k) > 0; }
  std::string get(const std::string& k) const { return has(k) ? options.at(k).back() : ""; }
};

struct OptionSpec {
  std::set<std::string> valued;  // take a value: --name=value or --name value
  std::set<std::string> flags;   // take none
};

// argv without the program name. `-h` is `--help`. INVALID_ARGUMENT with the message for
// the user (an unknown option, a missing value); the caller turns it into exit code 2.
absl::StatusOr<Args> parse_args(const std::vector<std::string>& argv, const OptionSpec& spec);

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

}  // namespace uop::cli
