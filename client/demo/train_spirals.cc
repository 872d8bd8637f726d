// uop-train-demo: data-parallel training of a small MLP on two spirals through uopd, from
// a thin client (no compiler here). Each step is one Run: forward and backward on each
// device's half of the batch, the ALLREDUCE of the gradients, the SGD update. Per step it
// prints the loss, the compile cache's hits and misses for that step's kernels, and the
// step's time split into plan, compile, run and allreduce as uopd measured them. At the
// end it checks that the parameter replicas are bit-identical across the devices.
//
//   uop-train-demo [--server=HOST:PORT] [--steps=N] [--devices=CPU:0,CPU:1]
//                  [--hidden=N] [--points=N] [--lr=X] [--seed=N] [--exact]
//
// --exact prints each step's loss with every digit of its double (%.17g), so that two runs
// (one host's shared memory against Gloo across hosts) can be compared bit for bit.
//
// Exit status: 0 trained and checked; 1 a failure (a Run, the replicas, the cache after
// step 1); 2 usage.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/demo/spirals.h"

namespace {

int usage(const std::string& why) {
  std::cerr << "uop-train-demo: " << why
            << "\nusage: uop-train-demo [--server=HOST:PORT] [--steps=N] [--devices=CPU:0,CPU:1] [--hidden=N]"
               " [--points=N] [--lr=X] [--seed=N] [--exact]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace uop;
  std::string server = getenv("UOPD_ADDRESS") ? getenv("UOPD_ADDRESS") : client::kDefaultAddress;
  int steps = 40;
  bool exact = false;
  demo::TrainOptions opts;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto eq = a.find('=');
      std::string name = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
      if (name == "--server") server = value;
      else if (name == "--steps") steps = std::stoi(value);
      else if (name == "--devices") opts.devices = absl::StrSplit(value, ',');
      else if (name == "--hidden") opts.hidden = std::stoll(value);
      else if (name == "--points") opts.points_per_class = std::stoll(value);
      else if (name == "--lr") opts.learning_rate = std::stod(value);
      else if (name == "--seed") opts.seed = std::stoull(value);
      else if (a == "--exact") exact = true;
      else return usage("unknown argument '" + a + "'");
    }
  } catch (...) {
    return usage("a flag's value is not a number");
  }
  if (steps < 1 || opts.devices.empty() || opts.hidden < 1 || opts.points_per_class < 1)
    return usage("--steps, --hidden and --points must be positive, --devices not empty");

  client::ClientOptions co;
  co.address = server;
  auto c = client::Client::connect(co);
  if (!c.ok()) {
    std::cerr << "uop-train-demo: " << c.status().message() << "\n";
    return 1;
  }
  auto session = (*c)->create_session(opts.devices);
  if (!session.ok()) {
    std::cerr << "uop-train-demo: " << session.status().message() << "\n";
    return 1;
  }
  std::string devs;
  for (const auto& d : opts.devices) devs += (devs.empty() ? "" : ", ") + d;
  std::printf("two spirals: %lld points, MLP 2-%lld-%lld-2, batch sharded over {%s}, SGD lr %g\n",
              static_cast<long long>(2 * opts.points_per_class), static_cast<long long>(opts.hidden),
              static_cast<long long>(opts.hidden), devs.c_str(), opts.learning_rate);
  std::printf("%5s %10s %8s %6s %6s | %8s %9s %8s %10s %8s\n", "step", "loss", "kernels", "hits", "misses", "plan ms",
              "compile ms", "run ms", "allreduce ms", "step ms");

  demo::SpiralsTrainer trainer(*session, opts);
  bool cache_ok = true;
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < steps; ++s) {
    auto r = trainer.step();
    if (!r.ok()) {
      std::cerr << "uop-train-demo: step " << s + 1 << ": " << r.status().message() << "\n";
      return 1;
    }
    if (s == 0) first_loss = r->loss;
    last_loss = r->loss;
    if (r->step >= 2 && r->cache_misses != 0) cache_ok = false;
    std::printf(exact ? "%5d %.17g %8d %6d %6d | %8.2f %9.2f %8.2f %10.2f %8.1f\n"
                      : "%5d %10.6f %8d %6d %6d | %8.2f %9.2f %8.2f %10.2f %8.1f\n", r->step, r->loss, r->kernels, r->cache_hits,
                r->cache_misses, r->plan_ms, r->compile_ms, r->run_ms, r->allreduce_ms, r->wall_ms);
    std::fflush(stdout);
  }
  absl::Status replicas = trainer.check_replicas();
  auto acc = trainer.accuracy();
  std::printf("loss %.6f -> %.6f; training accuracy %s\n", first_loss, last_loss,
              acc.ok() ? std::to_string(*acc).c_str() : std::string(acc.status().message()).c_str());
  std::printf("parameter replicas across {%s}: %s\n", devs.c_str(),
              replicas.ok() ? "bit-identical" : std::string(replicas.message()).c_str());
  std::printf("compile cache from step 2 on: %s\n", cache_ok ? "every kernel a hit" : "MISSES (unexpected)");
  return replicas.ok() && cache_ok && acc.ok() ? 0 : 1;
}
