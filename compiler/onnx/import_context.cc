// ImportState and NodeContext: values, constants made into nodes on demand, evaluation at
// import time of the small subgraphs that compute shapes, attributes, and checked
// broadcasting for model operands.
#include "compiler/onnx/import_context.h"

#include <optional>
#include <span>

#include "compiler/onnx/tensor_proto_internal.h"
#include "compiler/interp/interp.h"

namespace uop::onnx_import {

namespace {

// Import-time evaluation is for shape arithmetic; a subgraph reading more than this is
// computing data, which belongs in the compiled graph.
constexpr int64_t kMaxEvaluatedElements = int64_t{1} << 20;
// The elements of every node the interpreter computes for one evaluation (it makes each
// node's whole tensor): shape arithmetic over small inputs stays far below this, an Expand
// of a known scalar to a huge shape does not.
constexpr int64_t kMaxEvaluatedWork = int64_t{1} << 24;

// numel * element bytes; nullopt when the shape is not a valid size or the bytes overflow.
std::optional<uint64_t> byte_size(Scalar dtype, std::span<const int64_t> shape) {
  std::optional<int64_t> n = checked_numel(shape);
  uint64_t bytes = 0;
  if (!n || __builtin_mul_overflow(static_cast<uint64_t>(*n), static_cast<uint64_t>(scalar_bytes(dtype)), &bytes))
    return std::nullopt;
  return bytes;
}

}  // namespace

Value* ImportState::find(const std::string& name) {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

const UOp* ImportState::buffer_for(const HostTensor& data, const std::string& name, bool known) {
  const UOp* x = tb_.input(data.dtype, data.shape);
  const UOp* buf = tb_.buffer_of(x);
  HostTensor flat = data;
  flat.shape = {data.numel()};
  known_[buf] = std::move(flat);
  if (!name.empty()) buffer_names_[buf] = name;
  if (!known) placeholders_.insert(buf);
  return x;
}

const UOp* ImportState::node_of(Value& v) {
  if (v.node) return v.node;
  const HostTensor& c = *v.constant;
  if (c.numel() == 1) v.node = tb_.full(c.dtype, c.get(0), c.shape);
  else v.node = buffer_for(c);
  return v.node;
}

absl::StatusOr<HostTensor> ImportState::evaluate(Value& v, const std::string& what) {
  if (v.constant) return *v.constant;
  absl::flat_hash_map<const UOp*, HostTensor> inputs;
  int64_t elements = 0, work = 0;
  const std::vector<const UOp*> nodes = toposort(v.node);
  for (const UOp* u : nodes) {
    if (const std::vector<int64_t>* s = tb_.shape_if(u)) {
      std::optional<int64_t> n = checked_numel(*s);
      work = n && *n <= kMaxEvaluatedWork - work ? work + *n : kMaxEvaluatedWork + 1;
    }
    if (u->op() != Op::BUFFER) continue;
    auto it = known_.find(u);
    if (it == known_.end())
      return absl::UnimplementedError(cat(what, " must be known when the model is imported, and it is not"));
    if (placeholders_.contains(u))
      return absl::UnimplementedError(cat(what, " depends on the value of model input '", buffer_names_[u],
                                          "', which a model held by the server receives only when it runs"));
    elements += it->second.numel();
    inputs[u] = it->second;
  }
  if (elements > kMaxEvaluatedElements)
    return absl::UnimplementedError(cat(what, " depends on ", elements,
                                        " elements of data; only small shape computations are evaluated at import"));
  if (work > kMaxEvaluatedWork)
    return absl::UnimplementedError(cat(what, " computes more than ", kMaxEvaluatedWork,
                                        " elements; only small shape computations are evaluated at import"));
  std::optional<uint64_t> result = byte_size(v.dtype, v.shape);
  if (!result) return absl::InvalidArgumentError(cat(what, ": shape ", shape_str(v.shape), " is not a valid size"));
  if (absl::Status s = spend(*result, what); !s.ok()) return s;
  auto r = interpret(graph(), v.node, inputs);
  if (!r.ok()) return absl::InternalError(cat("evaluating ", what, " at import: ", r.status().message()));
  v.constant = std::move((*r)[0]);
  return *v.constant;
}

absl::Status ImportState::spend(uint64_t bytes, const std::string& what) {
  if (max_data_bytes_ > 0 && bytes > max_data_bytes_ - data_bytes_)
    return absl::ResourceExhaustedError(cat(what, " would make ", bytes, " bytes of data at import, which with the ",
                                            data_bytes_, " already made is over the limit of ", max_data_bytes_));
  data_bytes_ += bytes;
  return absl::OkStatus();
}

// --- NodeContext

absl::StatusOr<Value*> NodeContext::value(int i) {
  if (!has(i)) return invalid(cat("input ", i, " is missing"));
  Value* v = st_.find(node_.input(i));
  if (!v) return invalid(cat("input '", node_.input(i), "' is not defined before this node"));
  return v;
}

absl::StatusOr<const UOp*> NodeContext::in(int i) {
  ONNX_ASSIGN(Value * v, value(i));
  // Empty tensors exist only as import-time values (shape arithmetic); as data they are not
  // supported.
  if (v->constant && v->constant->numel() == 0) return unsupported(cat("input '", node_.input(i), "' is empty (empty tensors are not supported)"));
  return st_.node_of(*v);
}

absl::StatusOr<Scalar> NodeContext::dtype(int i) {
  ONNX_ASSIGN(Value * v, value(i));
  return v->dtype;
}

absl::StatusOr<Dims> NodeContext::shape(int i) {
  ONNX_ASSIGN(Value * v, value(i));
  return v->shape;
}

absl::StatusOr<HostTensor> NodeContext::constant(int i) {
  ONNX_ASSIGN(Value * v, value(i));
  auto t = st_.evaluate(*v, cat(op(), " input ", i, " ('", node_.input(i), "')"));
  if (!t.ok() && t.status().code() == absl::StatusCode::kUnimplemented)
    return absl::UnimplementedError(cat(op(), ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::vector<int64_t>> NodeContext::ints(int i) {
  ONNX_ASSIGN(HostTensor t, constant(i));
  if (!scalar_is_int(t.dtype)) return invalid(cat("input ", i, " must be an integer tensor, not ", scalar_name(t.dtype)));
  std::vector<int64_t> out;
  for (int64_t k = 0; k < t.numel(); ++k) out.push_back(t.get(k).to_int());
  return out;
}

absl::StatusOr<double> NodeContext::scalar(int i) {
  ONNX_ASSIGN(HostTensor t, constant(i));
  if (t.numel() != 1) return invalid(cat("input ", i, " must hold one value, not ", t.numel()));
  return t.get(0).to_double();
}

const onnx::AttributeProto* NodeContext::attr(const std::string& name) const {
  for (const auto& a : node_.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t NodeContext::attr_int(const std::string& name, int64_t def) const {
  const auto* a = attr(name);
  return a ? a->i() : def;
}

float NodeContext::attr_float(const std::string& name, float def) const {
  const auto* a = attr(name);
  return a ? a->f() : def;
}

std::string NodeContext::attr_string(const std::string& name, const std::string& def) const {
  const auto* a = attr(name);
  return a ? a->s() : def;
}

std::vector<int64_t> NodeContext::attr_ints(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) return {};
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::vector<float> NodeContext::attr_floats(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) return {};
  return std::vector<float>(a->floats().begin(), a->floats().end());
}

absl::StatusOr<HostTensor> NodeContext::attr_tensor(const std::string& name) const {
  const auto* a = attr(name);
  if (!a || !a->has_t()) return invalid(cat("attribute '", name, "' must be a tensor"));
  auto t = tensor_from_proto(a->t(), cat(op(), " attribute '", name, "'"));
  return t;
}

void NodeContext::out(int i, const UOp* node) {
  if (!wants(i)) return;
  Value v;
  v.dtype = node->dtype().scalar;
  v.shape = tb().shape(node);
  v.node = node;
  st_.set(node_.output(i), std::move(v));
}

void NodeContext::out_constant(int i, HostTensor t) {
  if (!wants(i)) return;
  Value v;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.constant = std::move(t);
  st_.set(node_.output(i), std::move(v));
}

absl::StatusOr<HostTensor> NodeContext::zeros(Scalar dtype, const Dims& shape) {
  std::optional<uint64_t> bytes = byte_size(dtype, shape);
  if (!bytes) return invalid(cat("shape ", shape_str(shape), " is not a valid size"));
  ONNX_TRY(st_.spend(*bytes, who()));
  return HostTensor::zeros(dtype, shape);
}

std::string NodeContext::who() const { return node_.name().empty() ? op() : cat(op(), " '", node_.name(), "'"); }

absl::Status NodeContext::unsupported(const std::string& why) const {
  return absl::UnimplementedError(cat(op(), ": ", why));
}

absl::Status NodeContext::invalid(const std::string& why) const {
  return absl::InvalidArgumentError(cat(who(), ": ", why));
}

absl::StatusOr<Dims> NodeContext::broadcast(const std::vector<Dims>& shapes) const {
  Dims out;
  for (const Dims& s : shapes) {
    if (s.size() > out.size()) out.insert(out.begin(), s.size() - out.size(), 1);
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[out.size() - s.size() + i];
      if (o == s[i] || s[i] == 1) continue;
      if (o != 1) {
        std::vector<std::string> strs;
        for (const Dims& t : shapes) strs.push_back(shape_str(t));
        return invalid(cat("shapes ", join(strs, ", "), " do not broadcast"));
      }
      o = s[i];
    }
  }
  return out;
}

absl::StatusOr<const UOp*> NodeContext::alu(Op op_, std::vector<const UOp*> src) {
  std::vector<Dims> shapes;
  for (const UOp* s : src) shapes.push_back(shape_of(s));
  ONNX_TRY(broadcast(shapes).status());
  if (src.size() == 1) return tb().alu(op_, {src[0]});
  if (src.size() == 2) return tb().alu(op_, {src[0], src[1]});
  return tb().alu(op_, {src[0], src[1], src[2]});
}

absl::StatusOr<int64_t> NodeContext::axis(int64_t a, int64_t rank) const {
  // A scalar has no axis: every caller indexes the shape by the answer.
  if (a < -rank || a >= rank) return invalid(cat("axis ", a, " is out of range for rank ", rank));
  return a < 0 ? a + rank : a;
}

absl::StatusOr<std::vector<int64_t>> NodeContext::axes(std::vector<int64_t> a, int64_t rank) const {
  std::vector<bool> seen(rank, false);
  for (int64_t& x : a) {
    if (x < -rank || x >= rank) return invalid(cat("axis ", x, " is out of range for rank ", rank));
    if (x < 0) x += rank;
    if (seen[x]) return invalid(cat("axis ", x, " is repeated"));
    seen[x] = true;
  }
  return a;
}

}  // namespace uop::onnx_import
