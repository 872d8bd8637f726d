// Command lines for the four programs (uopd, uop-worker, uop, uopc), declared instead of
// hand-parsed, so that every program reads its arguments by the same rules, says the same
// thing about the same mistake, and prints a --help that cannot drift from what it accepts.
//
// A Tool is a program. It has options every command takes (common()) and, for a program
// with verbs (uop run, uopc verify), commands with options and positional arguments of
// their own; a program without verbs (uopd) declares everything on common().
//
// The rules:
//   --name=value and --name value (the next argument, unless it starts with "--"; a value
//   that does can always be given as --name=value); --name= gives the empty value;
//   booleans: --flag, --flag=true, --flag=false (never the next argument);
//   an option with value_optional(): --name alone or --name=value, never the next argument;
//   a one-letter option is also -x VALUE; -h is --help;
//   a repeatable option keeps every value, any other keeps its last;
//   "--" ends the options: what follows is positional;
//   options may come before the command (uop --embedded stats), and an option that is
//   neither common nor the command's is an error that names the option and the command.
//
// No LLVM, no gRPC: uop links it too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace uop::flags {

inline constexpr int kUsageExit = 2;  // every program's exit status for bad usage

enum class Type { kString, kInteger, kBool };

class Option {
 public:
  Option(std::string name, Type type, std::string value_name, std::string help);

  Option& repeatable();
  // What --help shows as the default, where it is computed rather than a fixed value
  // ("all cores", "$XDG_CACHE_HOME/uopd").
  Option& shown_default(std::string text);
  Option& default_value(std::string value);
  // --name alone (the empty value) or --name=VALUE; the next argument is never its value.
  Option& value_optional();
  Option& range(int64_t lo, int64_t hi);  // integers: the accepted range
  Option& choices(std::vector<std::string> values);  // strings: the only values accepted

  const std::string& name() const { return name_; }
  Type type() const { return type_; }
  bool takes_value() const { return type_ != Type::kBool && !value_optional_; }
  bool is_repeatable() const { return repeatable_; }
  const std::string& default_text() const { return default_; }
  // INVALID_ARGUMENT naming the option when `value` is not one it takes.
  absl::Status check(const std::string& value) const;
  std::string spelling() const;  // "--listen=HOST:PORT", "--tls", "-o OUT", "--embedded[=PID]"
  std::string help() const;      // with "(repeatable)" and "[default]" added

 private:
  std::string name_, value_name_, help_, default_, shown_default_;
  Type type_;
  bool repeatable_ = false, value_optional_ = false;
  int64_t lo_ = 0, hi_ = INT64_MAX;
  std::vector<std::string> choices_;
};

// What a command line said, with the declared defaults behind it.
struct Args {
  std::string command;                  // empty for a tool without commands
  std::vector<std::string> positional;  // after the command
  bool help = false;                    // --help, -h or `help [COMMAND]`: print help(command)

  bool has(const std::string& name) const { return given_.count(name) > 0; }  // on the command line
  // The last value given, else the default ("" when none was declared).
  std::string get(const std::string& name) const;
  // Every value given, in order (repeatable options).
  std::vector<std::string> all(const std::string& name) const;
  int64_t integer(const std::string& name) const;  // checked when parsed; 0 without value or default
  bool on(const std::string& name) const { return get(name) == "true"; }  // booleans

 private:
  friend class Tool;
  std::map<std::string, std::vector<std::string>> given_;
  std::map<std::string, std::string> defaults_;
};

// One command (or the whole of a tool without commands): its options and positionals.
class Command {
 public:
  Command(std::string name, std::string summary) : name_(std::move(name)), summary_(std::move(summary)) {}

  Option& string(std::string name, std::string value_name, std::string help, std::string def = "");
  Option& integer(std::string name, std::string value_name, std::string help);
  Option& integer(std::string name, std::string value_name, std::string help, int64_t def);
  Option& flag(std::string name, std::string help);
  // A string option that takes one of `values`; VALUE reads "a|b|c" in the help.
  Option& choice(std::string name, std::vector<std::string> values, std::string help, std::string def = "");
  // Positional arguments in order; a rest() argument takes any number (zero or more).
  Command& positional(std::string name);
  Command& rest(std::string name);
  // Paragraphs printed after the usage line in the command's own help.
  Command& describe(std::string text);

  const std::string& name() const { return name_; }
  const std::vector<std::unique_ptr<Option>>& options() const { return options_; }
  const Option* find(std::string_view name) const;
  std::string synopsis() const;  // "run GRAPH", "convert GRAPH OUT", "onnx-test CASE_DIR..."

 private:
  friend class Tool;
  Option& add(std::unique_ptr<Option> o);
  std::string name_, summary_, description_;
  std::vector<std::unique_ptr<Option>> options_;
  std::vector<std::string> positionals_;
  std::string rest_;
};

class Tool {
 public:
  // `summary`: the first paragraph of the help. `epilog`: its last (exit statuses, ...).
  Tool(std::string program, std::string summary, std::string epilog = "");

  Command& common() { return common_; }
  Command& command(std::string name, std::string summary);

  // argv without the program name. INVALID_ARGUMENT with the message for the user; print
  // it with usage_error. A tool with commands and none given returns an empty command.
  absl::StatusOr<Args> parse(const std::vector<std::string>& argv) const;
  absl::StatusOr<Args> parse(int argc, char** argv) const;

  // The tool's help (every command with its options), or one command's.
  std::string help(const std::string& command = "") const;
  // "<program>: <message>" and where to read the usage, on stderr; returns kUsageExit.
  int usage_error(std::string_view message, const std::string& command = "") const;
  int usage_error(const absl::Status& parse_error, const std::string& command = "") const;
  const std::string& program() const { return program_; }

 private:
  const Command* find(std::string_view command) const;
  std::string where(const Command* c) const;  // "'uop run'", "'uopd'"
  std::string help_hint(const std::string& command) const;
  absl::StatusOr<Args> parse_for(const Command* c, const std::vector<std::string>& argv, size_t command_at) const;

  std::string program_, summary_, epilog_;
  Command common_;
  std::vector<std::unique_ptr<Command>> commands_;
};

}  // namespace uop::flags
