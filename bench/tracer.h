// Handoff latencies from the shim's USDT probes (quanta:release, quanta:gate_wait_end),
// measured in this process by quanta-trace's handoff session (bpf/handoff_session.h) and
// paired by its model (bpf/handoff_model.h). Every interval is between the stamps the shim
// passes to the probes, so the probes' traps stay out of it.
#pragma once

#include "bench/harness.h"
#include "bench/simlog.h"
#include "bpf/handoff_model.h"

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace quanta::bpf {
class HandoffSession;
}

namespace quanta::bench {

using bpf::Handoff;

class HandoffTracer {
 public:
  // Attaches to libquanta.so's probes in every process that maps it and takes in their
  // events on a thread of its own; returns once they are attached, or with error() set.
  explicit HandoffTracer(Run& run);
  ~HandoffTracer();
  HandoffTracer(const HandoffTracer&) = delete;
  HandoffTracer& operator=(const HandoffTracer&) = delete;
  // Which tool measured ("quanta-trace"); empty when none attached.
  const std::string& source() const { return source_; }
  // Why the probes could not be traced or what was lost; empty when all went well.
  const std::string& error() const { return error_; }
  // The run's tenant processes (call while they run): only handoffs between them count.
  void note_tenants(const std::vector<pid_t>& pids);
  // Ends the session; every handoff between the tenants, with the moment of its release.
  std::vector<Handoff> finish();

 private:
  std::string source_;
  std::string error_;
  // Shared only so that a build without BPF, which has no HandoffSession to destroy, links.
  std::shared_ptr<bpf::HandoffSession> session_;
  std::atomic<bool> stopping_{false};
  std::thread poller_;
  std::set<uint32_t> tenants_;
};

// The durations (microseconds) of the handoffs whose release fell inside the window, less
// those to a tenant's first pass of its gate: the figures leave out the tenants' start-up
// and exit, when their processes start, first run and end on the same cores.
std::vector<double> steady_durations(const std::vector<Handoff>& handoffs, const Window& window);

// Every handoff of the session, the start and end included: {handoffs, p50_us, p99_us}.
nlohmann::json whole_run_figures(const std::vector<Handoff>& handoffs);

// The handoffs between `tenants` among the session's events (pair_handoffs over theirs).
std::vector<Handoff> tenant_handoffs(const std::vector<quanta_handoff_event>& events,
                                     const std::set<uint32_t>& tenants);

}  // namespace quanta::bench
