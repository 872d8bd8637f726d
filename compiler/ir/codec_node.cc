// One wire node <-> one UOp (see codec_node.h). Every enum travels by name: each table
// pairs an IR value with the proto value of the same name, looked up once in the generated
// descriptors, so renumbering either side can never shift a meaning silently. A decoded
// node is checked completely before it is interned, and nothing is sized by a count the
// input states, only by what protobuf has already parsed.
#include "compiler/ir/codec_node.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"
#include "google/protobuf/descriptor.h"

namespace uop::codec_internal {

void die(const std::string& msg) {
  std::fprintf(stderr, "uop codec: %s\n", msg.c_str());
  std::abort();
}

namespace {

namespace gpb = google::protobuf;

#define CODEC_TRY(expr)                    \
  do {                                     \
    absl::Status codec_st_ = (expr);       \
    if (!codec_st_.ok()) return codec_st_; \
  } while (0)

// ---------------------------------------------------------------------------------------
// Enum tables

constexpr int kNumAddrSpaces = static_cast<int>(AddrSpace::Reg) + 1;
constexpr int kNumAxisTypes = static_cast<int>(AxisType::Unroll) + 1;
constexpr int kNumReduceOps = static_cast<int>(ReduceOp::Min) + 1;
constexpr int kNumCustomFunctionKinds = static_cast<int>(CustomFunctionKind::Graph) + 1;

std::string_view custom_function_kind_name(CustomFunctionKind k) {
  return k == CustomFunctionKind::EncDec ? "EncDec" : "Graph";
}

// The proto spelling of an IR name: "GroupReduce" -> "GROUP_REDUCE", "float16" -> "FLOAT16";
// names that are already upper snake case ("REDUCE_AXIS") stay as they are.
std::string wire_enum_name(std::string_view ir) {
  std::string out;
  for (size_t i = 0; i < ir.size(); ++i) {
    char c = ir[i];
    bool upper = c >= 'A' && c <= 'Z';
    if (upper && i > 0 && ir[i - 1] >= 'a' && ir[i - 1] <= 'z') out.push_back('_');
    out.push_back(c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c);
  }
  return out;
}

template <typename E, int N>
class EnumTable {
 public:
  EnumTable(const gpb::EnumDescriptor* desc, std::string_view (*ir_name)(E)) : desc_(desc) {
    for (int i = 0; i < N; ++i) {
      E e = static_cast<E>(i);
      std::string name = wire_enum_name(ir_name(e));
      const gpb::EnumValueDescriptor* v = desc->FindValueByName(name);
      if (!v) die(cat(desc->full_name(), " has no value ", name, " (proto/uop.proto and compiler/ir disagree)"));
      to_wire_[i] = v->number();
      from_wire_.emplace(v->number(), e);
    }
  }
  int to_wire(E e) const { return to_wire_[static_cast<int>(e)]; }
  // Proto3 enums keep numbers they do not know, so every number read must go through here.
  std::optional<E> from_wire(int number) const {
    auto it = from_wire_.find(number);
    if (it == from_wire_.end()) return std::nullopt;
    return it->second;
  }
  const std::string& proto_name() const { return desc_->full_name(); }

 private:
  const gpb::EnumDescriptor* desc_;
  std::array<int, N> to_wire_{};
  absl::flat_hash_map<int, E> from_wire_;
};

struct Tables {
  EnumTable<Op, kNumOps> op{v1::Op_descriptor(), &op_name};
  EnumTable<Scalar, kNumScalars> scalar{v1::DType_Scalar_descriptor(), &scalar_name};
  EnumTable<AddrSpace, kNumAddrSpaces> addrspace{v1::DType_AddrSpace_descriptor(), &addrspace_name};
  EnumTable<AxisType, kNumAxisTypes> axis{v1::RangeArg_AxisType_descriptor(), &axis_type_name};
  EnumTable<ReduceOp, kNumReduceOps> reduce{v1::ReduceOpArg_Kind_descriptor(), &reduce_op_name};
  EnumTable<CustomFunctionKind, kNumCustomFunctionKinds> custom{v1::CustomFunctionArg_Kind_descriptor(),
                                                                &custom_function_kind_name};
};

const Tables& tables() {
  static const Tables t;  // built once; C++ makes the first use thread-safe
  return t;
}

// The oneof field of Node that carries each arg kind.
v1::Node::ArgCase arg_case_of(ArgKind k) {
  using N = v1::Node;
  switch (k) {
    case ArgKind::None: return N::ARG_NOT_SET;
    case ArgKind::Const: return N::kConstValue;
    case ArgKind::VConst: return N::kVconst;
    case ArgKind::Int: return N::kIntValue;
    case ArgKind::Ints: return N::kInts;
    case ArgKind::Bools: return N::kBools;
    case ArgKind::Range: return N::kRange;
    case ArgKind::ReduceAxis: return N::kReduceAxis;
    case ArgKind::ReduceOp: return N::kReduceOp;
    case ArgKind::Buffer: return N::kBuffer;
    case ArgKind::BufferView: return N::kBufferView;
    case ArgKind::Bufferize: return N::kBufferize;
    case ArgKind::Param: return N::kParam;
    case ArgKind::DefineVar: return N::kDefineVar;
    case ArgKind::DefineReg: return N::kDefineReg;
    case ArgKind::Str: return N::kStr;
    case ArgKind::Bytes: return N::kBytesValue;
    case ArgKind::AxisFactors: return N::kAxisFactors;
    case ArgKind::Wmma: return N::kWmma;
    case ArgKind::CallInfo: return N::kCallInfo;
    case ArgKind::KernelInfo: return N::kKernelInfo;
    case ArgKind::Device: return N::kDevice;
    case ArgKind::CustomFunction: return N::kCustomFunction;
  }
  die("unhandled ArgKind");
}

// SINK, CALL and FUNCTION are written by hand often enough that their plain form may
// leave the arg out; everything else states its arg, so a forgotten one is an error.
bool arg_may_be_omitted(ArgKind k) { return k == ArgKind::KernelInfo || k == ArgKind::CallInfo; }

std::string arg_field_name(v1::Node::ArgCase c) {
  if (c == v1::Node::ARG_NOT_SET) return "none";
  return v1::Node::descriptor()->FindFieldByNumber(c)->name();
}

// ---------------------------------------------------------------------------------------
// Decoding

using Pairs = std::vector<std::pair<int64_t, int64_t>>;

// Checks and converts one wire node; index_ and (once known) op_ name it in every message.
class NodeDecoder {
 public:
  NodeDecoder(const Tables& t, const DecodeLimits& limits, uint32_t index, const v1::Node& node)
      : t_(t), limits_(limits), index_(index), node_(node) {}

  absl::StatusOr<const UOp*> decode(Graph& graph, const std::vector<const UOp*>& earlier,
                                    std::vector<const UOp*>& src) {
    std::optional<Op> op = t_.op.from_wire(node_.op());
    if (!op) return error(kOp, cat("op ", static_cast<int>(node_.op()), " is not a known uop.v1.Op"));
    op_ = *op;
    const OpInfo& info = op_info(*op);
    CODEC_TRY(sources(info, earlier, src));
    DType dtype;
    CODEC_TRY(decode_dtype(&dtype));
    Arg arg;
    CODEC_TRY(decode_arg(info.arg, dtype, &arg));
    return graph.make(*op, dtype, src, std::move(arg));
  }

 private:
  absl::Status error(std::string_view tag, const std::string& what) const {
    std::string head = op_ ? cat("node ", index_, " (", op_name(*op_), ")") : cat("node ", index_);
    return absl::InvalidArgumentError(cat(head, ": ", what, " [", tag, "]"));
  }

  absl::Status sources(const OpInfo& info, const std::vector<const UOp*>& earlier,
                       std::vector<const UOp*>& src) const {
    size_t n = static_cast<size_t>(node_.src_size());
    if (n > limits_.max_sources)
      return error(kLimits, cat("has ", n, " sources, more than max_sources ", limits_.max_sources));
    if (n < static_cast<size_t>(info.min_src) || (info.max_src >= 0 && n > static_cast<size_t>(info.max_src))) {
      std::string takes = info.max_src < 0         ? cat("at least ", info.min_src)
                          : info.min_src == info.max_src ? cat(info.min_src)
                                                        : cat(info.min_src, " to ", info.max_src);
      return error(kSourceCount, cat("has ", n, n == 1 ? " source" : " sources", "; ", info.name, " takes ", takes));
    }
    src.clear();
    for (size_t k = 0; k < n; ++k) {
      uint32_t s = node_.src(static_cast<int>(k));
      if (s >= index_)  // also catches self-references and indices past the end
        return error(kTopological, cat("source ", k, " refers to node ", s, ", which does not come before it"));
      src.push_back(earlier[s]);
    }
    return absl::OkStatus();
  }

  absl::Status decode_dtype(DType* out) const {
    *out = DType();
    if (!node_.has_dtype()) return absl::OkStatus();
    const v1::DType& d = node_.dtype();
    std::optional<Scalar> scalar = t_.scalar.from_wire(d.scalar());
    if (!scalar) return enum_error("dtype scalar", d.scalar(), t_.scalar.proto_name());
    DType dt(*scalar);
    if (d.has_count()) {
      if (d.count() > limits_.max_vector_width)
        return error(kLimits, cat("dtype count ", d.count(), " is more than max_vector_width ", limits_.max_vector_width));
      // Width 0 means "no elements", which only the empty shape (rank 0) needs.
      if (d.count() == 0 && !(op_ == Op::VCONST && *scalar == Scalar::Index && !d.ptr()))
        return error(kDType, "dtype count 0 is only for a VCONST of index (the empty shape)");
      dt.count = d.count();
    }
    if (d.ptr()) {
      std::optional<AddrSpace> as = t_.addrspace.from_wire(d.addrspace());
      if (!as) return enum_error("dtype addrspace", d.addrspace(), t_.addrspace.proto_name());
      if (d.has_size() && d.size() < 0)
        return error(kDType, cat("pointer size ", d.size(), " is negative; leave it out when unknown"));
      dt = dt.ptr_to(*as, d.has_size() ? d.size() : -1);
    } else if (d.addrspace() != 0 || d.has_size()) {
      // Non-default here would make two nodes that print and digest the same compare unequal.
      return error(kDType, "addrspace and size are for pointers only");
    }
    *out = dt;
    return absl::OkStatus();
  }

  absl::Status enum_error(std::string_view what, int number, const std::string& proto_enum) const {
    return error(kEnum, cat(what, " ", number, " is not a known ", proto_enum));
  }

  template <typename E, int N>
  absl::Status enum_value(const EnumTable<E, N>& table, int number, std::string_view what, E* out) const {
    std::optional<E> e = table.from_wire(number);
    if (!e) return enum_error(what, number, table.proto_name());
    *out = *e;
    return absl::OkStatus();
  }

  absl::Status str(const std::string& s, std::string_view what, std::string* out) const {
    if (s.size() > limits_.max_arg_bytes)
      return error(kLimits, cat(what, " has ", s.size(), " bytes, more than max_arg_bytes ", limits_.max_arg_bytes));
    *out = s;
    return absl::OkStatus();
  }

  absl::Status list_size(int n, std::string_view what) const {
    if (static_cast<uint64_t>(n) > limits_.max_vector_width)
      return error(kLimits, cat(what, " has ", n, " entries, more than max_vector_width ", limits_.max_vector_width));
    return absl::OkStatus();
  }

  absl::Status strs(const gpb::RepeatedPtrField<std::string>& in, std::string_view what,
                    std::vector<std::string>* out) const {
    CODEC_TRY(list_size(in.size(), what));
    out->resize(static_cast<size_t>(in.size()));
    for (int i = 0; i < in.size(); ++i) CODEC_TRY(str(in.Get(i), what, &(*out)[i]));
    return absl::OkStatus();
  }

  absl::Status ints(const gpb::RepeatedField<int64_t>& in, std::string_view what, std::vector<int64_t>* out) const {
    CODEC_TRY(list_size(in.size(), what));
    out->assign(in.begin(), in.end());
    return absl::OkStatus();
  }

  absl::Status pairs(const gpb::RepeatedPtrField<v1::AxisFactor>& in, std::string_view what, Pairs* out) const {
    CODEC_TRY(list_size(in.size(), what));
    out->clear();
    for (const v1::AxisFactor& f : in) out->emplace_back(f.axis(), f.factor());
    return absl::OkStatus();
  }

  // Constants must be exact values of their dtype, so that one value has one encoding
  // and one digest.
  absl::Status value_type(const DType& dtype) const {
    if (dtype.ptr || dtype.scalar == Scalar::Void)
      return error(kConst, cat("a constant of type ", dtype.str(), " cannot hold a value"));
    return absl::OkStatus();
  }

  absl::Status value(const v1::ConstValue& in, Scalar type, const std::string& what, ConstValue* out) const {
    static constexpr std::string_view kField[] = {"b", "i", "u", "f"};  // by ConstValue::Kind
    switch (in.value_case()) {
      case v1::ConstValue::kB: *out = ConstValue::Bool(in.b()); break;
      case v1::ConstValue::kI: *out = ConstValue::Int(in.i()); break;
      case v1::ConstValue::kU: *out = ConstValue::UInt(in.u()); break;
      case v1::ConstValue::kF: *out = ConstValue::Float(in.f()); break;
      case v1::ConstValue::VALUE_NOT_SET: return error(kConst, cat(what, " has no value set"));
    }
    ConstValue::Kind want = ConstValue::kind_of(type);
    if (out->kind() != want)
      return error(kConst, cat(what, " is set in field ", kField[static_cast<int>(out->kind())], " but a ",
                               scalar_name(type), " goes in field ", kField[static_cast<int>(want)]));
    if (!is_value_of(*out, type))
      return error(kConst, cat(what, " ", out->str(), " is not a ", scalar_name(type), " value"));
    return absl::OkStatus();
  }

  absl::Status decode_arg(ArgKind kind, const DType& dtype, Arg* out) const {
    v1::Node::ArgCase want = arg_case_of(kind), got = node_.arg_case();
    if (got != want) {
      if (got == v1::Node::ARG_NOT_SET && arg_may_be_omitted(kind)) {
        *out = default_arg(kind);
        return absl::OkStatus();
      }
      if (want == v1::Node::ARG_NOT_SET) return error(kArgKind, cat("takes no arg but has ", arg_field_name(got)));
      if (got == v1::Node::ARG_NOT_SET) return error(kArgKind, cat("takes a ", arg_field_name(want), " arg but has none"));
      return error(kArgKind, cat("takes a ", arg_field_name(want), " arg but has ", arg_field_name(got)));
    }
    const v1::Node& n = node_;
    switch (kind) {
      case ArgKind::None: *out = NoArg{}; break;
      case ArgKind::Const: {
        CODEC_TRY(value_type(dtype));
        ConstValue v;
        CODEC_TRY(value(n.const_value(), dtype.scalar, "value", &v));
        *out = v;
        break;
      }
      case ArgKind::VConst: {
        CODEC_TRY(value_type(dtype));
        const auto& values = n.vconst().values();
        if (static_cast<uint64_t>(values.size()) != dtype.count)
          return error(kConst, cat("has ", values.size(), " values for a dtype of width ", dtype.count));
        VConstArg a;
        a.values.resize(static_cast<size_t>(values.size()));
        for (int i = 0; i < values.size(); ++i)
          CODEC_TRY(value(values.Get(i), dtype.scalar, cat("value ", i), &a.values[i]));
        *out = std::move(a);
        break;
      }
      case ArgKind::Int: *out = IntArg{n.int_value()}; break;
      case ArgKind::Ints: {
        IntsArg a;
        CODEC_TRY(ints(n.ints().values(), "ints", &a.values));
        *out = std::move(a);
        break;
      }
      case ArgKind::Bools: {
        CODEC_TRY(list_size(n.bools().values_size(), "bools"));
        *out = BoolsArg{std::vector<bool>(n.bools().values().begin(), n.bools().values().end())};
        break;
      }
      case ArgKind::Range: {
        RangeArg a{n.range().axis_id(), AxisType::Loop, n.range().renumbered()};
        CODEC_TRY(enum_value(t_.axis, n.range().type(), "range type", &a.type));
        *out = a;
        break;
      }
      case ArgKind::ReduceAxis: {
        ReduceAxisArg a;
        CODEC_TRY(enum_value(t_.reduce, n.reduce_axis().op(), "reduce op", &a.op));
        CODEC_TRY(ints(n.reduce_axis().axes(), "reduce axes", &a.axes));
        *out = std::move(a);
        break;
      }
      case ArgKind::ReduceOp: {
        ReduceOpArg a;
        CODEC_TRY(enum_value(t_.reduce, n.reduce_op().op(), "reduce op", &a.op));
        *out = a;
        break;
      }
      case ArgKind::Buffer: *out = BufferArg{n.buffer().size()}; break;
      case ArgKind::BufferView: *out = BufferViewArg{n.buffer_view().size(), n.buffer_view().offset()}; break;
      case ArgKind::Bufferize: {
        const v1::BufferizeArg& b = n.bufferize();
        BufferizeArg a;
        CODEC_TRY(str(b.device(), "bufferize device", &a.device));
        CODEC_TRY(enum_value(t_.addrspace, b.addrspace(), "bufferize addrspace", &a.addrspace));
        a.removable = b.removable();
        *out = std::move(a);
        break;
      }
      case ArgKind::Param: *out = ParamArg{n.param().slot(), n.param().size()}; break;
      case ArgKind::DefineVar: {
        DefineVarArg a;
        CODEC_TRY(str(n.define_var().name(), "define_var name", &a.name));
        a.min = n.define_var().min();
        a.max = n.define_var().max();
        *out = std::move(a);
        break;
      }
      case ArgKind::DefineReg: *out = DefineRegArg{n.define_reg().size(), n.define_reg().id()}; break;
      case ArgKind::Str: {
        StrArg a;
        CODEC_TRY(str(n.str(), "str", &a.value));
        *out = std::move(a);
        break;
      }
      case ArgKind::Bytes: {
        BytesArg a;
        CODEC_TRY(str(n.bytes_value(), "bytes_value", &a.value));
        *out = std::move(a);
        break;
      }
      case ArgKind::AxisFactors: {
        AxisFactorsArg a;
        CODEC_TRY(pairs(n.axis_factors().factors(), "axis_factors", &a.factors));
        *out = std::move(a);
        break;
      }
      case ArgKind::Wmma: {
        const v1::WmmaArg& w = n.wmma();
        WmmaArg a;
        CODEC_TRY(str(w.name(), "wmma name", &a.name));
        a.n = w.n();
        a.m = w.m();
        a.k = w.k();
        CODEC_TRY(enum_value(t_.scalar, w.dtype_in(), "wmma dtype_in", &a.dtype_in));
        CODEC_TRY(enum_value(t_.scalar, w.dtype_out(), "wmma dtype_out", &a.dtype_out));
        CODEC_TRY(str(w.device(), "wmma device", &a.device));
        a.threads = w.threads();
        CODEC_TRY(pairs(w.upcast_a(), "wmma upcast_a", &a.upcast_a));
        CODEC_TRY(pairs(w.upcast_b(), "wmma upcast_b", &a.upcast_b));
        CODEC_TRY(pairs(w.upcast_c(), "wmma upcast_c", &a.upcast_c));
        CODEC_TRY(pairs(w.reduce_axes(), "wmma reduce_axes", &a.reduce_axes));
        a.tile_grid_x = w.tile_grid_x();
        a.tile_grid_y = w.tile_grid_y();
        *out = std::move(a);
        break;
      }
      case ArgKind::CallInfo: {
        const v1::CallInfo& c = n.call_info();
        CallInfoArg a;
        CODEC_TRY(str(c.name(), "call_info name", &a.name));
        CODEC_TRY(str(c.grad_tag(), "call_info grad_tag", &a.grad_tag));
        CODEC_TRY(strs(c.metadata(), "call_info metadata", &a.metadata));
        a.precompile = c.precompile();
        a.precompile_backward = c.precompile_backward();
        *out = std::move(a);
        break;
      }
      case ArgKind::KernelInfo: {
        KernelInfoArg a;
        a.kernel = n.kernel_info().kernel();
        CODEC_TRY(str(n.kernel_info().name(), "kernel_info name", &a.name));
        *out = std::move(a);
        break;
      }
      case ArgKind::Device: {
        DeviceArg a;
        CODEC_TRY(strs(n.device().devices(), "devices", &a.devices));
        *out = std::move(a);
        break;
      }
      case ArgKind::CustomFunction: {
        CustomFunctionArg a;
        CODEC_TRY(enum_value(t_.custom, n.custom_function().kind(), "custom_function kind", &a.kind));
        CODEC_TRY(str(n.custom_function().name(), "custom_function name", &a.name));
        *out = std::move(a);
        break;
      }
    }
    return absl::OkStatus();
  }

  const Tables& t_;
  const DecodeLimits& limits_;
  uint32_t index_;
  const v1::Node& node_;
  std::optional<Op> op_;
};

// ---------------------------------------------------------------------------------------
// Encoding

void write_value(const ConstValue& c, v1::ConstValue* out) {
  switch (c.kind()) {
    case ConstValue::Kind::Bool: out->set_b(c.as_bool()); break;
    case ConstValue::Kind::Int: out->set_i(c.as_int()); break;
    case ConstValue::Kind::UInt: out->set_u(c.as_uint()); break;
    case ConstValue::Kind::Float: out->set_f(c.as_float()); break;
  }
}

void write_pairs(const Pairs& in, gpb::RepeatedPtrField<v1::AxisFactor>* out) {
  for (const auto& [axis, factor] : in) {
    v1::AxisFactor* f = out->Add();
    f->set_axis(axis);
    f->set_factor(factor);
  }
}

void write_dtype(const Tables& t, const DType& d, v1::DType* out) {
  out->set_scalar(static_cast<v1::DType::Scalar>(t.scalar.to_wire(d.scalar)));
  if (d.count != 1) out->set_count(d.count);
  if (!d.ptr) return;
  out->set_ptr(true);
  out->set_addrspace(static_cast<v1::DType::AddrSpace>(t.addrspace.to_wire(d.addrspace)));
  if (d.size >= 0) out->set_size(d.size);
}

struct ArgWriter {
  const Tables& t;
  v1::Node* n;

  void operator()(const NoArg&) {}
  void operator()(const ConstValue& c) { write_value(c, n->mutable_const_value()); }
  void operator()(const VConstArg& a) {
    v1::VConstArg* v = n->mutable_vconst();
    for (const ConstValue& c : a.values) write_value(c, v->add_values());
  }
  void operator()(const IntArg& a) { n->set_int_value(a.value); }
  void operator()(const IntsArg& a) { n->mutable_ints()->mutable_values()->Add(a.values.begin(), a.values.end()); }
  void operator()(const BoolsArg& a) {
    v1::BoolList* b = n->mutable_bools();
    for (bool x : a.values) b->add_values(x);
  }
  void operator()(const RangeArg& a) {
    v1::RangeArg* r = n->mutable_range();
    r->set_axis_id(a.axis_id);
    r->set_type(static_cast<v1::RangeArg::AxisType>(t.axis.to_wire(a.type)));
    r->set_renumbered(a.renumbered);
  }
  void operator()(const ReduceAxisArg& a) {
    v1::ReduceAxisArg* r = n->mutable_reduce_axis();
    r->set_op(static_cast<v1::ReduceOpArg::Kind>(t.reduce.to_wire(a.op)));
    r->mutable_axes()->Add(a.axes.begin(), a.axes.end());
  }
  void operator()(const ReduceOpArg& a) {
    n->mutable_reduce_op()->set_op(static_cast<v1::ReduceOpArg::Kind>(t.reduce.to_wire(a.op)));
  }
  void operator()(const BufferArg& a) { n->mutable_buffer()->set_size(a.size); }
  void operator()(const BufferViewArg& a) {
    n->mutable_buffer_view()->set_size(a.size);
    n->mutable_buffer_view()->set_offset(a.offset);
  }
  void operator()(const BufferizeArg& a) {
    v1::BufferizeArg* b = n->mutable_bufferize();
    b->set_device(a.device);
    b->set_addrspace(static_cast<v1::DType::AddrSpace>(t.addrspace.to_wire(a.addrspace)));
    b->set_removable(a.removable);
  }
  void operator()(const ParamArg& a) {
    n->mutable_param()->set_slot(a.slot);
    n->mutable_param()->set_size(a.size);
  }
  void operator()(const DefineVarArg& a) {
    v1::DefineVarArg* v = n->mutable_define_var();
    v->set_name(a.name);
    v->set_min(a.min);
    v->set_max(a.max);
  }
  void operator()(const DefineRegArg& a) {
    n->mutable_define_reg()->set_size(a.size);
    n->mutable_define_reg()->set_id(a.id);
  }
  void operator()(const StrArg& a) { n->set_str(a.value); }
  void operator()(const BytesArg& a) { n->set_bytes_value(a.value); }
  void operator()(const AxisFactorsArg& a) { write_pairs(a.factors, n->mutable_axis_factors()->mutable_factors()); }
  void operator()(const WmmaArg& a) {
    v1::WmmaArg* w = n->mutable_wmma();
    w->set_name(a.name);
    w->set_n(a.n);
    w->set_m(a.m);
    w->set_k(a.k);
    w->set_dtype_in(static_cast<v1::DType::Scalar>(t.scalar.to_wire(a.dtype_in)));
    w->set_dtype_out(static_cast<v1::DType::Scalar>(t.scalar.to_wire(a.dtype_out)));
    w->set_device(a.device);
    w->set_threads(a.threads);
    write_pairs(a.upcast_a, w->mutable_upcast_a());
    write_pairs(a.upcast_b, w->mutable_upcast_b());
    write_pairs(a.upcast_c, w->mutable_upcast_c());
    write_pairs(a.reduce_axes, w->mutable_reduce_axes());
    w->set_tile_grid_x(a.tile_grid_x);
    w->set_tile_grid_y(a.tile_grid_y);
  }
  void operator()(const CallInfoArg& a) {
    if (a == CallInfoArg{}) return;  // the plain form: nothing to say
    v1::CallInfo* c = n->mutable_call_info();
    c->set_name(a.name);
    c->set_grad_tag(a.grad_tag);
    for (const std::string& m : a.metadata) c->add_metadata(m);
    c->set_precompile(a.precompile);
    c->set_precompile_backward(a.precompile_backward);
  }
  void operator()(const KernelInfoArg& a) {
    if (a == KernelInfoArg{}) return;
    n->mutable_kernel_info()->set_kernel(a.kernel);
    n->mutable_kernel_info()->set_name(a.name);
  }
  void operator()(const DeviceArg& a) {
    v1::DeviceArg* d = n->mutable_device();  // set even when empty: the oneof says DEVICE has an arg
    for (const std::string& dev : a.devices) d->add_devices(dev);
  }
  void operator()(const CustomFunctionArg& a) {
    v1::CustomFunctionArg* c = n->mutable_custom_function();
    c->set_kind(static_cast<v1::CustomFunctionArg::Kind>(t.custom.to_wire(a.kind)));
    c->set_name(a.name);
  }
};

#undef CODEC_TRY

}  // namespace

absl::StatusOr<const UOp*> decode_node(const v1::Node& node, uint32_t index, const DecodeLimits& limits,
                                       const std::vector<const UOp*>& earlier, std::vector<const UOp*>& src,
                                       Graph& graph) {
  return NodeDecoder(tables(), limits, index, node).decode(graph, earlier, src);
}

void encode_node(const UOp* u, const WireIndex& index, v1::Node* out) {
  const Tables& t = tables();
  out->set_op(static_cast<v1::Op>(t.op.to_wire(u->op())));
  if (!(u->dtype() == DType())) write_dtype(t, u->dtype(), out->mutable_dtype());
  out->mutable_src()->Reserve(static_cast<int>(u->num_src()));
  for (const UOp* s : u->src()) out->add_src(index.at(s));
  std::visit(ArgWriter{t, out}, u->arg());
}

}  // namespace uop::codec_internal
