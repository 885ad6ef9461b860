// Log2 histogram arithmetic and formatting for quanta-trace. Buckets are the kernel
// side's, unchanged: percentiles are estimates within a factor-of-two bucket.
#include "bpf/histogram.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace quanta::bpf {

void Histogram::add(const quanta_hist& raw) {
  for (int i = 0; i < kSlots; ++i) slots_[i] += raw.slots[i];
  count_ += raw.count;
  sum_ns_ += raw.sum_ns;
}

void Histogram::add(const Histogram& other) {
  for (int i = 0; i < kSlots; ++i) slots_[i] += other.slots_[i];
  count_ += other.count_;
  sum_ns_ += other.sum_ns_;
}

void Histogram::record(uint64_t ns) {
  int slot = ns == 0 ? 0 : 63 - __builtin_clzll(ns);
  if (slot >= kSlots) slot = kSlots - 1;
  ++slots_[slot];
  ++count_;
  sum_ns_ += ns;
}

double Histogram::percentile_ns(double q) const {
  uint64_t total = 0;
  for (uint64_t s : slots_) total += s;
  if (total == 0) return 0.0;
  const double target = q * static_cast<double>(total);
  double before = 0.0;
  for (int i = 0; i < kSlots; ++i) {
    if (slots_[i] == 0) continue;
    const double after = before + static_cast<double>(slots_[i]);
    if (after >= target) {
      const double fraction = (target - before) / static_cast<double>(slots_[i]);
      return static_cast<double>(low_ns(i)) +
             fraction * static_cast<double>(high_ns(i) - low_ns(i));
    }
    before = after;
  }
  return static_cast<double>(high_ns(kSlots - 1));
}

nlohmann::json Histogram::to_json() const {
  nlohmann::json buckets = nlohmann::json::array();
  for (int i = 0; i < kSlots; ++i) {
    if (slots_[i] == 0) continue;
    buckets.push_back({{"low_ns", low_ns(i)}, {"high_ns", high_ns(i)}, {"count", slots_[i]}});
  }
  return {
      {"count", count_},
      {"sum_ns", sum_ns_},
      {"mean_ns", count_ ? static_cast<double>(sum_ns_) / static_cast<double>(count_) : 0.0},
      {"p50_ns", percentile_ns(0.50)},
      {"p99_ns", percentile_ns(0.99)},
      {"buckets", std::move(buckets)},
  };
}

std::string format_duration_ns(double ns) {
  char buf[32];
  if (ns < 1e3) {
    std::snprintf(buf, sizeof buf, "%.0fns", ns);
  } else if (ns < 1e6) {
    std::snprintf(buf, sizeof buf, "%.3gus", ns / 1e3);
  } else if (ns < 1e9) {
    std::snprintf(buf, sizeof buf, "%.3gms", ns / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.3gs", ns / 1e9);
  }
  return buf;
}

void Histogram::print(std::ostream& out, std::string_view title) const {
  out << title << ": ";
  if (empty()) {
    out << "no samples\n";
    return;
  }
  out << "count " << count_ << ", mean "
      << format_duration_ns(static_cast<double>(sum_ns_) / static_cast<double>(count_)) << ", p50 ~"
      << format_duration_ns(percentile_ns(0.50)) << ", p99 ~"
      << format_duration_ns(percentile_ns(0.99)) << "\n";
  int first = 0;
  int last = kSlots - 1;
  while (first < kSlots && slots_[first] == 0) ++first;
  while (last > first && slots_[last] == 0) --last;
  const uint64_t peak = *std::max_element(slots_.begin(), slots_.end());
  constexpr int kBarWidth = 40;
  char line[160];
  std::snprintf(line, sizeof line, "%24s : %-10s %s\n", "range", "count", "distribution");
  out << line;
  for (int i = first; i <= last; ++i) {
    const std::string range = format_duration_ns(static_cast<double>(low_ns(i))) + " -> " +
                              format_duration_ns(static_cast<double>(high_ns(i)));
    const int stars = static_cast<int>(slots_[i] * kBarWidth / peak);
    std::snprintf(line, sizeof line, "%24s : %-10llu |%-*s|\n", range.c_str(),
                  static_cast<unsigned long long>(slots_[i]), kBarWidth,
                  std::string(static_cast<size_t>(stars), '*').c_str());
    out << line;
  }
}

void write_prometheus_header(std::ostream& out, std::string_view metric, std::string_view help) {
  out << "# HELP " << metric << ' ' << help << '\n';
  out << "# TYPE " << metric << " histogram\n";
}

void Histogram::write_prometheus(std::ostream& out, std::string_view metric,
                                 std::string_view labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  int last = kSlots - 1;
  while (last > 0 && slots_[last] == 0) --last;
  uint64_t cumulative = 0;
  char le[32];
  for (int i = 0; i <= last; ++i) {
    cumulative += slots_[i];
    std::snprintf(le, sizeof le, "%.9g", static_cast<double>(high_ns(i)) / 1e9);
    out << metric << "_bucket{" << labels << sep << "le=\"" << le << "\"} " << cumulative << '\n';
  }
  uint64_t total = 0;  // from the slots, so +Inf always equals the last bucket and _count
  for (uint64_t s : slots_) total += s;
  out << metric << "_bucket{" << labels << sep << "le=\"+Inf\"} " << total << '\n';
  std::snprintf(le, sizeof le, "%.9g", static_cast<double>(sum_ns_) / 1e9);
  const std::string braces = labels.empty() ? "" : "{" + std::string(labels) + "}";
  out << metric << "_sum" << braces << ' ' << le << '\n';
  out << metric << "_count" << braces << ' ' << total << '\n';
}

}  // namespace quanta::bpf
