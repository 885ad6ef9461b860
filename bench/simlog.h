// simgpu's execution log read back: one line per slice of device time
// ("slice <dev> <ctx> <pid> <start_ns> <end_ns>", CLOCK_MONOTONIC), and the figures the
// scenarios take from it independently of the code under test: each process's share of
// device time in a window, utilisation, context switches and the idle gap at each switch.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace quanta::bench {

struct Slice {
  int device = 0;
  std::string context;
  pid_t pid = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

struct SimLog {
  std::vector<Slice> slices;  // sorted by (device, start_ns)
  size_t malformed_lines = 0;
};

SimLog parse_sim_log(const std::string& text);
SimLog read_sim_log(const std::string& path);

struct Window {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  double seconds() const { return end_ns > start_ns ? static_cast<double>(end_ns - start_ns) / 1e9 : 0.0; }
};

// Device time of each pid inside the window (slices clipped to it); device < 0 = all.
std::map<pid_t, uint64_t> busy_ns_by_pid(const SimLog& log, const Window& window, int device = -1);

// Busy time over window length, for one device (or the mean over all when device < 0
// and device_count is given).
double utilization(const SimLog& log, const Window& window, int device = -1, int device_count = 1);

// A change of process on a device, with the idle time between the two slices.
struct Switch {
  int device = 0;
  pid_t from = 0;
  pid_t to = 0;
  uint64_t at_ns = 0;   // end of the last slice before the switch
  uint64_t gap_ns = 0;  // start of the next slice minus that end (0 when they touch)
};
std::vector<Switch> switches(const SimLog& log, const Window& window, int device = -1);

// The slices' span: first start to last end; {0,0} when empty.
Window span(const SimLog& log);

}  // namespace quanta::bench
