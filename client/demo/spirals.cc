// The two-spirals trainer (spirals.h): data, model, one step per Run, and the checks the
// demo prints.
#include "client/demo/spirals.h"

#include <chrono>
#include <cmath>
#include <map>
#include <random>

#include "client/autograd.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"

namespace uop::demo {
namespace {

using client::Tensor;

float at(const HostTensor& t, int64_t i) { return static_cast<float>(t.get(i).to_double()); }

}  // namespace

SpiralsData two_spirals(int64_t n, uint64_t seed, double noise) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> jitter(0.0, noise);
  SpiralsData d;
  d.x = HostTensor::zeros(Scalar::Float32, {2 * n, 2});
  d.y = HostTensor::zeros(Scalar::Float32, {2 * n, 2});
  for (int64_t i = 0; i < n; ++i) {
    // One turn, the radius growing from 0.2 to 1; the second spiral is the first turned
    // by half a circle.
    double t = static_cast<double>(i) / static_cast<double>(n);
    double r = 0.2 + 0.8 * t, angle = 2.0 * M_PI * t;
    for (int c = 0; c < 2; ++c) {
      int64_t row = 2 * i + c;
      double a = angle + c * M_PI;
      d.x.set(2 * row, ConstValue::Float(r * std::cos(a) + jitter(rng)));
      d.x.set(2 * row + 1, ConstValue::Float(r * std::sin(a) + jitter(rng)));
      d.y.set(2 * row + c, ConstValue::Float(1.0));
    }
  }
  return d;
}

SpiralsData random_classes(int64_t rows, int64_t inputs, int64_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> x(-1.0, 1.0);
  std::uniform_int_distribution<int64_t> label(0, classes - 1);
  SpiralsData d;
  d.x = HostTensor::zeros(Scalar::Float32, {rows, inputs});
  d.y = HostTensor::zeros(Scalar::Float32, {rows, classes});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inputs; ++i) d.x.set(r * inputs + i, ConstValue::Float(x(rng)));
    d.y.set(r * classes + label(rng), ConstValue::Float(1.0));
  }
  return d;
}

SpiralsTrainer::SpiralsTrainer(client::Session& session, TrainOptions options)
    : session_(&session),
      opts_(std::move(options)),
      remote_(std::make_unique<client::RemoteRealizer>(session)),
      realizer_(remote_.get()) {
  init();
}

SpiralsTrainer::SpiralsTrainer(client::Realizer& realizer, TrainOptions options)
    : opts_(std::move(options)), realizer_(&realizer) {
  init();
}

void SpiralsTrainer::make_batch() {
  const uint64_t seed = opts_.seed + (opts_.fresh_batches ? 7919 * static_cast<uint64_t>(steps_) : 0);
  data_ = opts_.inputs == 2 && opts_.classes == 2
              ? two_spirals(opts_.points_per_class, seed)
              : random_classes(2 * opts_.points_per_class, opts_.inputs, opts_.classes, seed);
  // The batch: split across the devices by rows.
  x_ = Tensor::from(data_.x, opts_.devices[0], ctx_).shard(opts_.devices, 0);
  y_ = Tensor::from(data_.y, opts_.devices[0], ctx_).shard(opts_.devices, 0);
}

void SpiralsTrainer::init() {
  ctx_ = client::TensorContext::make();
  const auto& devs = opts_.devices;
  make_batch();
  // Parameters: seeded host data, replicated (the same bytes uploaded to every device).
  const int64_t h = opts_.hidden, in = opts_.inputs, out = opts_.classes;
  // On the spirals a wide first layer: its tanh units bend the plane enough from the start.
  const double s1 = in == 2 ? 3.0 : 1.0 / std::sqrt(static_cast<double>(in)), s2 = 1.0 / std::sqrt(static_cast<double>(h));
  struct Init {
    std::vector<int64_t> shape;
    double scale;
  };
  const std::vector<Init> init = {{{in, h}, s1}, {{h}, 0.0}, {{h, h}, s2}, {{h}, 0.0}, {{h, out}, s2}, {{out}, 0.0}};
  uint64_t seed = opts_.seed * 1000;
  for (size_t k = 0; k < init.size(); ++k) {
    const Init& i = init[k];
    Tensor p = (k < opts_.initial_params.size()
                    ? Tensor::from(opts_.initial_params[k], devs[0], ctx_)
                    : Tensor::uniform(i.shape, -i.scale, i.scale, ++seed, Scalar::Float32, devs[0], ctx_))
                   .shard(devs, -1);
    p.requires_grad_();
    params_.push_back(p);
  }
}

absl::StatusOr<StepReport> SpiralsTrainer::step() {
  StepReport rep;
  auto t0 = std::chrono::steady_clock::now();
  if (opts_.fresh_batches && steps_ > 0) make_batch();
  rep.step = ++steps_;
  const Tensor &w1 = params_[0], &b1 = params_[1], &w2 = params_[2], &b2 = params_[3], &w3 = params_[4],
               &b3 = params_[5];
  Tensor h1 = (x_.matmul(w1) + b1).tanh();
  Tensor h2 = (h1.matmul(w2) + b2).tanh();
  Tensor loss = client::cross_entropy(h2.matmul(w3) + b3, y_);
  loss.backward();
  std::vector<Tensor> next;
  for (const Tensor& p : params_) next.push_back((p - p.grad() * opts_.learning_rate).detach());
  std::vector<Tensor> outs = {loss};
  outs.insert(outs.end(), next.begin(), next.end());
  rep.client_ms = ms_since(t0);

  client::RealizeOptions ro;
  // The next parameters replace the current ones in place, in their buffers on the
  // devices; the loss comes back with the Run.
  ro.into.push_back(Tensor());
  ro.into.insert(ro.into.end(), params_.begin(), params_.end());
  ro.inline_host_inputs = opts_.fresh_batches;
  ro.hold_graph = true;
  if (absl::Status s = client::realize_all(outs, *realizer_, ro); !s.ok()) return s;
  for (Tensor& p : next) p.requires_grad_();
  params_ = std::move(next);

  const std::optional<client::RunResult> none;
  const auto& run = remote_ ? remote_->last_run() : none;
  if (run) {
    rep.plan_ms = run->plan_ms;
    rep.compile_ms = run->compile_ms;
    rep.run_ms = run->run_ms;
    rep.allreduce_ms = run->collective_ms;
    for (const client::Kernel& k : run->kernels) {
      ++rep.kernels;
      if (k.status == client::CacheStatus::Hit) ++rep.cache_hits;
      else ++rep.cache_misses;
    }
    rep.plan_cached = rep.cache_misses == 0;
  }
  auto l = loss.to_host();
  if (!l.ok()) return l.status();
  rep.loss = l->get(0).to_double();
  rep.wall_ms = ms_since(t0);
  return rep;
}

absl::Status SpiralsTrainer::check_replicas() {
  if (!remote_) return absl::FailedPreconditionError("replicas are checked in a uopd session");
  const auto& run = remote_->last_run();
  if (!run) return absl::FailedPreconditionError("no step has run yet");
  // Outputs of a multi-device graph come one per device, named "<output>@<device>".
  std::map<std::string, std::vector<const client::RunOutput*>> replicas;
  for (const client::RunOutput& o : run->outputs) {
    auto at_sign = o.name.rfind('@');
    replicas[o.name.substr(0, at_sign)].push_back(&o);
  }
  for (auto& [name, parts] : replicas) {
    if (parts.size() != opts_.devices.size())
      return absl::InternalError(cat(name, ": ", parts.size(), " replicas for ", opts_.devices.size(), " devices"));
    // Kept outputs are downloaded; the others came back with the Run.
    auto data = [&](const client::RunOutput& o) -> absl::StatusOr<HostTensor> {
      if (o.kept()) return session_->download_tensor(o);
      return o.tensor;
    };
    auto first = data(*parts[0]);
    if (!first.ok()) return first.status();
    for (size_t i = 1; i < parts.size(); ++i) {
      auto other = data(*parts[i]);
      if (!other.ok()) return other.status();
      if (other->data != first->data)
        return absl::DataLossError(cat(name, ": ", parts[i]->name, " differs from ", parts[0]->name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HostTensor>> SpiralsTrainer::parameters() {
  std::vector<HostTensor> p;
  for (const Tensor& t : params_) {
    auto h = t.to_host();
    if (!h.ok()) return h.status();
    p.push_back(std::move(*h));
  }
  return p;
}

absl::StatusOr<double> SpiralsTrainer::accuracy() {
  auto params = parameters();
  if (!params.ok()) return params.status();
  const std::vector<HostTensor>& p = *params;
  const int64_t n = data_.x.shape[0], h = opts_.hidden, in = opts_.inputs, classes = opts_.classes;
  int64_t right = 0;
  std::vector<float> a(h), b(h);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      float acc = at(p[1], j);
      for (int64_t i = 0; i < in; ++i) acc += at(data_.x, in * r + i) * at(p[0], i * h + j);
      a[j] = std::tanh(acc);
    }
    for (int64_t j = 0; j < h; ++j) {
      float acc = at(p[3], j);
      for (int64_t k = 0; k < h; ++k) acc += a[k] * at(p[2], k * h + j);
      b[j] = std::tanh(acc);
    }
    int64_t predicted = 0;
    float best = 0;
    for (int64_t c = 0; c < classes; ++c) {
      float logit = at(p[5], c);
      for (int64_t k = 0; k < h; ++k) logit += b[k] * at(p[4], k * classes + c);
      if (c == 0 || logit > best) best = logit, predicted = c;
    }
    right += at(data_.y, classes * r + predicted) > 0.5f;
  }
  return static_cast<double>(right) / static_cast<double>(n);
}

}  // namespace uop::demo
