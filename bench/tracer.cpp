// HandoffTracer (tracer.h): quanta-trace's handoff session on libquanta.so beside a run.
#include "bench/tracer.h"

#include "bench/stats.h"

#include <nlohmann/json.hpp>

#include <exception>

#ifdef QUANTA_BENCH_BPF
#include "bpf/handoff_session.h"
#endif

namespace quanta::bench {

#ifdef QUANTA_BENCH_BPF

HandoffTracer::HandoffTracer(Run& run) {
  const Paths& paths = run.bench().paths();
  if (!file_exists(paths.shim)) {
    error_ = "libquanta.so is not built";
    return;
  }
  try {
    // Only the two probes a handoff is timed by: each attached probe costs the tenants a
    // trap per hit.
    session_ = std::make_shared<bpf::HandoffSession>(
        std::vector<std::string>{paths.shim}, std::vector<pid_t>{}, true,
        std::vector<quanta_handoff_probe>{QUANTA_PROBE_RELEASE, QUANTA_PROBE_GATE_WAIT_END});
  } catch (const std::exception& failure) {
    error_ = std::string("quanta-trace's handoff session: ") + failure.what();
    return;
  }
  source_ = "quanta-trace";
  poller_ = std::thread([this] {
    while (!stopping_.load()) session_->poll(50);
  });
}

HandoffTracer::~HandoffTracer() {
  stopping_ = true;
  if (poller_.joinable()) poller_.join();
}

std::vector<Handoff> HandoffTracer::finish() {
  if (!session_) return {};
  stopping_ = true;
  if (poller_.joinable()) poller_.join();
  session_->stop();
  if (const uint64_t lost = session_->events_lost(); lost > 0)
    error_ = "the ring buffer had no room for " + std::to_string(lost) + " events";
  return tenant_handoffs(session_->events(), tenants_);
}

#else

HandoffTracer::HandoffTracer(Run&) {
  error_ = "quanta-bench was built without BPF (QUANTA_BUILD_BPF=OFF), so no handoff is timed";
}

HandoffTracer::~HandoffTracer() = default;

std::vector<Handoff> HandoffTracer::finish() {
  return {};
}

#endif

void HandoffTracer::note_tenants(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) tenants_.insert(static_cast<uint32_t>(pid));
}

std::vector<Handoff> tenant_handoffs(const std::vector<quanta_handoff_event>& events,
                                     const std::set<uint32_t>& tenants) {
  std::vector<quanta_handoff_event> theirs;
  for (const quanta_handoff_event& e : events) {
    if (tenants.count(e.pid) != 0) theirs.push_back(e);
  }
  return bpf::pair_handoffs(std::move(theirs));
}

std::vector<double> steady_durations(const std::vector<Handoff>& handoffs, const Window& window) {
  std::vector<double> out;
  for (const auto& handoff : handoffs) {
    if (!handoff.first_pass && handoff.released_ns >= window.start_ns && handoff.released_ns < window.end_ns)
      out.push_back(handoff.us);
  }
  return out;
}

nlohmann::json whole_run_figures(const std::vector<Handoff>& handoffs) {
  std::vector<double> us;
  for (const auto& handoff : handoffs) us.push_back(handoff.us);
  return {{"handoffs", us.size()}, {"p50_us", figure(percentile(us, 50), 1)}, {"p99_us", figure(percentile(us, 99), 1)}};
}

}  // namespace quanta::bench
