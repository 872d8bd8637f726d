// Prometheus metrics of uopd (prometheus-cpp): what operators watch. Counters and the
// compile-latency histogram are updated where things happen; values owned elsewhere
// (cache tiers, workers, queues, sessions) are read at scrape time through a callback, so
// there is one source of truth for each. One Exposer per process (it takes ~2 s to
// destroy), serving /metrics on the address given: an operator port, with no credential,
// whose HTTP server has threads and a request timeout enough that a few idle connections
// do not stop scrapes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prometheus {
class Registry;
class Exposer;
class Histogram;
template <typename T>
class Family;
class Counter;
struct MetricFamily;
}  // namespace prometheus

namespace uop::server {

// A value read at scrape time: name, help, type ("counter" / "gauge"), label sets.
struct Sample {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};
struct SampledFamily {
  std::string name, help;
  bool counter = false;
  std::vector<Sample> samples;
};

class Metrics {
 public:
  // `listen` is host:port for /metrics ("" serves nothing; port 0 picks a free one).
  static absl::StatusOr<std::unique_ptr<Metrics>> create(const std::string& listen);
  ~Metrics();

  void request(std::string_view method, absl::StatusCode code);
  void compile_seconds(double s);
  void bytes_in(uint64_t n);
  void bytes_out(uint64_t n);
  void kernels_run(uint64_t n);
  // One launch of a profiled Run, as its worker timed it; `kind` is its device's ("cpu").
  void kernel_seconds(std::string_view kind, double s);
  // Families computed at each scrape.
  void add_sampler(std::function<std::vector<SampledFamily>()> fn);

  // The address /metrics is served on, e.g. 127.0.0.1:9464; empty if none.
  const std::string& address() const { return address_; }
  // The text a scrape would return (for tests and `uop stats`).
  std::string scrape() const;

 private:
  Metrics() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace uop::server
