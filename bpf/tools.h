// The quanta-trace tools as functions main dispatches to: each takes its parsed options,
// runs one bounded session, prints its report, and throws TraceError on failure.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace quanta::bpf {

struct OffcpuOptions {
  std::vector<pid_t> pids;  // tgids to trace; required (a whole-system view is not offered)
  double duration_s = 5.0;
  bool json = false;
  std::string prometheus_file;  // empty: none
};

struct HandoffOptions {
  // Executables or libraries holding the quanta:* USDT probes: libquanta.so emits the
  // gate and release probes, quanta-arbiter the grant probe. Each probe attaches in every
  // binary that has it; the gate and release probes must exist in at least one.
  std::vector<std::string> binaries;
  std::vector<pid_t> pids;  // empty: every process that maps the binaries
  double duration_s = 5.0;
  bool json = false;
  std::string timeline_file;    // Chrome/Perfetto trace JSON; empty: none
  std::string prometheus_file;  // empty: none
};

int run_offcpu(const OffcpuOptions& options);
int run_handoff(const HandoffOptions& options);

}  // namespace quanta::bpf
