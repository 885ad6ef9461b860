// The scenarios of `make bench` (METHODS.md), each one function that runs its
// configurations side by side (native baseline and Quanta, plus solo or direct where they
// apply) and returns the scenario's JSON object, figures it could not measure as null with
// a note saying why.
#pragma once

#include "bench/harness.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace quanta::bench {

using Json = nlohmann::json;

Json run_fairness(const Bench& bench);
Json run_interactive(const Bench& bench);
Json run_interactive8(const Bench& bench);
Json run_overhead(const Bench& bench);
Json run_handoff(const Bench& bench);
Json run_launch_cost(const Bench& bench);
Json run_memcap(const Bench& bench);
Json run_scale(const Bench& bench);
Json run_churn(const Bench& bench);
Json run_soak(const Bench& bench);  // sets "failed" on any violation (quanta-bench exits 1)

struct ScenarioEntry {
  const char* name;
  const char* summary;
  Json (*run)(const Bench&);
};
const std::vector<ScenarioEntry>& scenarios();

// ----- helpers the scenarios share ---------------------------------------------------

// {"description", "value", "limit", "met", "margin"}: met is null when value is missing;
// margin is value - limit (how far past or short of the limit).
Json target(const std::string& description, std::optional<double> value, double limit, bool at_most, int digits = 3);

// Appends a note to obj["note"] (a string; several notes are joined with "; ").
void add_note(Json& obj, const std::string& note);

// The measurement window of a run whose tenants started at start_ns for `seconds`:
// the first 10% (at most 0.5 s) and the last 5% are left out as start-up and drain.
Window steady_window(uint64_t start_ns, double seconds);

struct ShareTenant {
  pid_t pid = 0;
  int weight = 1;
  int device = 0;
  std::optional<double> kernel_seconds;  // from the tenant's report (real GPUs)
};

struct Shares {
  Json tenants = Json::array();                // [{weight, target_share, achieved_share}]
  std::optional<double> max_share_error_pp;
  std::optional<double> utilization;
  std::optional<double> switches_per_s;        // simgpu only
  std::string source;                          // "simgpu execution log" | "tenant reports"
};

// Shares of GPU time per tenant against weight/sum(weights) of the tenants on its device.
// With a simgpu log the device time in `window` counts; without, the kernel-seconds the
// tenants report.
Shares measure_shares(const std::vector<ShareTenant>& tenants, const SimLog* log, const Window& window,
                      int device_count);

// Sum of useful_per_s (kernel-seconds per second) over the reports that have it.
std::optional<double> sum_useful_per_s(const std::vector<TenantResult>& results, size_t first = 0,
                                       size_t last = SIZE_MAX);

// Runs `configure` under a catch-all so one broken configuration yields a note, not a crash.
Json guarded(const std::string& what, const std::function<Json()>& configure);

}  // namespace quanta::bench

namespace quanta::bench {

// A closed-loop batch mix: one tenant (and pod) per weight, on the given devices, all
// started together; the shared core of `fairness`, `overhead` and `scale`.
struct BatchMix {
  std::string name;
  bool quanta = false;
  std::vector<int> weights;
  std::vector<int> devices;  // empty: all on device 0
  int device_count = 1;
  double kernel_ms = 2.0;
  int depth = 2;
  double seconds = 10.0;
  ArbiterSettings arbiter;   // pods are added from the weights
  SimSettings sim;
  bool trace_handoff = false;
};

// {tenants, max_share_error_pp, utilization, useful_per_s, context_switches_per_s,
//  source, and for quanta: arbiter_cpu_s_per_s, handoff_p50_us, handoff_p99_us}.
Json run_batch_mix(const Bench& bench, const BatchMix& mix);

// Sleeps until a CLOCK_MONOTONIC instant.
void sleep_until_monotonic(uint64_t when_ns);
uint64_t monotonic_now_ns();

}  // namespace quanta::bench
