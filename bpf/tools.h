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
  std::string prometheus_file;   // empty: none
  bool raw_tracepoints = false;  // raw tracepoints even where BTF ones work
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

// `quanta-trace session`: finds the arbiters, libquanta.so and libcuda.so.1 users on the
// node itself and traces them all (docs/tracing.md).
struct SessionOptions {
  double duration_s = 30.0;
  std::string gpu;            // only this GPU/MIG UUID; empty: all
  std::string pod;            // only this pod ("namespace/name"); empty: all
  std::string perfetto_file;  // Chrome/Perfetto trace JSON; empty: none
  std::string svg_file;       // SVG timeline; empty: none
  double svg_window_s = 0;    // length the SVG shows; 0: chosen from the quanta seen
  bool json = false;
  bool raw_tracepoints = false;  // raw tracepoints even where BTF ones work
  bool driver = true;            // uprobes on libcuda.so.1
};

int run_offcpu(const OffcpuOptions& options);
int run_session(const SessionOptions& options);
int run_handoff(const HandoffOptions& options);

}  // namespace quanta::bpf
