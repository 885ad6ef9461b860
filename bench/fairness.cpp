// `fairness`: three closed-loop batch tenants with weights 1:2:4 and 2 ms kernels. Native
// time slicing ignores weights, so its error against the weighted targets shows how far
// the hardware's policy is from the one asked for; Quanta must land within 2 pp.
#include "bench/scenarios.h"
#include "bench/stats.h"

namespace quanta::bench {

Json run_fairness(const Bench& bench) {
  BatchMix mix;
  mix.weights = {1, 2, 4};
  mix.kernel_ms = 2.0;
  mix.depth = 2;
  mix.seconds = bench.seconds(10.0, 1.0);
  Json out = {{"scenario", "fairness"},
              {"workload", {{"tenants", 3}, {"weights", mix.weights}, {"kernel_ms", mix.kernel_ms}, {"depth", mix.depth},
                            {"seconds", mix.seconds}}}};
  mix.name = "fairness-native";
  out["native"] = guarded("native", [&] { return run_batch_mix(bench, mix); });
  mix.name = "fairness-quanta";
  mix.quanta = true;
  out["quanta"] = guarded("quanta", [&] { return run_batch_mix(bench, mix); });

  auto error = [&](const char* config) -> std::optional<double> {
    const Json& value = out[config]["max_share_error_pp"];
    return value.is_number() ? std::optional<double>(value.get<double>()) : std::nullopt;
  };
  out["error_ratio"] = figure(ratio(error("quanta"), error("native")), 3);
  out["targets"] = {{"max_share_error_pp", target("quanta max_share_error_pp <= 2 for weights 1:2:4", error("quanta"), 2.0, true, 2)}};
  return out;
}

}  // namespace quanta::bench
