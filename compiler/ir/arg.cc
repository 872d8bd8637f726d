#include "compiler/ir/arg.h"

#include <array>
#include <cmath>
#include <cstdio>

#include "absl/hash/hash.h"
#include "compiler/support/strings.h"

namespace uop {

ConstValue::Kind ConstValue::kind_of(Scalar s) {
  if (s == Scalar::Bool) return Kind::Bool;
  if (scalar_is_float(s)) return Kind::Float;
  if (scalar_is_unsigned_int(s)) return Kind::UInt;
  return Kind::Int;
}

double ConstValue::to_double() const {
  switch (kind_) {
    case Kind::Bool: return as_bool() ? 1.0 : 0.0;
    case Kind::Int: return static_cast<double>(as_int());
    case Kind::UInt: return static_cast<double>(as_uint());
    case Kind::Float: return as_float();
  }
  return 0;
}

int64_t ConstValue::to_int() const {
  switch (kind_) {
    case Kind::Bool: return as_bool() ? 1 : 0;
    case Kind::Int: return as_int();
    case Kind::UInt: return static_cast<int64_t>(as_uint());
    case Kind::Float: {
      double d = as_float();
      if (!(d == d)) return 0;
      if (d >= 9.2233720368547758e18) return INT64_MAX;
      if (d <= -9.2233720368547758e18) return INT64_MIN;
      return static_cast<int64_t>(d);
    }
  }
  return 0;
}

std::string ConstValue::str() const {
  switch (kind_) {
    case Kind::Bool: return as_bool() ? "true" : "false";
    case Kind::Int: return std::to_string(as_int());
    case Kind::UInt: return std::to_string(as_uint());
    case Kind::Float: {
      double d = as_float();
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
      std::string s = cat(d);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
  }
  return "?";
}

std::string_view axis_type_name(AxisType t) {
  static constexpr std::array<std::string_view, 10> kNames = {
      "Placeholder", "Loop", "Global", "Thread", "Warp", "Local", "GroupReduce", "Upcast",
      "Reduce", "Unroll"};
  return kNames[static_cast<int>(t)];
}

int axis_type_priority(AxisType t) {
  static constexpr std::array<int, 10> kPriority = {-3, -1, 0, 0, 1, 2, 2, 3, 4, 5};
  return kPriority[static_cast<int>(t)];
}

std::string_view reduce_op_name(ReduceOp r) {
  static constexpr std::array<std::string_view, 4> kNames = {"Add", "Mul", "Max", "Min"};
  return kNames[static_cast<int>(r)];
}

size_t hash_arg(const Arg& a) {
  return std::visit([&](const auto& v) { return absl::HashOf(a.index(), v); }, a);
}

Arg default_arg(ArgKind k) {
  Arg out;
  // Walk the variant's alternatives to default-construct the one at index k.
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((I == static_cast<size_t>(k) ? (out.emplace<I>(), 0) : 0), ...);
  }(std::make_index_sequence<std::variant_size_v<Arg>>{});
  return out;
}

namespace {
std::string pairs_str(const std::vector<std::pair<int64_t, int64_t>>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += cat(i ? ", " : "", "(", v[i].first, ", ", v[i].second, ")");
  return out + "]";
}
std::string quoted(const std::string& s, size_t limit = 40) {
  std::string body = s.size() > limit ? s.substr(0, limit) + "..." : s;
  for (char& c : body) if (c == '\n') c = ' ';
  return "\"" + body + "\"";
}
}  // namespace

std::string arg_str(const Arg& a) {
  struct Visitor {
    std::string operator()(const NoArg&) const { return ""; }
    std::string operator()(const ConstValue& c) const { return c.str(); }
    std::string operator()(const VConstArg& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.values.size(); ++i) out += cat(i ? ", " : "", v.values[i].str());
      return out + "]";
    }
    std::string operator()(const IntArg& v) const { return std::to_string(v.value); }
    std::string operator()(const IntsArg& v) const { return "[" + join(v.values, ", ") + "]"; }
    std::string operator()(const BoolsArg& v) const {
      std::vector<bool> vals = v.values;
      return "[" + join(vals, ", ") + "]";
    }
    std::string operator()(const RangeArg& r) const {
      return cat(r.renumbered ? "r" : "R", r.axis_id, ", ", axis_type_name(r.type));
    }
    std::string operator()(const ReduceAxisArg& r) const {
      return cat(reduce_op_name(r.op), ", axes=[", join(r.axes, ", "), "]");
    }
    std::string operator()(const ReduceOpArg& r) const { return std::string(reduce_op_name(r.op)); }
    std::string operator()(const BufferArg& b) const { return cat("size=", b.size); }
    std::string operator()(const BufferViewArg& b) const {
      return cat("size=", b.size, ", offset=", b.offset);
    }
    std::string operator()(const BufferizeArg& b) const {
      std::string s = cat("addrspace=", addrspace_name(b.addrspace));
      if (!b.device.empty()) s += cat(", device=", b.device);
      if (!b.removable) s += ", removable=false";
      return s;
    }
    std::string operator()(const ParamArg& p) const { return cat(p.slot, ", size=", p.size); }
    std::string operator()(const DefineVarArg& v) const {
      return cat(quoted(v.name), ", ", v.min, "..", v.max);
    }
    std::string operator()(const DefineRegArg& r) const { return cat("size=", r.size, ", id=", r.id); }
    std::string operator()(const StrArg& s) const { return quoted(s.value); }
    std::string operator()(const BytesArg& b) const { return cat(b.value.size(), " bytes"); }
    std::string operator()(const AxisFactorsArg& a) const { return pairs_str(a.factors); }
    std::string operator()(const WmmaArg& w) const {
      return cat(quoted(w.name), ", dims=(", w.n, ", ", w.m, ", ", w.k, "), ",
                          scalar_name(w.dtype_in), " -> ", scalar_name(w.dtype_out));
    }
    std::string operator()(const CallInfoArg& c) const { return c.name.empty() ? "" : quoted(c.name); }
    std::string operator()(const KernelInfoArg& k) const {
      if (!k.kernel) return "";
      return k.name.empty() ? "kernel" : "kernel " + quoted(k.name);
    }
    std::string operator()(const DeviceArg& d) const { return join(d.devices, ", "); }
    std::string operator()(const CustomFunctionArg& c) const {
      return cat(c.kind == CustomFunctionKind::EncDec ? "EncDec " : "Graph ", quoted(c.name));
    }
  };
  return std::visit(Visitor{}, a);
}

}  // namespace uop
