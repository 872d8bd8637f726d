// Declared command lines: see flags.h.
#include "compiler/support/flags.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/numbers.h"
#include "compiler/support/strings.h"

namespace uop::flags {
namespace {

constexpr size_t kWidth = 96;  // help lines are wrapped to this many columns

// `text` wrapped to kWidth, every line after the first indented by `indent` columns; the
// first starts at column `at`. Newlines in `text` are kept as line breaks.
std::string wrap(std::string_view text, size_t at, size_t indent) {
  std::string out;
  size_t col = at;
  bool line_start = true;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '\n') {
      out += '\n';
      out.append(indent, ' ');
      col = indent;
      line_start = true;
      ++i;
      continue;
    }
    size_t end = text.find_first_of(" \n", i);
    if (end == std::string_view::npos) end = text.size();
    std::string_view word = text.substr(i, end - i);
    if (!line_start && col + 1 + word.size() > kWidth) {
      out += '\n';
      out.append(indent, ' ');
      col = indent;
      line_start = true;
    }
    if (!line_start) {
      out += ' ';
      ++col;
    }
    out.append(word);
    col += word.size();
    line_start = false;
    i = end < text.size() && text[end] == ' ' ? end + 1 : end;
  }
  return out;
}

// "  LEFT      text wrapped at column `column`", or LEFT alone on its line when it is too long.
std::string entry(size_t indent, const std::string& left, std::string_view text, size_t column) {
  std::string out(indent, ' ');
  out += left;
  if (text.empty()) return out + "\n";
  if (indent + left.size() + 2 > column) {
    out += '\n';
    out.append(column, ' ');
  } else {
    out.append(column - indent - left.size(), ' ');
  }
  return out + wrap(text, column, column) + "\n";
}

std::string either(const std::vector<std::string>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += cat(i == 0 ? "" : i + 1 == values.size() ? " or " : ", ", values[i]);
  return out;
}

}  // namespace

Option::Option(std::string name, Type type, std::string value_name, std::string help)
    : name_(std::move(name)), value_name_(std::move(value_name)), help_(std::move(help)), type_(type) {
  if (type_ == Type::kBool) default_ = "false";
}

Option& Option::repeatable() {
  repeatable_ = true;
  return *this;
}
Option& Option::shown_default(std::string text) {
  shown_default_ = std::move(text);
  return *this;
}
Option& Option::default_value(std::string value) {
  default_ = std::move(value);
  return *this;
}
Option& Option::value_optional() {
  value_optional_ = true;
  return *this;
}
Option& Option::range(int64_t lo, int64_t hi) {
  lo_ = lo;
  hi_ = hi;
  return *this;
}
Option& Option::choices(std::vector<std::string> values) {
  choices_ = std::move(values);
  return *this;
}

absl::Status Option::check(const std::string& value) const {
  switch (type_) {
    case Type::kBool:
      if (value == "true" || value == "false") return absl::OkStatus();
      return absl::InvalidArgumentError(cat("--", name_, " takes true or false, got '", value, "'"));
    case Type::kInteger: {
      int64_t n = 0;
      bool digits = !value.empty() && value.find_first_not_of("-0123456789") == std::string::npos;
      if (digits && absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &n) && n >= lo_ && n <= hi_)
        return absl::OkStatus();
      std::string want = hi_ == INT64_MAX ? (lo_ == 0 ? std::string("a non-negative integer") : cat("an integer of at least ", lo_))
                                          : cat("an integer from ", lo_, " to ", hi_);
      return absl::InvalidArgumentError(cat("--", name_, " takes ", want, ", got '", value, "'"));
    }
    case Type::kString:
      if (choices_.empty() || std::find(choices_.begin(), choices_.end(), value) != choices_.end()) return absl::OkStatus();
      return absl::InvalidArgumentError(cat("--", name_, " takes ", either(choices_), ", got '", value, "'"));
  }
  return absl::OkStatus();
}

std::string Option::spelling() const {
  std::string value = value_name_;
  if (value.empty() && !choices_.empty()) value = join(choices_, "|");
  if (value.empty()) value = "VALUE";
  if (name_.size() == 1) return type_ == Type::kBool ? cat("-", name_) : cat("-", name_, " ", value);
  if (type_ == Type::kBool) return cat("--", name_);
  if (value_optional_) return cat("--", name_, "[=", value, "]");
  return cat("--", name_, "=", value);
}

std::string Option::help() const {
  std::string out = help_;
  if (repeatable_) out += " (repeatable)";
  // A boolean's default is false, which goes without saying.
  std::string def = !shown_default_.empty() ? shown_default_ : type_ == Type::kBool ? "" : default_;
  if (!def.empty()) out += cat(" (default: ", def, ")");
  return out;
}

std::string Args::get(const std::string& name) const {
  if (auto it = given_.find(name); it != given_.end() && !it->second.empty()) return it->second.back();
  if (auto it = defaults_.find(name); it != defaults_.end()) return it->second;
  return "";
}

std::vector<std::string> Args::all(const std::string& name) const {
  auto it = given_.find(name);
  return it == given_.end() ? std::vector<std::string>{} : it->second;
}

int64_t Args::integer(const std::string& name) const {
  int64_t n = 0;
  std::string v = get(name);
  return absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &n) ? n : 0;
}

Option& Command::add(std::unique_ptr<Option> o) {
  options_.push_back(std::move(o));
  return *options_.back();
}

Option& Command::string(std::string name, std::string value_name, std::string help, std::string def) {
  return add(std::make_unique<Option>(std::move(name), Type::kString, std::move(value_name), std::move(help)))
      .default_value(std::move(def));
}
Option& Command::integer(std::string name, std::string value_name, std::string help) {
  return add(std::make_unique<Option>(std::move(name), Type::kInteger, std::move(value_name), std::move(help)));
}
Option& Command::integer(std::string name, std::string value_name, std::string help, int64_t def) {
  return integer(std::move(name), std::move(value_name), std::move(help)).default_value(std::to_string(def));
}
Option& Command::flag(std::string name, std::string help) {
  return add(std::make_unique<Option>(std::move(name), Type::kBool, "", std::move(help)));
}
Option& Command::choice(std::string name, std::vector<std::string> values, std::string help, std::string def) {
  return string(std::move(name), "", std::move(help), std::move(def)).choices(std::move(values));
}
Command& Command::positional(std::string name) {
  positionals_.push_back(std::move(name));
  return *this;
}
Command& Command::rest(std::string name) {
  rest_ = std::move(name);
  return *this;
}
Command& Command::describe(std::string text) {
  description_ = std::move(text);
  return *this;
}

const Option* Command::find(std::string_view name) const {
  for (const auto& o : options_)
    if (o->name() == name) return o.get();
  return nullptr;
}

std::string Command::synopsis() const {
  std::string out = name_;
  for (const std::string& p : positionals_) out += cat(out.empty() ? "" : " ", p);
  if (!rest_.empty()) out += cat(out.empty() ? "" : " ", rest_, "...");
  return out;
}

Tool::Tool(std::string program, std::string summary, std::string epilog)
    : program_(std::move(program)), summary_(std::move(summary)), epilog_(std::move(epilog)), common_("", "") {}

Command& Tool::command(std::string name, std::string summary) {
  commands_.push_back(std::make_unique<Command>(std::move(name), std::move(summary)));
  return *commands_.back();
}

const Command* Tool::find(std::string_view command) const {
  for (const auto& c : commands_)
    if (c->name() == command) return c.get();
  return nullptr;
}

std::string Tool::where(const Command* c) const {
  return c && !c->name().empty() ? cat("'", program_, " ", c->name(), "'") : cat("'", program_, "'");
}

std::string Tool::help_hint(const std::string& command) const {
  if (commands_.empty()) return cat(program_, " --help");
  return command.empty() ? cat(program_, " help") : cat(program_, " help ", command);
}

int Tool::usage_error(std::string_view message, const std::string& command) const {
  std::cerr << program_ << ": " << message << "\nrun '" << help_hint(command) << "' for usage\n";
  return kUsageExit;
}

int Tool::usage_error(const absl::Status& parse_error, const std::string& command) const {
  absl::string_view m = parse_error.message();
  return usage_error(std::string_view(m.data(), m.size()), command);
}

absl::StatusOr<Args> Tool::parse(int argc, char** argv) const {
  return parse(std::vector<std::string>(argv + 1, argv + argc));
}

absl::StatusOr<Args> Tool::parse(const std::vector<std::string>& argv) const {
  if (commands_.empty()) return parse_for(&common_, argv, std::string::npos);
  // The command is the first word that is neither an option nor an option's value. Options
  // before it are read by what any command declares, to know which take the next word.
  auto takes_value = [&](std::string_view name) {
    if (const Option* o = common_.find(name)) return o->takes_value();
    for (const auto& c : commands_)
      if (const Option* o = c->find(name)) return o->takes_value();
    return false;
  };
  size_t at = std::string::npos;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s == "--") break;
    if (s.size() > 1 && s[0] == '-') {
      std::string name = s[1] == '-' ? s.substr(2) : s.substr(1);
      bool inline_value = name.find('=') != std::string::npos;
      if (!inline_value && takes_value(name) && i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) ++i;
      continue;
    }
    at = i;
    break;
  }
  if (at == std::string::npos) return parse_for(nullptr, argv, at);
  if (argv[at] == "help") {
    Args a;
    a.help = true;
    if (at + 1 < argv.size()) {
      if (!find(argv[at + 1])) return absl::InvalidArgumentError(cat("unknown command '", argv[at + 1], "'"));
      a.command = argv[at + 1];
    }
    return a;
  }
  const Command* c = find(argv[at]);
  if (!c) return absl::InvalidArgumentError(cat("unknown command '", argv[at], "'"));
  return parse_for(c, argv, at);
}

absl::StatusOr<Args> Tool::parse_for(const Command* c, const std::vector<std::string>& argv, size_t command_at) const {
  Args a;
  if (c && c != &common_) a.command = c->name();
  auto lookup = [&](std::string_view name) -> const Option* {
    if (const Option* o = common_.find(name)) return o;
    return c && c != &common_ ? c->find(name) : nullptr;
  };
  for (const Command* d : {&common_, c})
    if (d)
      for (const auto& o : d->options())
        if (!o->default_text().empty()) a.defaults_[o->name()] = o->default_text();
  bool options_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (i == command_at) continue;
    const std::string& s = argv[i];
    if (options_done || s.size() < 2 || s[0] != '-') {
      a.positional.push_back(s);
      continue;
    }
    if (s == "--") {
      options_done = true;
      continue;
    }
    if (s == "-h" || s == "--help") {
      a.help = true;
      continue;
    }
    const bool long_form = s[1] == '-';
    std::string name = s.substr(long_form ? 2 : 1), value;
    bool inline_value = false;
    if (auto eq = name.find('='); long_form && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const Option* o = lookup(name);
    if (!o || (!long_form && name.size() != 1))
      return absl::InvalidArgumentError(cat(long_form ? "--" : "-", name, " is not an option of ", where(c)));
    if (o->type() == Type::kBool) {
      if (!inline_value) value = "true";
    } else if (o->takes_value() && !inline_value) {
      if (i + 1 >= argv.size() || i + 1 == command_at || argv[i + 1].rfind("--", 0) == 0)
        return absl::InvalidArgumentError(cat("--", name, " needs a value (", o->spelling(), ")"));
      value = argv[++i];
    }
    if (inline_value || o->takes_value())
      if (absl::Status s = o->check(value); !s.ok()) return s;
    std::vector<std::string>& values = a.given_[name];
    if (!o->is_repeatable()) values.clear();
    values.push_back(std::move(value));
  }
  if (a.help || !c) return a;
  if (a.positional.size() < c->positionals_.size())
    return absl::InvalidArgumentError(cat(where(c), " needs ", c->positionals_[a.positional.size()]));
  if (a.positional.size() > c->positionals_.size() && c->rest_.empty())
    return absl::InvalidArgumentError(cat("unexpected argument '", a.positional[c->positionals_.size()], "' for ", where(c)));
  return a;
}

std::string Tool::help(const std::string& command) const {
  constexpr size_t kOptionColumn = 30;
  auto options = [&](const Command& c, size_t indent, size_t column) {
    std::string out;
    for (const auto& o : c.options()) out += entry(indent, o->spelling(), o->help(), column);
    return out;
  };
  std::string out;
  if (const Command* c = find(command)) {
    out += cat("usage: ", program_, " ", c->synopsis(), " [options]\n\n", wrap(c->summary_, 0, 0), "\n");
    if (!c->description_.empty()) out += cat("\n", wrap(c->description_, 0, 0), "\n");
    if (!c->options().empty()) out += cat("\noptions:\n", options(*c, 2, kOptionColumn));
    if (!common_.options().empty()) out += cat("\noptions for every command:\n", options(common_, 2, kOptionColumn));
    return out;
  }
  out += wrap(summary_, 0, 0) + "\n\n";
  if (commands_.empty()) {
    out += cat("usage: ", program_, " [options]\n");
    if (!common_.description_.empty()) out += cat("\n", wrap(common_.description_, 0, 0), "\n");
    out += cat("\noptions:\n", options(common_, 2, kOptionColumn), entry(2, "--help", "this text", kOptionColumn));
  } else {
    out += cat("usage: ", program_, " COMMAND [ARGS] [options]\n");
    if (!common_.description_.empty()) out += cat("\n", wrap(common_.description_, 0, 0), "\n");
    out += "\ncommands:\n";
    for (const auto& c : commands_) {
      out += entry(2, c->synopsis(), c->summary_, 27);
      out += options(*c, 6, kOptionColumn + 6);
    }
    out += entry(2, "help [COMMAND]", "this text, or COMMAND's alone (also: COMMAND --help)", 27);
    if (!common_.options().empty()) out += cat("\noptions for every command:\n", options(common_, 2, kOptionColumn));
  }
  if (!epilog_.empty()) out += cat("\n", wrap(epilog_, 0, 0), "\n");
  return out;
}

}  // namespace uop::flags
