// Percentiles, means and null-aware JSON figures.
#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace quanta::bench {

std::optional<double> percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return std::nullopt;
  std::sort(samples.begin(), samples.end());
  double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(samples.size() - 1);
  size_t low = static_cast<size_t>(std::floor(rank));
  size_t high = static_cast<size_t>(std::ceil(rank));
  double fraction = rank - static_cast<double>(low);
  return samples[low] + (samples[high] - samples[low]) * fraction;
}

std::optional<double> mean(const std::vector<double>& samples) {
  if (samples.empty()) return std::nullopt;
  return std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
}

nlohmann::json figure(std::optional<double> value, int digits) {
  if (!value || !std::isfinite(*value)) return nullptr;
  double scale = std::pow(10.0, digits);
  return std::round(*value * scale) / scale;
}

std::optional<double> ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b == 0.0) return std::nullopt;
  return *a / *b;
}

std::optional<double> number_field(const nlohmann::json& object, std::initializer_list<const char*> names) {
  if (!object.is_object()) return std::nullopt;
  for (const char* name : names) {
    auto it = object.find(name);
    if (it != object.end() && it->is_number()) return it->get<double>();
  }
  return std::nullopt;
}

}  // namespace quanta::bench
