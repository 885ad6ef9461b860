// UsageLog sums over sliding windows (shared stretches count 1/n) and the guarantee's
// token bucket (earns only while earning, capped at one window's worth, spent exactly).
#include "arbiter/scheduling/share_window.h"

#include <gtest/gtest.h>

namespace quanta::arbiter {
namespace {

constexpr uint64_t kMs = 1'000'000;

TEST(UsageLog, SumsOverlapWithTheWindow) {
  UsageLog log;
  log.add(0, 100 * kMs);
  log.add(200 * kMs, 300 * kMs);
  EXPECT_EQ(log.used(0, 1000 * kMs), 200 * kMs);
  EXPECT_EQ(log.used(50 * kMs, 250 * kMs), 100 * kMs);
  EXPECT_EQ(log.used(300 * kMs, 400 * kMs), 0u);
}

TEST(UsageLog, SharedStretchesCountAFraction) {
  UsageLog log;
  log.add(0, 100 * kMs, 2);
  EXPECT_EQ(log.used(0, 100 * kMs), 50 * kMs);
}

TEST(UsageLog, BackToBackPiecesMerge) {
  UsageLog log;
  for (uint64_t t = 0; t < 1000; ++t) log.add(t * kMs, (t + 1) * kMs);
  EXPECT_EQ(log.used(0, 1000 * kMs), 1000 * kMs);
  log.trim(999 * kMs);
  EXPECT_FALSE(log.empty()) << "one merged piece still overlaps";
  EXPECT_EQ(log.used(500 * kMs, 1000 * kMs), 500 * kMs);
}

TEST(UsageLog, DropsToSaysWhenOldUseLeavesTheWindow) {
  UsageLog log;
  log.add(0, 300 * kMs);  // 300 ms at the start of a 1 s window
  const uint64_t now = 500 * kMs;
  EXPECT_EQ(log.drops_to(300 * kMs, now, 1000 * kMs), now);
  // To get down to 100 ms, 200 ms must leave: at t = 1 s + 200 ms.
  EXPECT_EQ(log.drops_to(100 * kMs, now, 1000 * kMs), 1200 * kMs);
}

TEST(GuaranteeCredit, EarnsOnlyWhileEarningUpToAWindow) {
  GuaranteeCredit c;
  c.configure(250000, 250 * kMs);  // 25% of a 1 s window: at most 250 ms of credit
  c.settle(1000 * kMs, false);
  c.settle(1100 * kMs, true);
  EXPECT_EQ(c.credit(), 25 * kMs);
  c.settle(1200 * kMs, false);  // was not earning in between
  EXPECT_EQ(c.credit(), 25 * kMs);
  c.settle(9000 * kMs, true);
  EXPECT_EQ(c.credit(), 250 * kMs) << "capped at one window";
  c.spend(100 * kMs);
  EXPECT_EQ(c.credit(), 150 * kMs);
  c.spend(200 * kMs);  // a drain past the credit: a debt of 50 ms
  EXPECT_EQ(c.credit(), 0u);
  EXPECT_EQ(c.balance(), -50 * static_cast<int64_t>(kMs));
  EXPECT_EQ(c.time_to(25 * kMs), 300 * kMs) << "earns the debt back first";
  c.spend(10000 * kMs);
  EXPECT_EQ(c.balance(), -250 * static_cast<int64_t>(kMs)) << "a debt is bounded by a window";
}

TEST(GuaranteeCredit, SmallSettlesAddUpExactly) {
  GuaranteeCredit c;
  c.configure(333333, 1000 * kMs);
  c.settle(1, false);
  for (uint64_t t = 1; t <= 300000; ++t) c.settle(1 + t * 1000, true);  // 300 ms in 1 us steps
  EXPECT_NEAR(static_cast<double>(c.credit()), 300 * kMs * 0.333333, 2.0);
}

}  // namespace
}  // namespace quanta::arbiter
