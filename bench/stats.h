// Small statistics over samples: percentiles by linear interpolation between closest
// ranks, means, and the JSON helpers that turn a missing figure into null.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <vector>

namespace quanta::bench {

// p in [0, 100]; empty when there are no samples.
std::optional<double> percentile(std::vector<double> samples, double p);
std::optional<double> mean(const std::vector<double>& samples);

// A figure rounded to `digits` decimals, or null.
nlohmann::json figure(std::optional<double> value, int digits = 3);

// The ratio a/b, or empty when either is missing or b is 0.
std::optional<double> ratio(std::optional<double> a, std::optional<double> b);

// Reads a number from a JSON object field, accepting several spellings; empty if absent.
std::optional<double> number_field(const nlohmann::json& object, std::initializer_list<const char*> names);

}  // namespace quanta::bench
