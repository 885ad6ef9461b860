// `interactive` and `interactive-8`: one interactive tenant sending 1 ms requests (kernel +
// sync) at 50/s beside 4 (or 8) closed-loop batch tenants with 20 ms kernels. Its latency
// alone (solo), under native time slicing and under Quanta with the interactive priority;
// and the batch tenants' throughput in both shared configurations. Native time slicing
// shares the engine among every context with work, so its tail grows with the neighbours;
// under Quanta the request shares it with at most the one batch kernel still draining.
#include <cstdio>

#include "bench/scenarios.h"
#include "bench/stats.h"

namespace quanta::bench {

namespace {

std::optional<double> number(const Json& obj, const char* key) {
  return obj.contains(key) && obj[key].is_number() ? std::optional<double>(obj[key].get<double>()) : std::nullopt;
}

Json run_config(const Bench& bench, const std::string& name, bool quanta, int batch_tenants, double seconds) {
  Json out = {{"p50_ms", nullptr}, {"p99_ms", nullptr}};
  if (batch_tenants > 0) out["batch_throughput"] = nullptr;
  std::string missing = quanta ? bench.missing_for_quanta() : bench.missing_for_tenants();
  if (!missing.empty()) {
    add_note(out, missing);
    return out;
  }
  Run run(bench, name, quanta);
  std::vector<TenantSpec> specs;
  std::string duration = std::to_string(seconds);
  specs.push_back(TenantSpec{{"requests", "--rate", "50", "--kernel-ms", "1", "--seconds", duration}, "interactive", 0});
  for (int i = 0; i < batch_tenants; ++i) {
    specs.push_back(TenantSpec{{"batch", "--kernel-ms", "20", "--depth", "2", "--seconds", duration},
                               "batch" + std::to_string(i), 0});
  }
  if (quanta) {
    ArbiterSettings arbiter;
    arbiter.pods.push_back(PodPolicy{"interactive", 1, "interactive", "", "", ""});
    for (int i = 0; i < batch_tenants; ++i) arbiter.pods.push_back(PodPolicy{"batch" + std::to_string(i), 1, "batch", "", "", ""});
    std::string why = run.start_arbiter(arbiter);
    if (!why.empty()) {
      add_note(out, why);
      return out;
    }
  }
  uint64_t start = run.start_tenants(specs);
  if (quanta) {
    sleep_until_monotonic(start);
    out["admission"] = run.check_admission(std::chrono::seconds(10)).to_json();
  }
  auto results = run.wait_tenants(15.0);
  for (const auto& note : tenant_errors(results)) add_note(out, note);
  if (results[0].report) {
    out["p50_ms"] = figure(number(*results[0].report, "p50_ms"), 3);
    out["p99_ms"] = figure(number(*results[0].report, "p99_ms"), 3);
    out["requests"] = results[0].report->value("count", 0);
    out["missed"] = results[0].report->value("missed", 0);
  }
  if (batch_tenants > 0) {
    // Kernel-seconds per second over the steady window from the log; the tenants'
    // own reports (which include start-up and drain) where there is no log.
    std::optional<double> throughput;
    if (bench.sim()) {
      SimLog log = run.sim_log();
      Window window = steady_window(start, seconds);
      if (!log.slices.empty() && window.seconds() > 0) {
        auto busy = busy_ns_by_pid(log, window);
        double sum = 0;
        for (size_t i = 1; i < results.size(); ++i) sum += static_cast<double>(busy[results[i].pid]) / 1e9;
        throughput = sum / window.seconds();
        out["source"] = "simgpu execution log";
      }
    }
    if (!throughput) {
      throughput = sum_useful_per_s(results, 1);
      out["source"] = "tenant reports";
    }
    out["batch_throughput"] = figure(throughput, 4);
  }
  return out;
}

// `native_limit`: the most Quanta's p99 may be of native's.
Json run_among(const Bench& bench, const std::string& scenario, int batch_tenants, double native_limit) {
  double seconds = bench.seconds(6.0, 1.0);
  Json out = {{"scenario", scenario},
              {"workload", {{"interactive", "1 ms kernel + sync at 50/s"}, {"batch_tenants", batch_tenants},
                            {"batch_kernel_ms", 20}, {"batch_depth", 2}, {"seconds", seconds}}}};
  out["solo"] = guarded("solo", [&] { return run_config(bench, scenario + "-solo", false, 0, seconds); });
  out["native"] = guarded("native", [&] { return run_config(bench, scenario + "-native", false, batch_tenants, seconds); });
  out["quanta"] = guarded("quanta", [&] { return run_config(bench, scenario + "-quanta", true, batch_tenants, seconds); });

  auto solo = number(out["solo"], "p99_ms");
  auto native = number(out["native"], "p99_ms");
  auto quanta = number(out["quanta"], "p99_ms");
  out["p99_over_solo"] = figure(ratio(quanta, solo), 3);
  out["p99_over_native"] = figure(ratio(quanta, native), 3);
  out["batch_throughput_ratio"] =
      figure(ratio(number(out["quanta"], "batch_throughput"), number(out["native"], "batch_throughput")), 4);
  char native_text[64];
  std::snprintf(native_text, sizeof native_text, "quanta p99_ms <= %g x native p99_ms", native_limit);
  out["targets"] = {{"p99_vs_solo", target("quanta p99_ms <= 2 x solo p99_ms", ratio(quanta, solo), 2.0, true)},
                    {"p99_vs_native", target(native_text, ratio(quanta, native), native_limit, true)}};
  return out;
}

}  // namespace

Json run_interactive(const Bench& bench) {
  return run_among(bench, "interactive", 4, 0.45);
}

Json run_interactive8(const Bench& bench) {
  return run_among(bench, "interactive-8", 8, 0.3);
}

}  // namespace quanta::bench
