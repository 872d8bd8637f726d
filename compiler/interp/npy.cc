// The .npy reader and writer. The header is a Python dict literal; rather than a Python
// evaluator this reads exactly the subset NumPy writes (string keys, a string, a bool and a
// tuple of ints, whitespace and a trailing comma anywhere Python allows them) and refuses
// everything else with a message that says what was found.
#include "compiler/interp/npy.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

absl::Status bad(std::string_view name, std::string_view problem) {
  return absl::InvalidArgumentError(cat(name, ": ", problem));
}

// What the header says, before any data is touched.
struct Header {
  Scalar dtype = Scalar::Void;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // bytes from the start of the file
  int64_t data_bytes = 0;
};

// A literal value of the header dict.
struct Value {
  enum class Kind { Str, Bool, Int, Tuple } kind = Kind::Str;
  std::string str;
  bool b = false;
  std::vector<int64_t> ints;  // Int: one; Tuple: the elements
};

std::string_view kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::Str: return "a string";
    case Value::Kind::Bool: return "a bool";
    case Value::Kind::Int: return "an int";
    case Value::Kind::Tuple: return "a tuple";
  }
  return "?";
}

class DictParser {
 public:
  DictParser(std::string_view text, std::string_view name, int max_rank)
      : s_(text), name_(name), max_rank_(max_rank) {}

  // Parses the whole text into key/value pairs in order.
  absl::Status parse(std::vector<std::pair<std::string, Value>>& out) {
    skip_ws();
    if (!eat('{')) return error("the header is not a dict literal ('{' expected)");
    skip_ws();
    while (!eat('}')) {
      std::pair<std::string, Value> kv;
      if (!at('\'') && !at('"')) return error("a string key expected");
      if (absl::Status st = parse_string(kv.first); !st.ok()) return st;
      skip_ws();
      if (!eat(':')) return error("':' expected after a key");
      skip_ws();
      if (absl::Status st = parse_value(kv.second); !st.ok()) return st;
      out.push_back(std::move(kv));
      skip_ws();
      if (eat(',')) {
        skip_ws();
      } else if (!at('}')) {
        return error("',' or '}' expected");
      }
    }
    skip_ws();
    if (pos_ != s_.size()) return error("text after the closing '}'");
    return absl::OkStatus();
  }

 private:
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool eat(char c) {
    if (!at(c)) return false;
    ++pos_;
    return true;
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  absl::Status error(std::string_view what) const {
    return bad(name_, cat("malformed header at byte ", pos_, " of the dict: ", what));
  }

  absl::Status parse_string(std::string& out) {
    char quote = s_[pos_++];
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      // Escapes never occur in what NumPy writes; refusing them keeps this a tokenizer.
      if (s_[pos_] == '\\' || s_[pos_] == '\n') return error("escape or newline inside a string");
      ++pos_;
    }
    if (pos_ == s_.size()) return error("unterminated string");
    out.assign(s_.substr(start, pos_ - start));
    ++pos_;
    return absl::OkStatus();
  }

  absl::Status parse_int(int64_t& out) {
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') return error("a non-negative integer expected");
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(s_[pos_++] - '0');
      if (v > static_cast<uint64_t>(INT64_MAX)) return error("an integer does not fit in int64");
    }
    if (at('L') || at('l')) ++pos_;  // Python 2 long, as old NumPy wrote shapes
    out = static_cast<int64_t>(v);
    return absl::OkStatus();
  }

  absl::Status parse_value(Value& v) {
    if (at('\'') || at('"')) {
      v.kind = Value::Kind::Str;
      return parse_string(v.str);
    }
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      v.kind = Value::Kind::Bool;
      v.b = true;
      return absl::OkStatus();
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      v.kind = Value::Kind::Bool;
      v.b = false;
      return absl::OkStatus();
    }
    if (eat('(')) {
      // A tuple: "()", "(3,)", "(2, 3)", "(2, 3,)". "(3)" is an int in Python.
      v.kind = Value::Kind::Tuple;
      bool saw_comma = false;
      skip_ws();
      while (!eat(')')) {
        if (static_cast<int>(v.ints.size()) >= max_rank_)
          return bad(name_, cat("shape has more than ", max_rank_, " dims"));
        int64_t d = 0;
        if (absl::Status st = parse_int(d); !st.ok()) return st;
        v.ints.push_back(d);
        skip_ws();
        if (eat(',')) {
          saw_comma = true;
          skip_ws();
        } else if (!at(')')) {
          return error("',' or ')' expected in a tuple");
        }
      }
      if (v.ints.size() == 1 && !saw_comma) v.kind = Value::Kind::Int;
      return absl::OkStatus();
    }
    if (at('[')) return error("a list where a string, True, False or a tuple of ints is expected (structured dtypes are not supported)");
    if (at('-')) return error("negative integer");
    if (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v.kind = Value::Kind::Int;
      v.ints.resize(1);
      return parse_int(v.ints[0]);
    }
    return error("a string, True, False or a tuple of ints expected");
  }

  std::string_view s_;
  std::string_view name_;
  int max_rank_;
  size_t pos_ = 0;
};

uint32_t read_le(std::string_view b, size_t at, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

// The magic, version and header length: how many bytes the whole preamble + header take.
// `prefix` holds at least the first 12 bytes of the file, or all of it if shorter.
absl::StatusOr<std::pair<int64_t, int64_t>> read_preamble(std::string_view prefix, std::string_view name,
                                                          const NpyLimits& limits) {
  if (prefix.empty()) return bad(name, "empty file, not a .npy file");
  size_t m = std::min(prefix.size(), kMagic.size());
  if (prefix.substr(0, m) != kMagic.substr(0, m))
    return bad(name, "not a .npy file (the magic string \\x93NUMPY is missing)");
  if (prefix.size() < 10) return bad(name, cat("truncated: ", prefix.size(), " bytes is shorter than a .npy preamble"));
  int major = static_cast<uint8_t>(prefix[6]), minor = static_cast<uint8_t>(prefix[7]);
  if (minor != 0 || major < 1 || major > 3)
    return bad(name, cat("unsupported .npy format version ", major, ".", minor, " (1.0, 2.0 and 3.0 are read)"));
  int len_bytes = major == 1 ? 2 : 4;
  if (static_cast<int64_t>(prefix.size()) < 8 + len_bytes)
    return bad(name, cat("truncated: ", prefix.size(), " bytes is shorter than a .npy preamble"));
  int64_t header_len = read_le(prefix, 8, len_bytes);
  if (header_len > limits.max_header_bytes)
    return bad(name, cat("header length ", header_len, " is over the limit of ", limits.max_header_bytes, " bytes"));
  return std::make_pair(int64_t{8} + len_bytes, header_len);
}

// Checks the dict and computes where the data is and how long it must be.
absl::StatusOr<Header> parse_header(std::string_view text, int64_t data_offset, std::string_view name,
                                    const NpyLimits& limits) {
  std::vector<std::pair<std::string, Value>> kvs;
  if (absl::Status st = DictParser(text, name, limits.max_rank).parse(kvs); !st.ok()) return st;
  const Value *descr = nullptr, *fortran = nullptr, *shape = nullptr;
  for (const auto& [key, value] : kvs) {
    const Value** slot = key == "descr" ? &descr : key == "fortran_order" ? &fortran : key == "shape" ? &shape : nullptr;
    if (!slot) return bad(name, cat("unexpected header key '", key, "'"));
    if (*slot) return bad(name, cat("header key '", key, "' appears twice"));
    *slot = &value;
  }
  if (!descr || !fortran || !shape)
    return bad(name, cat("header lacks the key '", !descr ? "descr" : !fortran ? "fortran_order" : "shape", "'"));
  if (descr->kind != Value::Kind::Str)
    return bad(name, cat("'descr' is ", kind_name(descr->kind), ", not a dtype string (structured dtypes are not supported)"));
  if (fortran->kind != Value::Kind::Bool) return bad(name, cat("'fortran_order' is ", kind_name(fortran->kind), ", not a bool"));
  if (shape->kind != Value::Kind::Tuple) return bad(name, cat("'shape' is ", kind_name(shape->kind), ", not a tuple"));

  Header h;
  std::optional<Scalar> s = scalar_from_npy_descr(descr->str);
  if (!s) {
    if (!descr->str.empty() && descr->str[0] == '>')
      return bad(name, cat("big-endian data ('", descr->str, "') is not supported; save it little-endian"));
    return bad(name, cat("unsupported dtype '", descr->str, "'"));
  }
  h.dtype = *s;
  h.shape = shape->ints;
  if (fortran->b && h.shape.size() >= 2)
    return bad(name, "Fortran-order (column-major) data is not supported; save it in C order");
  std::optional<int64_t> n = checked_numel(h.shape);
  if (!n || *n > INT64_MAX / scalar_bytes(h.dtype))
    return bad(name, cat("shape ", shape_str(h.shape), " has more elements than fit in memory"));
  h.data_offset = data_offset;
  h.data_bytes = *n * scalar_bytes(h.dtype);
  return h;
}

absl::Status check_data_size(const Header& h, int64_t total, std::string_view name) {
  int64_t have = total - h.data_offset;
  if (have < h.data_bytes)
    return bad(name, cat("truncated: the header says ", scalar_name(h.dtype), shape_str(h.shape), " = ",
                         h.data_bytes, " bytes of data, the file has ", have));
  if (have > h.data_bytes)
    return bad(name, cat(have - h.data_bytes, " unexpected bytes after the ", h.data_bytes, " bytes of data"));
  return absl::OkStatus();
}

// Bool bytes other than 0 / 1 would break what compiled code assumes of a bool.
absl::Status check_bools(const HostTensor& t, std::string_view name) {
  if (t.dtype != Scalar::Bool) return absl::OkStatus();
  for (size_t i = 0; i < t.data.size(); ++i) {
    auto b = static_cast<uint8_t>(t.data[i]);
    if (b > 1) return bad(name, cat("bool element ", i, " is the byte ", int{b}, ", not 0 or 1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Header> parse_all_headers(std::string_view bytes, std::string_view name, const NpyLimits& limits) {
  auto pre = read_preamble(bytes.substr(0, 12), name, limits);
  if (!pre.ok()) return pre.status();
  auto [start, len] = *pre;
  if (static_cast<int64_t>(bytes.size()) < start + len)
    return bad(name, cat("truncated: the header of ", len, " bytes is cut off at ", bytes.size() - start));
  return parse_header(bytes.substr(start, len), start + len, name, limits);
}

}  // namespace

std::optional<std::string> npy_descr(Scalar s) {
  switch (s) {
    case Scalar::Bool: return "|b1";
    case Scalar::Int8: return "|i1";
    case Scalar::Int16: return "<i2";
    case Scalar::Int32: return "<i4";
    case Scalar::Int64: case Scalar::Index: return "<i8";
    case Scalar::UInt8: return "|u1";
    case Scalar::UInt16: return "<u2";
    case Scalar::UInt32: return "<u4";
    case Scalar::UInt64: return "<u8";
    case Scalar::Float16: return "<f2";
    case Scalar::BFloat16: return "<V2";
    case Scalar::Float32: return "<f4";
    case Scalar::Float64: return "<f8";
    case Scalar::Void: return std::nullopt;
  }
  return std::nullopt;
}

std::optional<Scalar> scalar_from_npy_descr(std::string_view descr) {
  if (descr.size() < 2) return std::nullopt;
  char order = descr[0];
  std::string_view code = descr.substr(1);
  struct Entry { std::string_view code; Scalar s; };
  static constexpr Entry kTable[] = {
      {"b1", Scalar::Bool},    {"i1", Scalar::Int8},    {"i2", Scalar::Int16},    {"i4", Scalar::Int32},
      {"i8", Scalar::Int64},   {"u1", Scalar::UInt8},   {"u2", Scalar::UInt16},   {"u4", Scalar::UInt32},
      {"u8", Scalar::UInt64},  {"f2", Scalar::Float16}, {"f4", Scalar::Float32},  {"f8", Scalar::Float64},
      {"V2", Scalar::BFloat16},
  };
  for (const Entry& e : kTable) {
    if (e.code != code) continue;
    // '<' little, '|' not applicable (one byte, or opaque), '=' native (little here).
    // '>' only where byte order cannot matter.
    if (order == '<' || order == '|' || order == '=') return e.s;
    if (order == '>' && scalar_bytes(e.s) == 1) return e.s;
    return std::nullopt;
  }
  return std::nullopt;
}

absl::StatusOr<HostTensor> parse_npy(std::string_view bytes, std::string_view name, const NpyLimits& limits) {
  auto h = parse_all_headers(bytes, name, limits);
  if (!h.ok()) return h.status();
  if (absl::Status st = check_data_size(*h, static_cast<int64_t>(bytes.size()), name); !st.ok()) return st;
  HostTensor t;
  t.dtype = h->dtype;
  t.shape = h->shape;
  t.data.assign(bytes.substr(h->data_offset));
  if (absl::Status st = check_bools(t, name); !st.ok()) return st;
  return t;
}

std::string serialize_npy(const HostTensor& t) {
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += cat(i ? ", " : "", t.shape[i]);
  if (t.shape.size() == 1) shape += ",";
  shape += ")";
  std::string dict = cat("{'descr': '", npy_descr(t.dtype).value_or("|V0"), "', 'fortran_order': False, 'shape': ",
                         shape, ", }");
  // Pad with spaces so that the data starts on a 64-byte boundary, ending in '\n' as
  // NumPy does; use version 2.0's 4-byte length only when 1.0's 2 bytes cannot hold it.
  int major = 1;
  size_t preamble = 10;
  size_t total = (preamble + dict.size() + 1 + 63) / 64 * 64;
  if (total - preamble > 0xffff) {
    major = 2;
    preamble = 12;
    total = (preamble + dict.size() + 1 + 63) / 64 * 64;
  }
  size_t header_len = total - preamble;
  dict.append(header_len - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string out(kMagic);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < preamble - 8; ++i) out.push_back(static_cast<char>((header_len >> (8 * i)) & 0xff));
  out += dict;
  out += t.data;
  return out;
}

namespace {
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

absl::Status io_error(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(cat(path, ": ", what, ": ", std::strerror(errno)));
}

// Reads exactly n bytes at the current position into out (already sized).
bool read_exact(std::FILE* f, char* out, size_t n) { return n == 0 || std::fread(out, 1, n, f) == n; }
}  // namespace

absl::StatusOr<HostTensor> read_npy(const std::string& path, const NpyLimits& limits) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return io_error(path, "cannot open");
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return io_error(path, "cannot seek");
  long size = std::ftell(f.get());
  if (size < 0) return io_error(path, "cannot tell its size");
  std::rewind(f.get());

  // The preamble and header first; the data is allocated only once the header has been
  // checked against the file's real size.
  std::string head(static_cast<size_t>(std::min<long>(size, 12)), '\0');
  if (!read_exact(f.get(), head.data(), head.size())) return io_error(path, "read failed");
  auto pre = read_preamble(head, path, limits);
  if (!pre.ok()) return pre.status();
  auto [start, len] = *pre;
  if (size < start + len)
    return bad(path, cat("truncated: the header of ", len, " bytes is cut off at ", size - start));
  std::string text(static_cast<size_t>(len), '\0');
  if (std::fseek(f.get(), static_cast<long>(start), SEEK_SET) != 0) return io_error(path, "cannot seek");
  if (!read_exact(f.get(), text.data(), text.size())) return io_error(path, "read failed");
  auto h = parse_header(text, start + len, path, limits);
  if (!h.ok()) return h.status();
  if (absl::Status st = check_data_size(*h, size, path); !st.ok()) return st;

  HostTensor t;
  t.dtype = h->dtype;
  t.shape = h->shape;
  t.data.resize(static_cast<size_t>(h->data_bytes));
  if (!read_exact(f.get(), t.data.data(), t.data.size())) return io_error(path, "read failed");
  if (absl::Status st = check_bools(t, path); !st.ok()) return st;
  return t;
}

absl::Status write_npy(const std::string& path, const HostTensor& t) {
  if (!npy_descr(t.dtype)) return absl::InvalidArgumentError(cat(path, ": cannot write a tensor of dtype void"));
  if (static_cast<int64_t>(t.data.size()) != t.numel() * t.itemsize())
    return absl::InvalidArgumentError(cat(path, ": tensor data of ", t.data.size(), " bytes does not match ",
                                          scalar_name(t.dtype), shape_str(t.shape)));
  std::string bytes = serialize_npy(t);
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) return io_error(path, "cannot open for writing");
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) return io_error(path, "write failed");
  if (std::fclose(f.release()) != 0) return io_error(path, "write failed");
  return absl::OkStatus();
}

}  // namespace uop
