// The arbiter's first-in, first-out ring (arbiter/scheduling/ring.h): order kept across wrap-around and
// growth, and no new storage once it is as long as it gets.
#include "arbiter/scheduling/ring.h"

#include <gtest/gtest.h>

#include <vector>

namespace quanta::arbiter {
namespace {

std::vector<int> contents(const Ring<int>& ring) {
  return std::vector<int>(ring.begin(), ring.end());
}

TEST(Ring, KeepsOrderAcrossWrapAroundAndGrowth) {
  Ring<int> ring;
  EXPECT_TRUE(ring.empty());
  int next = 0;
  int oldest = 0;
  // Slide a window of 10 over 100 values: the head wraps many times in the first storage.
  for (; next < 100; ++next) {
    ring.push_back(next);
    if (ring.size() > 10) {
      ring.pop_front();
      ++oldest;
    }
    ASSERT_EQ(ring.front(), oldest);
    ASSERT_EQ(ring.back(), next);
  }
  // Grow while the head is mid-storage: the order survives the move.
  for (; next < 200; ++next) ring.push_back(next);
  ASSERT_EQ(ring.size(), 110u);
  const std::vector<int> all = contents(ring);
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], oldest + static_cast<int>(i));
  EXPECT_EQ(ring[5], oldest + 5);
  ring.back() = -1;
  EXPECT_EQ(contents(ring).back(), -1);
  ring.clear();
  EXPECT_TRUE(ring.empty());
  EXPECT_EQ(ring.begin(), ring.end());
}

TEST(Ring, ASlidingWindowKeepsItsStorage) {
  Ring<int> ring;
  for (int i = 0; i < 40; ++i) ring.push_back(i);
  const int* storage = &ring.front();  // nothing dropped yet: the start of 64 entries' storage
  for (int i = 40; i < 10000; ++i) {
    ring.push_back(i);
    ring.pop_front();
  }
  EXPECT_EQ(ring.size(), 40u);
  EXPECT_EQ(ring.front(), 10000 - 40);
  // Same storage: every entry still lies within it.
  for (size_t i = 0; i < ring.size(); ++i) {
    EXPECT_LE(storage, &ring[i]);
    EXPECT_LT(&ring[i], storage + 64);
  }
}

}  // namespace
}  // namespace quanta::arbiter
