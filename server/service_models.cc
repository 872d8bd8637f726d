// LoadModel and RunModel: models held by the server (server/models.h).
#include <chrono>

#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"
#include "server/service.h"

namespace uop::server {
namespace {

namespace pb = ::uopd::v1;

// Counts a handler as in flight for its whole run.
class Counted {
 public:
  explicit Counted(std::atomic<uint64_t>& n) : n_(n) { ++n_; }
  ~Counted() { --n_; }

 private:
  std::atomic<uint64_t>& n_;
};

void fill_tensor(const ModelTensorInfo& t, pb::ModelTensor* out) {
  out->set_name(t.name);
  out->set_dtype(static_cast<::uop::v1::DType::Scalar>(t.dtype));
  for (int64_t d : t.shape) out->add_shape(d);
}

}  // namespace

absl::StatusOr<std::string> UopdService::buffer_with(Tenant& tenant, const std::string& session, const std::string& device,
                                                     const HostTensor& data, absl::Time deadline) {
  const std::string& who = tenant.name();
  ASSIGN_OR_RETURN(auto w, d_.workers->worker_for(device, absl::Seconds(10), who));
  BufferInfo b;
  b.device = device;
  b.dtype = data.dtype;
  b.elements = static_cast<uint64_t>(data.numel());
  b.bytes = data.data.size();
  b.worker_buffer = Executor::new_buffer_id(w);
  b.worker_id = w->id();
  b.worker_generation = w->generation();
  auto id = d_.sessions->add_buffer(session, b, who);  // the quota check comes first
  if (!id.ok()) {
    if (id.status().code() == absl::StatusCode::kResourceExhausted) tenant.count_rejection("bytes");
    return id.status();
  }
  absl::Status s = d_.executor->alloc(w, b.worker_buffer, b.bytes, deadline);
  if (s.ok()) {
    s = d_.executor->write(w, b.worker_buffer, 0, data.data, deadline);
    if (!s.ok()) free_buffers({b});
  }
  if (!s.ok()) {
    (void)d_.sessions->remove_buffer(session, *id, who);
    return s;
  }
  return *id;
}

grpc::Status UopdService::LoadModel(grpc::ServerContext* ctx, grpc::ServerReader<pb::LoadModelChunk>* reader,
                                    pb::LoadModelResponse* resp) {
  Counted in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("LoadModel", tenant.status());
  const std::string& who = (*tenant)->name();
  auto t0 = std::chrono::steady_clock::now();
  // The model's bytes as they arrive, held against the request's and the server's budget
  // before they are kept; past the encoded-graph limit the stream is refused unread.
  ByteBudget::Hold held = inflight_.hold(d_.limits.max_request_memory);
  const uint64_t max_model = d_.limits.decode.max_bytes;
  std::string bytes, session;
  std::map<std::string, std::vector<int64_t>> shapes;
  pb::LoadModelChunk c;
  bool first = true;
  while (reader->Read(&c)) {
    if (first) {
      session = c.session_id();
      auto devices = d_.sessions->devices(session, who);
      if (!devices.ok()) return finish("LoadModel", devices.status());
      if (static_cast<uint64_t>(c.input_shapes_size()) > d_.limits.decode.max_vector_width)
        return finish("LoadModel", absl::InvalidArgumentError(cat("LoadModel: ", c.input_shapes_size(), " input shapes; the limit is ", d_.limits.decode.max_vector_width)));
      for (const auto& s : c.input_shapes()) shapes[s.name()] = {s.shape().begin(), s.shape().end()};
      first = false;
    } else if (!c.session_id().empty() || c.input_shapes_size() > 0) {
      return finish("LoadModel", absl::InvalidArgumentError("LoadModel: only the first chunk names the session and input shapes"));
    }
    if (c.data().size() > max_model - bytes.size())
      return finish("LoadModel", absl::ResourceExhaustedError(cat("LoadModel: the model is larger than ", max_model,
                                                                  " bytes, the limit of an encoded graph (--max-request-bytes)")));
    if (absl::Status s = held.grow(c.data().size(), "LoadModel: receiving the model"); !s.ok()) return finish("LoadModel", s);
    bytes.append(c.data());
    c.Clear();
  }
  if (ctx->IsCancelled()) return finish("LoadModel", absl::CancelledError("LoadModel: the client went away"));
  if (first) return finish("LoadModel", absl::InvalidArgumentError("LoadModel: no chunks; the first names the session"));
  if (bytes.empty()) return finish("LoadModel", absl::InvalidArgumentError("LoadModel: the model has no bytes"));
  auto devices = d_.sessions->devices(session, who);
  if (!devices.ok()) return finish("LoadModel", devices.status());

  auto imported = import_model_graph(bytes, shapes, d_.limits.decode);
  if (!imported.ok()) {
    const absl::Status& s = imported.status();
    return finish("LoadModel", absl::Status(s.code(), cat("LoadModel: ", s.message())));
  }
  auto model = std::make_shared<HeldModel>();
  model->graph = imported->graph;
  model->inputs = imported->inputs;
  model->outputs = imported->outputs;
  // The weights become buffers of the session, written once; a failure takes back the
  // ones already made.
  uint64_t weight_bytes = 0;
  auto undo = [&] {
    std::vector<BufferInfo> made;
    for (auto& [name, id] : model->weights)
      if (auto b = d_.sessions->remove_buffer(session, id, who); b.ok()) made.push_back(*b);
    free_buffers(made);
  };
  for (auto& [name, data] : imported->weights) {
    auto id = buffer_with(**tenant, session, devices->front(), data, deadline(ctx));
    if (!id.ok()) {
      undo();
      return finish("LoadModel", absl::Status(id.status().code(), cat("LoadModel: weight ", name, ": ", id.status().message())));
    }
    model->weights.emplace_back(name, *id);
    weight_bytes += data.data.size();
  }
  auto id = d_.sessions->add_model(session, model, who);
  if (!id.ok()) {
    undo();
    return finish("LoadModel", id.status());
  }
  weight_buffers_written_ += model->weights.size();
  weight_bytes_written_ += weight_bytes;
  d_.metrics->bytes_in(bytes.size());
  resp->set_model_id(*id);
  for (const auto& t : model->inputs) fill_tensor(t, resp->add_inputs());
  for (const auto& t : model->outputs) fill_tensor(t, resp->add_outputs());
  resp->set_weight_buffers(model->weights.size());
  resp->set_weight_bytes(weight_bytes);
  resp->set_import_ms(ms_since(t0));
  return finish("LoadModel", absl::OkStatus());
}

grpc::Status UopdService::RunModel(grpc::ServerContextBase* ctx, pb::RunModelRequest* req, pb::RunResponse* resp,
                                   ByteBudget::Hold& held) {
  Counted in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("RunModel", tenant.status());
  const std::string& who = (*tenant)->name();
  auto devices = d_.sessions->devices(req->session_id(), who);
  if (!devices.ok()) return finish("RunModel", devices.status());
  auto model = d_.sessions->model(req->session_id(), req->model_id(), who);
  if (!model.ok()) return finish("RunModel", model.status());
  // The model's inputs as the client binds them, by name only (the graph's wire indices
  // are the server's business); the weights bound to the session's buffers.
  pb::RunRequest run;
  run.set_session_id(req->session_id());
  run.set_keep_outputs(req->keep_outputs());
  for (int i = 0; i < req->inputs_size(); ++i) {
    pb::Binding* b = req->mutable_inputs(i);
    if (b->node_case() != pb::Binding::kName)
      return finish("RunModel", absl::InvalidArgumentError(cat("binding ", i, ": a model's input is bound by its name")));
    bool known = false;
    for (const auto& in : (*model)->inputs) known |= in.name == b->name();
    if (!known) return finish("RunModel", absl::InvalidArgumentError(cat("binding ", i, ": the model has no input named '", b->name().substr(0, 64), "'")));
    run.add_inputs()->Swap(b);  // inline bytes move, never copied
  }
  for (const auto& [name, id] : (*model)->weights) {
    pb::Binding* b = run.add_inputs();
    b->set_name(name);
    b->set_buffer_id(id);
  }
  return finish("RunModel", run_graph(ctx, **tenant, *devices, (*model)->graph, &run, resp, held));
}

}  // namespace uop::server
