// The kernel workloads: a closed-loop batch tenant (throughput) and an open-loop request
// tenant (latency from each request's scheduled arrival, so queueing counts).
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <numeric>

#include "tests/tenant/gpu.h"
#include "tests/tenant/modes.h"

namespace quanta::tenant {
namespace {

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::uint64_t kernel_ns(const Options& options) {
  return static_cast<std::uint64_t>(std::llround(options.kernel_ms * 1e6));
}

// A few tiny kernels before the clock starts: a real driver loads modules lazily at the
// first launch, which would otherwise land in the first request's latency.
void warm_up(const Driver& driver, Gpu& gpu, const Options& options) {
  if (options.warmup == 0) return;
  for (int i = 0; i < options.warmup; ++i) gpu.launch_spin(1000);
  check(driver, need(driver, driver.StreamSynchronize, "cuStreamSynchronize")(gpu.stream()),
        "cuStreamSynchronize");
}

}  // namespace

double percentile(std::vector<double> samples, double fraction) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  auto rank = static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(samples.size())));
  return samples[std::clamp<std::size_t>(rank, 1, samples.size()) - 1];
}

void sleep_until(Clock::time_point when) {
  auto since_epoch =
      std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
  timespec target{static_cast<time_t>(since_epoch / 1'000'000'000),
                  static_cast<long>(since_epoch % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &target, nullptr) == EINTR) {
  }
}

void wait_for_start(const Options& options, nlohmann::json& report) {
  if (!options.start_at_ns) return;
  timespec target{static_cast<time_t>(*options.start_at_ns / 1'000'000'000),
                  static_cast<long>(*options.start_at_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &target, nullptr) == EINTR) {
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  std::int64_t now_ns = static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  report["start_at_ns"] = *options.start_at_ns;
  report["start_late_ms"] = static_cast<double>(now_ns - *options.start_at_ns) / 1e6;
}

bool run_batch(const Driver& driver, const Options& options, nlohmann::json& report) {
  Gpu gpu(driver, options);
  gpu.load_spin();
  need(driver, driver.EventCreate, "cuEventCreate");
  need(driver, driver.EventRecord, "cuEventRecord");
  need(driver, driver.EventSynchronize, "cuEventSynchronize");
  // A ring of events, one per kernel in flight; slot k % depth belongs to kernel k.
  std::vector<CUevent> events(static_cast<std::size_t>(options.depth));
  for (auto& event : events)
    check(driver, driver.EventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  const auto depth = static_cast<std::uint64_t>(options.depth);
  const std::uint64_t duration_ns = kernel_ns(options);
  std::vector<double> launch_ns;
  std::vector<std::int64_t> launch_mono_ns;  // with --launch-times: when each launch began
  std::uint64_t launched = 0;
  std::uint64_t completed = 0;
  std::uint64_t completed_in_window = 0;  // seen complete before the deadline
  const auto think = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(options.think_ms));

  warm_up(driver, gpu, options);
  wait_for_start(options, report);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options.seconds));
  for (;;) {
    if (launched - completed == depth) {
      check(driver, driver.EventSynchronize(events[completed % depth]), "cuEventSynchronize");
      ++completed;
      if (think.count() > 0) sleep_until(Clock::now() + think);
    }
    if (Clock::now() >= deadline) break;
    completed_in_window = completed;
    const auto before = Clock::now();
    if (options.launch_times) {
      launch_mono_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(before.time_since_epoch()).count());
    }
    gpu.launch_spin(duration_ns);
    launch_ns.push_back(static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - before).count()));
    check(driver, driver.EventRecord(events[launched % depth], gpu.stream()), "cuEventRecord");
    ++launched;
  }
  // Kernels already submitted still count: the wall time runs until the last one ends.
  while (completed < launched) {
    check(driver, driver.EventSynchronize(events[completed % depth]), "cuEventSynchronize");
    ++completed;
  }
  const double wall = seconds_between(start, Clock::now());
  for (auto& event : events) {
    if (driver.EventDestroy != nullptr) driver.EventDestroy(event);
  }

  const double kernel_seconds = static_cast<double>(completed) * options.kernel_ms / 1e3;
  report["seconds"] = options.seconds;
  report["kernel_ms"] = options.kernel_ms;
  report["depth"] = options.depth;
  report["think_ms"] = options.think_ms;
  if (options.launch_times) report["launch_mono_ns"] = launch_mono_ns;
  report["kernels"] = completed;
  report["window_kernels"] = completed_in_window;
  report["kernel_seconds"] = kernel_seconds;
  report["wall_seconds"] = wall;
  report["useful_per_s"] = wall > 0 ? kernel_seconds / wall : 0.0;
  report["launch_ns_p50"] = percentile(launch_ns, 0.50);
  report["launch_ns_mean"] = launch_ns.empty()
                                 ? 0.0
                                 : std::accumulate(launch_ns.begin(), launch_ns.end(), 0.0) /
                                       static_cast<double>(launch_ns.size());
  return true;
}

bool run_requests(const Driver& driver, const Options& options, nlohmann::json& report) {
  Gpu gpu(driver, options);
  gpu.load_spin();
  need(driver, driver.StreamSynchronize, "cuStreamSynchronize");
  const std::uint64_t duration_ns = kernel_ns(options);
  // Arrivals at i / rate for every i with i / rate < seconds.
  const auto scheduled =
      static_cast<std::uint64_t>(std::ceil(options.seconds * options.rate - 1e-9));
  const auto period = std::chrono::duration<double>(1.0 / options.rate);
  std::vector<double> latency_ms;  // scheduled arrival to sync return
  std::vector<double> service_ms;  // launch to sync return: without the tenant's own lateness
  latency_ms.reserve(scheduled);
  service_ms.reserve(scheduled);
  std::uint64_t late = 0;

  warm_up(driver, gpu, options);
  wait_for_start(options, report);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options.seconds));
  std::uint64_t issued = 0;
  for (; issued < scheduled; ++issued) {
    const auto arrival =
        start + std::chrono::duration_cast<Clock::duration>(period * static_cast<double>(issued));
    const auto now = Clock::now();
    if (now >= deadline) break;  // the rest are missed: the tenant could not keep up
    if (now < arrival) {
      sleep_until(arrival);
    } else if (now - arrival > std::chrono::milliseconds(1)) {
      ++late;  // still busy with earlier requests when this one arrived
    }
    const auto issued_at = Clock::now();
    gpu.launch_spin(duration_ns);
    check(driver, driver.StreamSynchronize(gpu.stream()), "cuStreamSynchronize");
    const auto done = Clock::now();
    latency_ms.push_back(std::chrono::duration<double, std::milli>(done - arrival).count());
    service_ms.push_back(std::chrono::duration<double, std::milli>(done - issued_at).count());
  }
  const double wall = seconds_between(start, Clock::now());

  report["seconds"] = options.seconds;
  report["kernel_ms"] = options.kernel_ms;
  report["rate"] = options.rate;
  report["count"] = latency_ms.size();
  report["missed"] = scheduled - issued;
  report["late"] = late;
  report["wall_seconds"] = wall;
  report["p50_ms"] = percentile(latency_ms, 0.50);
  report["p90_ms"] = percentile(latency_ms, 0.90);
  report["p99_ms"] = percentile(latency_ms, 0.99);
  report["max_ms"] =
      latency_ms.empty() ? 0.0 : *std::max_element(latency_ms.begin(), latency_ms.end());
  report["mean_ms"] = latency_ms.empty()
                          ? 0.0
                          : std::accumulate(latency_ms.begin(), latency_ms.end(), 0.0) /
                                static_cast<double>(latency_ms.size());
  report["service_p50_ms"] = percentile(service_ms, 0.50);
  report["service_p99_ms"] = percentile(service_ms, 0.99);
  report["kernel_seconds"] = static_cast<double>(latency_ms.size()) * options.kernel_ms / 1e3;
  return true;
}

}  // namespace quanta::tenant
