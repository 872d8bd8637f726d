#include "server/metrics.h"

#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "compiler/support/strings.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace uop::server {

// The sampled families, as a Collectable the Exposer scrapes next to the registry.
class Sampled : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& fn : fns_) {
      for (const SampledFamily& f : fn()) {
        prometheus::MetricFamily mf;
        mf.name = f.name;
        mf.help = f.help;
        mf.type = f.counter ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
        for (const Sample& s : f.samples) {
          prometheus::ClientMetric m;
          for (auto& [k, v] : s.labels) m.label.push_back({k, v});
          if (f.counter) m.counter.value = s.value;
          else m.gauge.value = s.value;
          mf.metric.push_back(std::move(m));
        }
        out.push_back(std::move(mf));
      }
    }
    return out;
  }
  void add(std::function<std::vector<SampledFamily>()> fn) {
    std::lock_guard<std::mutex> l(mu_);
    fns_.push_back(std::move(fn));
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::function<std::vector<SampledFamily>()>> fns_;
};

namespace {
constexpr int kHttpThreads = 8;
constexpr int kHttpRequestTimeoutMs = 10000;
}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<Sampled> sampled = std::make_shared<Sampled>();
  std::unique_ptr<prometheus::Exposer> exposer;
  prometheus::Family<prometheus::Counter>* requests = nullptr;
  prometheus::Histogram* compile = nullptr;
  prometheus::Counter* bytes_in = nullptr;
  prometheus::Counter* bytes_out = nullptr;
  prometheus::Counter* kernels = nullptr;
  prometheus::Family<prometheus::Histogram>* kernel_seconds = nullptr;
  std::mutex kernel_mu;  // Family::Add is thread-safe; the cache of its children is ours
  absl::flat_hash_map<std::string, prometheus::Histogram*> kernel_by_kind;
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::create(const std::string& listen) {
  std::unique_ptr<Metrics> m(new Metrics);
  m->impl_ = std::make_unique<Impl>();
  Impl& i = *m->impl_;
  i.requests = &prometheus::BuildCounter().Name("uopd_requests_total").Help("RPCs by method and status code").Register(*i.registry);
  i.compile = &prometheus::BuildHistogram()
                   .Name("uopd_compile_seconds")
                   .Help("time to lower and compile one kernel (cache misses)")
                   .Register(*i.registry)
                   .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10});
  i.bytes_in = &prometheus::BuildCounter().Name("uopd_bytes_received_total").Help("buffer and tensor bytes received from clients").Register(*i.registry).Add({});
  i.bytes_out = &prometheus::BuildCounter().Name("uopd_bytes_sent_total").Help("buffer and tensor bytes sent to clients").Register(*i.registry).Add({});
  i.kernel_seconds = &prometheus::BuildHistogram()
                          .Name("uopd_kernel_seconds")
                          .Help("one kernel launch as its worker timed it (profiled Runs), by device kind")
                          .Register(*i.registry);
  i.kernels = &prometheus::BuildCounter().Name("uopd_kernels_run_total").Help("kernel launches run on workers").Register(*i.registry).Add({});
  if (!listen.empty()) {
    try {  // prometheus-cpp reports a bind failure by throwing; keep it at this boundary
      // A scraper that opens a connection and sends nothing holds one of the server's
      // threads until its request times out: enough threads that a few such connections
      // leave scrapes served, and a timeout that gives each thread back.
      i.exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
          "listening_ports", listen, "num_threads", std::to_string(kHttpThreads), "request_timeout_ms",
          std::to_string(kHttpRequestTimeoutMs)});
    } catch (const std::exception& e) {
      return absl::UnavailableError(cat("metrics: cannot listen on ", listen, ": ", e.what()));
    }
    i.exposer->RegisterCollectable(i.registry);
    i.exposer->RegisterCollectable(i.sampled);
    auto ports = i.exposer->GetListeningPorts();
    std::string host = listen.substr(0, listen.rfind(':'));
    m->address_ = cat(host, ":", ports.empty() ? 0 : ports[0]);
  }
  return m;
}

Metrics::~Metrics() = default;

void Metrics::request(std::string_view method, absl::StatusCode code) {
  impl_->requests->Add({{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}}).Increment();
}
void Metrics::compile_seconds(double s) { impl_->compile->Observe(s); }
void Metrics::bytes_in(uint64_t n) { impl_->bytes_in->Increment(static_cast<double>(n)); }
void Metrics::bytes_out(uint64_t n) { impl_->bytes_out->Increment(static_cast<double>(n)); }
void Metrics::kernels_run(uint64_t n) { impl_->kernels->Increment(static_cast<double>(n)); }
void Metrics::kernel_seconds(std::string_view kind, double s) {
  prometheus::Histogram* h = nullptr;
  {
    std::lock_guard l(impl_->kernel_mu);
    auto [it, fresh] = impl_->kernel_by_kind.try_emplace(std::string(kind), nullptr);
    if (fresh)
      it->second = &impl_->kernel_seconds->Add(
          {{"kind", std::string(kind)}},
          prometheus::Histogram::BucketBoundaries{1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10});
    h = it->second;
  }
  h->Observe(s);
}
void Metrics::add_sampler(std::function<std::vector<SampledFamily>()> fn) { impl_->sampled->add(std::move(fn)); }

std::string Metrics::scrape() const {
  auto families = impl_->registry->Collect();
  auto more = impl_->sampled->Collect();
  families.insert(families.end(), more.begin(), more.end());
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace uop::server
