// Percentiles, ratios and the target verdicts quanta-bench prints.
#include "bench/scenarios.h"
#include "bench/stats.h"

#include <gtest/gtest.h>

namespace quanta::bench {
namespace {

TEST(Stats, PercentileInterpolatesBetweenRanks) {
  EXPECT_FALSE(percentile({}, 50));
  EXPECT_DOUBLE_EQ(*percentile({3, 1, 2}, 50), 2.0);
  EXPECT_DOUBLE_EQ(*percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(*percentile({1, 2, 3, 4}, 100), 4.0);
  EXPECT_DOUBLE_EQ(*percentile({5}, 99), 5.0);
}

TEST(Stats, MissingFiguresBecomeNullNotZero) {
  EXPECT_TRUE(figure(std::nullopt).is_null());
  EXPECT_TRUE(figure(ratio(1.0, 0.0)).is_null());
  EXPECT_TRUE(figure(ratio(std::nullopt, 2.0)).is_null());
  EXPECT_DOUBLE_EQ(figure(ratio(1.0, 3.0), 2).get<double>(), 0.33);
}

TEST(Targets, VerdictAndMarginFollowTheComparison) {
  Json met = target("error <= 2", 1.5, 2.0, true);
  EXPECT_TRUE(met["met"].get<bool>());
  EXPECT_DOUBLE_EQ(met["margin"].get<double>(), -0.5);
  Json missed = target("ratio >= 1", 0.9, 1.0, false);
  EXPECT_FALSE(missed["met"].get<bool>());
  Json unmeasured = target("x <= 1", std::nullopt, 1.0, true);
  EXPECT_TRUE(unmeasured["met"].is_null());
  EXPECT_TRUE(unmeasured["value"].is_null());
}

TEST(Notes, AccumulateInOneString) {
  Json obj = Json::object();
  add_note(obj, "first");
  add_note(obj, "");
  add_note(obj, "second");
  EXPECT_EQ(obj["note"].get<std::string>(), "first; second");
}

}  // namespace
}  // namespace quanta::bench
