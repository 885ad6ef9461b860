// User-side view of the log2 histograms the BPF programs fill (hist.h): merging,
// percentile estimates, and the three ways quanta-trace shows them (text, JSON, Prometheus).
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "bpf/hist.h"

namespace quanta::bpf {

class Histogram {
 public:
  static constexpr int kSlots = QUANTA_HIST_SLOTS;

  void add(const quanta_hist& raw);
  void add(const Histogram& other);
  // One value, bucketed as the BPF side does (bits.bpf.h).
  void record(uint64_t ns);

  uint64_t count() const { return count_; }
  uint64_t sum_ns() const { return sum_ns_; }
  bool empty() const { return count_ == 0; }
  // Estimate of the q-quantile (0 < q <= 1), interpolated inside its log2 bucket.
  double percentile_ns(double q) const;

  // Slot k counts values in [low_ns(k), high_ns(k)).
  static uint64_t low_ns(int slot) { return slot == 0 ? 0 : uint64_t{1} << slot; }
  static uint64_t high_ns(int slot) { return uint64_t{1} << (slot + 1); }

  nlohmann::json to_json() const;
  // runqlat-style bars, one line per bucket from the first to the last non-empty one.
  void print(std::ostream& out, std::string_view title) const;
  // One series of a Prometheus histogram in seconds; `labels` is `a="x",b="y"` or empty.
  void write_prometheus(std::ostream& out, std::string_view metric, std::string_view labels) const;

 private:
  std::array<uint64_t, kSlots> slots_{};
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;
};

// "850ns", "12.3us", "4.10ms", "2.00s": durations as people read them.
std::string format_duration_ns(double ns);

// HELP and TYPE lines that precede the series of one Prometheus histogram metric.
void write_prometheus_header(std::ostream& out, std::string_view metric, std::string_view help);

}  // namespace quanta::bpf
