// Parsing and analysis of simgpu's execution log.
#include "bench/simlog.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace quanta::bench {

SimLog parse_sim_log(const std::string& text) {
  SimLog log;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string kind;
    Slice slice;
    long long pid = 0;
    if (!(fields >> kind) || kind != "slice") {
      ++log.malformed_lines;
      continue;
    }
    if (!(fields >> slice.device >> slice.context >> pid >> slice.start_ns >> slice.end_ns) ||
        slice.end_ns < slice.start_ns) {
      ++log.malformed_lines;
      continue;
    }
    slice.pid = static_cast<pid_t>(pid);
    log.slices.push_back(slice);
  }
  std::sort(log.slices.begin(), log.slices.end(), [](const Slice& a, const Slice& b) {
    return a.device != b.device ? a.device < b.device : a.start_ns < b.start_ns;
  });
  return log;
}

SimLog read_sim_log(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_sim_log(text);
}

namespace {
uint64_t clipped(const Slice& slice, const Window& window) {
  uint64_t start = std::max(slice.start_ns, window.start_ns);
  uint64_t end = std::min(slice.end_ns, window.end_ns);
  return end > start ? end - start : 0;
}
}  // namespace

std::map<pid_t, uint64_t> busy_ns_by_pid(const SimLog& log, const Window& window, int device) {
  std::map<pid_t, uint64_t> busy;
  for (const auto& slice : log.slices) {
    if (device >= 0 && slice.device != device) continue;
    uint64_t ns = clipped(slice, window);
    if (ns > 0) busy[slice.pid] += ns;
  }
  return busy;
}

double utilization(const SimLog& log, const Window& window, int device, int device_count) {
  if (window.end_ns <= window.start_ns) return 0.0;
  uint64_t busy = 0;
  for (const auto& slice : log.slices) {
    if (device >= 0 && slice.device != device) continue;
    busy += clipped(slice, window);
  }
  double devices = device >= 0 ? 1.0 : static_cast<double>(std::max(device_count, 1));
  return static_cast<double>(busy) / (static_cast<double>(window.end_ns - window.start_ns) * devices);
}

std::vector<Switch> switches(const SimLog& log, const Window& window, int device) {
  std::vector<Switch> out;
  const Slice* previous = nullptr;
  for (const auto& slice : log.slices) {
    if (device >= 0 && slice.device != device) continue;
    if (slice.end_ns <= window.start_ns || slice.start_ns >= window.end_ns) continue;
    if (previous != nullptr && previous->device == slice.device && previous->pid != slice.pid) {
      Switch change;
      change.device = slice.device;
      change.from = previous->pid;
      change.to = slice.pid;
      change.at_ns = previous->end_ns;
      change.gap_ns = slice.start_ns > previous->end_ns ? slice.start_ns - previous->end_ns : 0;
      out.push_back(change);
    }
    previous = &slice;
  }
  return out;
}

Window span(const SimLog& log) {
  if (log.slices.empty()) return {};
  Window window{log.slices.front().start_ns, 0};
  for (const auto& slice : log.slices) {
    window.start_ns = std::min(window.start_ns, slice.start_ns);
    window.end_ns = std::max(window.end_ns, slice.end_ns);
  }
  return window;
}

}  // namespace quanta::bench
