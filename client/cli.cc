// Argument parsing and naming for the `uop` command; see cli.h.
#include "client/cli.h"

#include "absl/strings/numbers.h"
#include "compiler/support/strings.h"

namespace uop::cli {

absl::StatusOr<Args> parse_args(const std::vector<std::string>& argv, const OptionSpec& spec) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string s = argv[i];
    if (s == "-h") s = "--help";
    if (s.rfind("--", 0) == 0 && s.size() > 2) {
      std::string name = s.substr(2), value;
      bool inline_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        inline_value = true;
      }
      if (spec.valued.count(name)) {
        if (!inline_value) {
          if (i + 1 >= argv.size()) return absl::InvalidArgumentError(cat("--", name, " needs a value"));
          value = argv[++i];
        }
      } else if (spec.flags.count(name)) {
        if (inline_value) return absl::InvalidArgumentError(cat("--", name, " takes no value"));
      } else {
        return absl::InvalidArgumentError(cat("unknown option --", name));
      }
      a.options[name].push_back(value);
    } else if (s.size() > 1 && s[0] == '-') {
      return absl::InvalidArgumentError(cat("unknown option ", s));
    } else if (a.command.empty()) {
      a.command = s;
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> name_file_pairs(const Args& a, const std::string& opt) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!a.has(opt)) return out;
  for (const std::string& v : a.options.at(opt)) {
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

}  // namespace uop::cli
