// import_model: parse, check every operator has a handler, bind the graph inputs and
// initializers, run each node's handler in order (ONNX lists nodes topologically), and
// gather the outputs into a SINK.
#include "compiler/onnx/importer.h"

#include <algorithm>
#include <set>

#include "compiler/onnx/import_context.h"
#include "compiler/onnx/tensor_proto.h"
#include "compiler/onnx/tensor_proto_internal.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop::onnx_import {

namespace {

absl::StatusOr<onnx::ModelProto> parse_model(std::string_view bytes) {
  onnx::ModelProto m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return absl::InvalidArgumentError("not an ONNX model (ModelProto did not parse)");
  return m;
}

std::string registry_key(const onnx::NodeProto& n) {
  if (n.domain().empty() || n.domain() == "ai.onnx") return n.op_type();
  return cat(n.domain(), ":", n.op_type());
}

int default_opset(const onnx::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return static_cast<int>(o.version());
  return 1;
}

std::vector<std::string> missing_ops(const onnx::GraphProto& g) {
  std::set<std::string> missing;
  const Registry& r = registry();
  for (const auto& n : g.node())
    if (!r.contains(registry_key(n))) missing.insert(registry_key(n));
  return {missing.begin(), missing.end()};
}

// Outputs that are plain views of a BUFFER are copied into their own buffer: an output is
// a new buffer, never an alias of an input.
const UOp* materialized(TensorBuilder& tb, const UOp* u) {
  const UOp* base = u;
  while (base->op() == Op::RESHAPE) base = base->src(0);
  if (base->op() == Op::BUFFER) return tb.contiguous(u);
  return u;
}

}  // namespace

absl::StatusOr<std::vector<ModelInput>> model_inputs(std::string_view model_bytes) {
  ONNX_ASSIGN(onnx::ModelProto m, parse_model(model_bytes));
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  std::vector<ModelInput> out;
  for (const auto& in : m.graph().input()) {
    if (inits.contains(in.name())) continue;
    ModelInput mi{in.name(), std::nullopt};
    if (in.type().has_tensor_type()) {
      const auto& tt = in.type().tensor_type();
      mi.dtype = scalar_from_onnx(tt.elem_type());
      if (tt.has_shape()) {
        std::vector<int64_t> dims;
        bool numeric = true;
        for (const auto& d : tt.shape().dim()) {
          numeric &= d.has_dim_value() && d.dim_value() >= 0;
          dims.push_back(d.dim_value());
        }
        if (numeric) mi.shape = std::move(dims);
      }
    }
    out.push_back(std::move(mi));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> operator_types(std::string_view model_bytes) {
  ONNX_ASSIGN(onnx::ModelProto m, parse_model(model_bytes));
  std::set<std::string> ops;
  for (const auto& n : m.graph().node()) ops.insert(registry_key(n));
  return std::vector<std::string>(ops.begin(), ops.end());
}

absl::StatusOr<std::vector<std::string>> unsupported_operators(std::string_view model_bytes) {
  ONNX_ASSIGN(onnx::ModelProto m, parse_model(model_bytes));
  return missing_ops(m.graph());
}

absl::StatusOr<ImportedModel> import_model(std::string_view model_bytes,
                                           const std::map<std::string, HostTensor>& inputs,
                                           ImportOptions options) {
  ONNX_ASSIGN(onnx::ModelProto m, parse_model(model_bytes));
  const onnx::GraphProto& g = m.graph();
  if (auto missing = missing_ops(g); !missing.empty())
    return absl::UnimplementedError(cat("unsupported operator", missing.size() > 1 ? "s" : "", ": ", join(missing, ", ")));
  for (const auto& o : m.opset_import())
    if (!o.domain().empty() && o.domain() != "ai.onnx" && o.domain() != "ai.onnx.ml")
      return absl::UnimplementedError(cat("operator set domain '", o.domain(), "' is not supported"));
  const int opset = default_opset(m);

  ImportedModel out;
  out.graph = std::make_unique<Graph>();
  ImportState st(*out.graph, options.max_data_bytes);

  std::set<std::string> inits;
  for (const auto& t : g.initializer()) {
    inits.insert(t.name());
    auto it = inputs.find(t.name());
    Value v;
    if (it != inputs.end()) {
      v.constant = it->second;
    } else {
      ONNX_ASSIGN(HostTensor ht, tensor_from_proto(t, cat("initializer '", t.name(), "'")));
      v.constant = std::move(ht);
    }
    v.dtype = v.constant->dtype;
    v.shape = v.constant->shape;
    st.set(t.name(), std::move(v));
  }
  for (const auto& in : g.input()) {
    if (inits.contains(in.name())) continue;
    auto it = inputs.find(in.name());
    if (it == inputs.end()) return absl::InvalidArgumentError(cat("model input '", in.name(), "' is not given"));
    if (!in.type().has_tensor_type())
      return absl::UnimplementedError(cat("model input '", in.name(), "': only tensor inputs are supported"));
    std::optional<Scalar> s = scalar_from_onnx(in.type().tensor_type().elem_type());
    if (!s)
      return absl::UnimplementedError(cat("model input '", in.name(), "': element type ",
                                          onnx_type_name(in.type().tensor_type().elem_type()), " is not supported"));
    if (*s != it->second.dtype)
      return absl::InvalidArgumentError(cat("model input '", in.name(), "' is ", scalar_name(*s), ", given ",
                                            scalar_name(it->second.dtype)));
    Value v;
    v.dtype = *s;
    v.shape = it->second.shape;
    if (it->second.numel() == 0) v.constant = it->second;  // usable where a value is read at import (axes)
    else v.node = st.buffer_for(it->second, in.name(), /*known=*/options.inputs_known);
    st.set(in.name(), std::move(v));
  }

  const Registry& reg = registry();
  std::set<std::string> op_types;
  for (const auto& node : g.node()) {
    const OpDef& def = reg.at(registry_key(node));
    op_types.insert(registry_key(node));
    NodeContext nc(st, node, opset);
    for (const auto& a : node.attribute()) {
      if (std::find(def.attrs.begin(), def.attrs.end(), a.name()) == def.attrs.end())
        return nc.unsupported(cat("attribute '", a.name(), "' is not supported"));
    }
    ONNX_TRY(def.fn(nc));
    ONNX_TRY(st.failure());
    if (options.max_graph_nodes > 0 && out.graph->size() > options.max_graph_nodes)
      return absl::ResourceExhaustedError(cat("the model's graph has ", out.graph->size(), " nodes after node '",
                                              node.name().substr(0, 64), "' (", registry_key(node), "), over the limit of ",
                                              options.max_graph_nodes));
    for (int i = 0; i < node.output_size(); ++i) {
      if (node.output(i).empty()) continue;
      Value* v = st.find(node.output(i));
      if (!v) return nc.unsupported(cat("output ", i, " ('", node.output(i), "') is not produced"));
      if (!v->constant && checked_numel(v->shape).value_or(0) == 0)
        return nc.unsupported(cat("output '", node.output(i), "' has no elements (empty tensors are not supported)"));
    }
  }

  std::vector<const UOp*> outs;
  for (const auto& o : g.output()) {
    Value* v = st.find(o.name());
    if (!v) return absl::InvalidArgumentError(cat("model output '", o.name(), "' is never produced"));
    if (checked_numel(v->shape).value_or(0) == 0)
      return absl::UnimplementedError(cat("model output '", o.name(), "' is empty (empty tensors are not supported)"));
    outs.push_back(materialized(st.tb(), st.node_of(*v)));
    out.outputs.push_back({o.name(), v->dtype, v->shape});
  }
  out.root = st.tb().sink(outs);
  for (const UOp* u : toposort(out.root)) {
    if (u->op() != Op::BUFFER) continue;
    auto it = st.known().find(u);
    if (it == st.known().end()) return absl::InternalError("a BUFFER of the imported graph has no data");
    out.bindings.emplace_back(u, it->second);
    auto n = st.buffer_names().find(u);
    if (n != st.buffer_names().end()) out.names.emplace_back(n->second, u);
  }
  out.op_types.assign(op_types.begin(), op_types.end());
  return out;
}

absl::StatusOr<ImportedModel> import_for_shapes(std::string_view model_bytes,
                                                const std::map<std::string, std::vector<int64_t>>& shapes,
                                                ImportOptions options,
                                                std::vector<std::pair<std::string, HostTensor>>* placeholders) {
  ASSIGN_OR_RETURN(std::vector<ModelInput> declared, model_inputs(model_bytes));
  std::set<std::string> names;
  for (const auto& in : declared) names.insert(in.name);
  for (const auto& [name, shape] : shapes)
    if (!names.contains(name)) return absl::InvalidArgumentError(cat("the model has no input named '", name.substr(0, 64), "'"));
  // Placeholders of each input's shape: their values are never read (inputs_known=false),
  // only their dtype and shape decide the graph.
  std::map<std::string, HostTensor> given;
  for (const auto& in : declared) {
    if (!in.dtype) return absl::UnimplementedError(cat("model input '", in.name, "' has an element type uopd does not support"));
    std::vector<int64_t> shape;
    if (auto it = shapes.find(in.name); it != shapes.end()) shape = it->second;
    else if (in.shape) shape = *in.shape;
    else return absl::InvalidArgumentError(cat("model input '", in.name, "' has symbolic dimensions: give its shape"));
    std::optional<int64_t> n = checked_numel(shape);
    if (!n || *n > (int64_t{1} << 40))
      return absl::InvalidArgumentError(cat("model input '", in.name, "': shape ", shape_str(shape), " is not a valid size"));
    HostTensor t;
    t.dtype = *in.dtype;
    t.shape = shape;
    // A placeholder is never read, but the importer copies it into the graph's bindings:
    // one element stands in for any input, so a huge declared input costs nothing here.
    t.data.assign(scalar_bytes(t.dtype) * static_cast<size_t>(*n == 0 ? 0 : 1), '\0');
    if (placeholders) placeholders->emplace_back(in.name, t);
    given[in.name] = std::move(t);
  }
  options.inputs_known = false;
  return import_model(model_bytes, given, options);
}

}  // namespace uop::onnx_import
