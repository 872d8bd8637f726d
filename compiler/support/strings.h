// cat(): string concatenation for messages. Debian's Abseil is built with its own
// string_view, so absl::StrCat does not take std::string_view; this takes both, plus
// numbers, and keeps message building in one place.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace uop {

namespace strings_internal {
inline void append(std::string& out, std::string_view s) { out.append(s); }
inline void append(std::string& out, absl::string_view s) { out.append(s.data(), s.size()); }
inline void append(std::string& out, const char* s) { out.append(s); }
inline void append(std::string& out, const std::string& s) { out.append(s); }
inline void append(std::string& out, char c) { out.push_back(c); }
template <typename T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, char> && !std::is_same_v<T, bool>)
void append(std::string& out, T v) { out.append(std::to_string(v)); }
inline void append(std::string& out, bool b) { out.append(b ? "true" : "false"); }
void append(std::string& out, double d);  // shortest form that reads back exactly
}  // namespace strings_internal

template <typename... Args>
std::string cat(const Args&... args) {
  std::string out;
  (strings_internal::append(out, args), ...);
  return out;
}

// Joins a range with `sep`, formatting each element with cat().
template <typename Range>
std::string join(const Range& r, std::string_view sep) {
  std::string out;
  bool first = true;
  for (const auto& x : r) {
    if (!first) out.append(sep);
    first = false;
    strings_internal::append(out, x);
  }
  return out;
}

}  // namespace uop
