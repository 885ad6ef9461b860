// Handoff latencies from Quanta's own USDT probes in the shim (quanta:release,
// quanta:gate_wait_end): through tracefs uprobes, timed by the stamps the shim passes to
// them, else `quanta-trace handoff --timeline`, timed by the kernel. Either way every
// release-to-next-launch interval is a sample on CLOCK_MONOTONIC.
#pragma once

#include "bench/harness.h"
#include "bench/simlog.h"
#include "bench/uprobe_trace.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace quanta::bench {

class HandoffTracer {
 public:
  // Starts tracing the shim's probes for `seconds`; returns once they are attached.
  HandoffTracer(Run& run, double seconds);
  ~HandoffTracer();
  bool attached() const { return attached_; }
  // Which tool measured ("quanta-trace" or "tracefs uprobes"); empty when none attached.
  const std::string& source() const { return source_; }
  // Why a tool could not be used or what it lost; empty when all went well.
  const std::string& error() const { return error_; }
  // Maps the tenants' threads to tenants and devices (call while they run); needed by
  // the tracefs path, which sees thread ids only.
  void note_tenants(const std::vector<pid_t>& pids, const std::vector<int>& devices);
  // Ends the session; every handoff it saw, with the moment of its release.
  std::vector<Handoff> finish();

 private:
  Run& run_;
  double seconds_;
  bool attached_ = false;
  std::string source_;
  std::string error_;
  std::unique_ptr<Process> trace_;
  std::string timeline_path_;
  std::unique_ptr<UprobeSession> uprobes_;
  std::map<uint32_t, int> tenant_of_tid_;
  std::vector<int> devices_;
};

// The durations (microseconds) of the handoffs whose release fell inside the window, less
// those to a tenant's first pass of its gate: the figures leave out the tenants' start-up
// and exit, when their processes start, first run and end on the same cores.
std::vector<double> steady_durations(const std::vector<Handoff>& handoffs, const Window& window);

// Every handoff of the session, the start and end included: {handoffs, p50_us, p99_us}.
nlohmann::json whole_run_figures(const std::vector<Handoff>& handoffs);

}  // namespace quanta::bench
