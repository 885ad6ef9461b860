// `overhead`: three equal closed-loop batch tenants with 2 ms kernels. Useful throughput
// is the kernel-seconds the tenants complete per second; Quanta's gating must not lose
// any against native time slicing (it switches less often than the hardware does).
#include "bench/scenarios.h"
#include "bench/stats.h"

namespace quanta::bench {

Json run_overhead(const Bench& bench) {
  BatchMix mix;
  mix.weights = {1, 1, 1};
  mix.kernel_ms = 2.0;
  mix.depth = 2;
  mix.seconds = bench.seconds(8.0, 1.0);
  Json out = {{"scenario", "overhead"},
              {"workload", {{"tenants", 3}, {"kernel_ms", mix.kernel_ms}, {"depth", mix.depth}, {"seconds", mix.seconds}}}};
  mix.name = "overhead-native";
  out["native"] = guarded("native", [&] { return run_batch_mix(bench, mix); });
  mix.name = "overhead-quanta";
  mix.quanta = true;
  out["quanta"] = guarded("quanta", [&] { return run_batch_mix(bench, mix); });

  auto useful = [&](const char* config) -> std::optional<double> {
    const Json& value = out[config]["useful_per_s"];
    return value.is_number() ? std::optional<double>(value.get<double>()) : std::nullopt;
  };
  auto r = ratio(useful("quanta"), useful("native"));
  out["ratio"] = figure(r, 4);
  out["targets"] = {{"ratio", target("quanta useful throughput >= 1.0 x native", r, 1.0, false, 4)}};
  return out;
}

}  // namespace quanta::bench
