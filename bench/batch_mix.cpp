// The closed-loop batch mix behind `fairness`, `overhead` and `scale`: tenants with
// weights on one or more devices, shares from simgpu's log (or the tenants' reports on a
// real GPU), the arbiter's CPU time over the steady window, optionally handoffs traced.
#include "bench/scenarios.h"
#include "bench/stats.h"
#include "bench/tracer.h"

#include <time.h>

#include <cerrno>
#include <memory>

namespace quanta::bench {

uint64_t monotonic_now_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec);
}

void sleep_until_monotonic(uint64_t when_ns) {
  timespec target{static_cast<time_t>(when_ns / 1'000'000'000ull), static_cast<long>(when_ns % 1'000'000'000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &target, nullptr) == EINTR) {
  }
}

namespace {
std::string format_number(double value) {
  std::string text = std::to_string(value);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}
}  // namespace

Json run_batch_mix(const Bench& bench, const BatchMix& mix) {
  Json out = Json::object();
  std::string missing = mix.quanta ? bench.missing_for_quanta() : bench.missing_for_tenants();
  std::vector<ShareTenant> share_tenants;
  auto null_figures = [&](const std::string& why) {
    for (size_t i = 0; i < mix.weights.size(); ++i) {
      double sum = 0;
      for (size_t j = 0; j < mix.weights.size(); ++j) {
        if ((mix.devices.empty() ? 0 : mix.devices[j]) == (mix.devices.empty() ? 0 : mix.devices[i])) sum += mix.weights[j];
      }
      out["tenants"].push_back({{"weight", mix.weights[i]}, {"target_share", figure(mix.weights[i] / sum, 4)}, {"achieved_share", nullptr}});
    }
    for (const char* key : {"max_share_error_pp", "utilization", "useful_per_s", "context_switches_per_s"}) out[key] = nullptr;
    if (mix.quanta) out["arbiter_cpu_s_per_s"] = nullptr;
    if (mix.trace_handoff) out["handoff_p50_us"] = out["handoff_p99_us"] = nullptr;
    add_note(out, why);
    return out;
  };
  if (!missing.empty()) return null_figures(missing);

  Run run(bench, mix.name, mix.quanta, mix.sim);
  std::vector<TenantSpec> specs;
  ArbiterSettings arbiter = mix.arbiter;
  for (size_t i = 0; i < mix.weights.size(); ++i) {
    TenantSpec spec;
    spec.pod = "t" + std::to_string(i) + "-w" + std::to_string(mix.weights[i]);
    spec.device = mix.devices.empty() ? 0 : mix.devices[i];
    spec.args = {"batch", "--kernel-ms", format_number(mix.kernel_ms), "--depth", std::to_string(mix.depth),
                 "--seconds", format_number(mix.seconds)};
    specs.push_back(spec);
    arbiter.pods.push_back(PodPolicy{spec.pod, mix.weights[i], "", "", "", ""});
  }
  if (mix.quanta) {
    std::string why = run.start_arbiter(arbiter);
    if (!why.empty()) return null_figures(why);
  }

  std::unique_ptr<HandoffTracer> tracer;
  if (mix.trace_handoff && mix.quanta) tracer = std::make_unique<HandoffTracer>(run);

  uint64_t start = run.start_tenants(specs);
  Window window = steady_window(start, mix.seconds);
  std::optional<double> cpu_before, cpu_after;
  uint64_t cpu_t0 = 0, cpu_t1 = 0;
  if (mix.quanta) {
    // Every tenant is ready at the start instant: each must be a gated tenant of its pod
    // before the window opens, or the figures would measure ungated processes.
    sleep_until_monotonic(start);
    out["admission"] = run.check_admission(std::chrono::seconds(10)).to_json();
    sleep_until_monotonic(window.start_ns);
    if (tracer) tracer->note_tenants(run.tenant_pids());
    cpu_before = run.arbiter_cpu_seconds();
    cpu_t0 = monotonic_now_ns();
    sleep_until_monotonic(window.end_ns);
    cpu_after = run.arbiter_cpu_seconds();
    cpu_t1 = monotonic_now_ns();
  }
  auto results = run.wait_tenants(15.0);
  for (const auto& note : tenant_errors(results)) add_note(out, note);

  SimLog log;
  if (bench.sim()) log = run.sim_log();
  for (size_t i = 0; i < results.size(); ++i) {
    ShareTenant tenant;
    tenant.pid = results[i].pid;
    tenant.weight = mix.weights[i];
    tenant.device = specs[i].device;
    if (results[i].report) tenant.kernel_seconds = number_field(*results[i].report, {"kernel_seconds"});
    share_tenants.push_back(tenant);
  }
  Shares shares = measure_shares(share_tenants, bench.sim() ? &log : nullptr, window, mix.device_count);
  if (bench.sim() && log.slices.empty()) add_note(out, "simgpu wrote no execution log; shares from the tenants' reports");
  out["tenants"] = shares.tenants;
  out["max_share_error_pp"] = figure(shares.max_share_error_pp, 2);
  std::optional<double> useful = sum_useful_per_s(results);
  out["utilization"] = figure(shares.utilization ? shares.utilization
                                                 : ratio(useful, static_cast<double>(mix.device_count)),
                              4);
  out["useful_per_s"] = figure(useful, 4);
  out["context_switches_per_s"] = figure(shares.switches_per_s, 1);
  out["source"] = shares.source;
  if (mix.quanta) {
    std::optional<double> cpu_rate;
    if (cpu_before && cpu_after && cpu_t1 > cpu_t0) cpu_rate = (*cpu_after - *cpu_before) / (static_cast<double>(cpu_t1 - cpu_t0) / 1e9);
    out["arbiter_cpu_s_per_s"] = figure(cpu_rate, 6);
    if (!cpu_rate) add_note(out, "arbiter CPU time unreadable (arbiter gone?): " + run.arbiter_tail());
  }
  if (tracer) {
    const std::vector<Handoff> all = tracer->finish();
    const std::vector<double> handoffs = steady_durations(all, window);
    out["handoff_p50_us"] = figure(percentile(handoffs, 50), 1);
    out["handoff_p99_us"] = figure(percentile(handoffs, 99), 1);
    out["handoffs"] = handoffs.size();
    out["handoff_whole_run"] = whole_run_figures(all);
    out["handoff_source"] = tracer->source();
    if (!tracer->error().empty()) add_note(out, tracer->error());
  }
  return out;
}

}  // namespace quanta::bench
