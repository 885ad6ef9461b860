// `scale`: 64 batch tenants on one GPU, and 8 GPUs with 8 tenants each (weights cycling
// 1, 2, 4, 8 so the error is measured against unequal targets). Figures: share error,
// handoff p99 from the shim's probes, and the arbiter's CPU seconds per second.
#include "bench/scenarios.h"
#include "bench/stats.h"

#include <cmath>

namespace quanta::bench {

namespace {

BatchMix layout(const Bench& bench, int gpus, int per_gpu) {
  BatchMix mix;
  mix.device_count = gpus;
  mix.sim.devices = gpus;
  mix.kernel_ms = 2.0;
  mix.depth = 2;
  mix.seconds = bench.seconds(8.0, 1.0);
  static const int kWeights[] = {1, 2, 4, 8};
  for (int gpu = 0; gpu < gpus; ++gpu) {
    for (int i = 0; i < per_gpu; ++i) {
      mix.weights.push_back(kWeights[i % 4]);
      mix.devices.push_back(gpu);
    }
  }
  return mix;
}

std::optional<double> number(const Json& obj, const char* key) {
  return obj.contains(key) && obj[key].is_number() ? std::optional<double>(obj[key].get<double>()) : std::nullopt;
}

// Keeps the figures METHODS.md names (plus context) out of a batch-mix result.
Json summary(const Json& mix) {
  Json out = Json::object();
  for (const char* key : {"max_share_error_pp", "handoff_p50_us", "handoff_p99_us",
                          "arbiter_cpu_s_per_s", "handoff_whole_run", "utilization", "useful_per_s",
                          "context_switches_per_s", "handoffs", "admission", "source", "note"}) {
    if (mix.contains(key)) out[key] = mix[key];
  }
  // The tenant furthest from its target, so a large error can be read without the
  // 64-row table.
  double worst = -1;
  for (const auto& tenant : mix.value("tenants", Json::array())) {
    if (!tenant["achieved_share"].is_number()) continue;
    double error = std::fabs(tenant["achieved_share"].get<double>() - tenant["target_share"].get<double>());
    if (error > worst) {
      worst = error;
      out["worst_tenant"] = tenant;
    }
  }
  return out;
}

}  // namespace

Json run_scale(const Bench& bench) {
  int tenants_one = bench.quick() ? 8 : 64;
  int gpus = 8;
  int per_gpu = bench.quick() ? 2 : 8;
  Json out = {{"scenario", "scale"}};
  int real_gpus = 1;
  if (!bench.sim()) real_gpus = 1;  // only one GPU is assumed on real hardware

  BatchMix one = layout(bench, 1, tenants_one);
  BatchMix eight = layout(bench, gpus, per_gpu);
  out["workload"] = {{"one_gpu_tenants", tenants_one}, {"eight_gpus", gpus}, {"tenants_per_gpu", per_gpu},
                     {"weights", "1,2,4,8 cycling"}, {"kernel_ms", one.kernel_ms}, {"depth", one.depth},
                     {"seconds", one.seconds}};
  if (bench.quick()) out["workload"]["quick"] = "fewer tenants than the full run";

  out["native"] = Json::object();
  out["quanta"] = Json::object();
  one.name = "scale1-native";
  out["native"]["one_gpu"] = summary(guarded("native one_gpu", [&] { return run_batch_mix(bench, one); }));
  one.name = "scale1-quanta";
  one.quanta = true;
  one.trace_handoff = true;
  out["quanta"]["one_gpu"] = summary(guarded("quanta one_gpu", [&] { return run_batch_mix(bench, one); }));

  if (bench.sim() || real_gpus >= gpus) {
    eight.name = "scale8-native";
    out["native"]["eight_gpus"] = summary(guarded("native eight_gpus", [&] { return run_batch_mix(bench, eight); }));
    eight.name = "scale8-quanta";
    eight.quanta = true;
    eight.trace_handoff = true;
    out["quanta"]["eight_gpus"] = summary(guarded("quanta eight_gpus", [&] { return run_batch_mix(bench, eight); }));
  } else {
    Json none = {{"max_share_error_pp", nullptr}, {"handoff_p99_us", nullptr}, {"arbiter_cpu_s_per_s", nullptr},
                 {"note", "this machine has fewer than 8 GPUs"}};
    out["native"]["eight_gpus"] = none;
    out["quanta"]["eight_gpus"] = none;
  }

  // The same three limits for both layouts.
  out["targets"] = Json::object();
  const std::pair<const char*, const char*> layouts[] = {{"one_gpu", "64 tenants on one GPU"},
                                                         {"eight_gpus", "8 GPUs x 8 tenants"}};
  for (const auto& [key, words] : layouts) {
    const Json& q = out["quanta"][key];
    const std::string prefix = std::string(key) + "_";
    out["targets"][prefix + "max_share_error_pp"] =
        target(std::string(words) + ": max_share_error_pp <= 3", number(q, "max_share_error_pp"), 3.0, true, 2);
    out["targets"][prefix + "arbiter_cpu_s_per_s"] =
        target(std::string(words) + ": arbiter CPU <= 0.02 s/s", number(q, "arbiter_cpu_s_per_s"), 0.02, true, 6);
    out["targets"][prefix + "handoff_p99_us"] =
        target(std::string(words) + ": handoff p99 <= 1 ms", number(q, "handoff_p99_us"), 1000.0, true, 1);
  }
  return out;
}

}  // namespace quanta::bench
