// VirtualClock's invariants: floors never fall, a member's virtual time never falls, a
// waking member keeps at most the lag of credit, members that are not contending cannot
// hold a lane's floor back, charges are exact over many small pieces, and renormalisation
// keeps every order and difference within a lane.
#include "arbiter/scheduling/virtual_clock.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace quanta::arbiter {
namespace {

constexpr uint64_t kLag = 20'000'000;
constexpr uint64_t kScale = VirtualClock::kScale;

TEST(VirtualClock, ChargesAdvanceByTimeOverWeight) {
  VirtualClock c(1, kLag);
  c.join(1, 0, 4);
  c.charge(1, 1'000'000);
  EXPECT_EQ(c.vtime(1), 1'000'000 * kScale / 4);
}

TEST(VirtualClock, ManySmallChargesSumExactly) {
  VirtualClock c(1, kLag);
  c.join(1, 0, 7);
  for (int i = 0; i < 7000; ++i) c.charge(1, 3);  // 3 * 1000 / 7 is not whole
  EXPECT_EQ(c.vtime(1), 7000ull * 3 * kScale / 7);
}

TEST(VirtualClock, NewMembersStartAtTheFloor) {
  VirtualClock c(1, kLag);
  c.join(1, 0, 1);
  c.charge(1, 500'000'000);
  c.set_contending(1, true);
  c.settle_floors();
  c.join(2, 0, 1);
  EXPECT_EQ(c.vtime(2), c.floor(0));
  EXPECT_EQ(c.floor(0), 500'000'000 * kScale);
}

TEST(VirtualClock, WakingMembersKeepAtMostTheLag) {
  VirtualClock c(1, kLag);
  c.join(1, 0, 1);
  c.join(2, 0, 2);
  c.set_contending(1, true);
  c.charge(1, 10'000'000'000);  // member 1 runs alone for 10 s while 2 sleeps
  c.settle_floors();
  c.lift(2);
  EXPECT_EQ(c.vtime(2), c.floor(0) - kLag * kScale / 2)
      << "a weight-2 member's lag is half the virtual time";
  const uint64_t before = c.vtime(2);
  c.lift(2);
  EXPECT_EQ(c.vtime(2), before) << "lifting twice banks nothing more";
  c.charge(2, 1'000'000'000);
  const uint64_t ahead = c.vtime(2);
  c.lift(2);
  EXPECT_EQ(c.vtime(2), ahead) << "a lift never lowers";
}

// A member held back by a ceiling does not contend, and a member of a lower lane cannot
// touch a higher lane's floor: neither keeps the floor down for members arriving later.
TEST(VirtualClock, MembersThatDoNotContendDoNotHoldTheFloorBack) {
  VirtualClock c(3, kLag);
  c.join(1, 1, 1);  // served batch member
  c.join(2, 1, 1);  // a batch member that waits, held back by its ceiling
  c.join(3, 2, 1);  // best-effort, outranked, waiting the whole time
  c.set_contending(1, true);
  c.set_contending(3, true);
  for (int i = 0; i < 600; ++i) {
    c.charge(1, 100'000'000);
    c.settle_floors();
  }
  c.join(4, 1, 1);
  EXPECT_EQ(c.vtime(4), c.vtime(1));
  EXPECT_EQ(c.floor(2), 0u) << "lanes are independent";
  // Contending members set the floor to the least of them, never lowering it.
  c.set_contending(2, true);
  c.settle_floors();
  EXPECT_EQ(c.floor(1), c.vtime(1)) << "a member behind the floor lowered it";
}

TEST(VirtualClock, ChangingLaneLiftsToTheNewLane) {
  VirtualClock c(3, kLag);
  c.join(1, 0, 1);
  c.join(2, 1, 1);
  c.charge(2, 3'000'000'000);
  c.set_contending(2, true);
  c.settle_floors();
  c.set_lane(1, 1);
  EXPECT_EQ(c.lane(1), 1u);
  EXPECT_EQ(c.vtime(1), c.floor(1) - kLag * kScale);
}

// A weight change prices what comes next at the new weight; credit behind the floor is
// cut to the lag, so a heavier weight cannot multiply an old credit.
TEST(VirtualClock, WeightChangesPriceWhatComesNextAndKeepAtMostTheLag) {
  VirtualClock c(1, kLag);
  c.join(1, 0, 1);
  c.join(2, 0, 1);
  c.set_contending(1, true);
  c.charge(1, 10'000'000'000);  // member 2 is 10 s behind (it was not contending)
  c.settle_floors();
  c.set_weight(2, 10);
  EXPECT_EQ(c.vtime(2), c.floor(0) - kLag * kScale / 10);
  const uint64_t before = c.vtime(1);
  c.set_weight(1, 4);
  EXPECT_EQ(c.vtime(1), before) << "a member at the floor keeps its place";
  c.charge(1, 1'000'000);
  EXPECT_EQ(c.vtime(1), before + 1'000'000 * kScale / 4);
}

// Random operations: floors and virtual times never decrease (except by a renormalising
// shift, which moves a lane and its members together), and lifts keep the lag bound.
TEST(VirtualClock, RandomOperationsKeepTheInvariants) {
  std::mt19937_64 rng(7);
  VirtualClock c(3, kLag);
  std::vector<uint64_t> floors(3, 0);
  std::map<uint32_t, uint64_t> seen;
  for (uint32_t id = 0; id < 8; ++id) c.join(id, id % 3, 1 + id);
  for (int step = 0; step < 200000; ++step) {
    const uint32_t id = static_cast<uint32_t>(rng() % 8);
    const uint32_t lane = c.lane(id);
    switch (rng() % 5) {
      case 0:
        c.charge(id, rng() % 100'000'000);
        break;
      case 1:
        c.set_contending(id, !c.contending(id));
        c.settle_floors();
        break;
      case 2:
        c.lift(id);
        EXPECT_GE(c.vtime(id) + c.lag_of(id), c.floor(lane));
        break;
      case 3:
        c.set_weight(id, 1 + static_cast<uint32_t>(rng() % 16));
        break;
      default:
        break;
    }
    for (uint32_t l = 0; l < 3; ++l) {
      ASSERT_GE(c.floor(l), floors[l]) << "a floor fell at step " << step;
      floors[l] = c.floor(l);
    }
    if (seen.count(id) && c.lane(id) == lane) {
      ASSERT_GE(c.vtime(id), seen[id]) << "a member's virtual time fell at step " << step;
    }
    seen[id] = c.vtime(id);
  }
}

TEST(VirtualClock, RenormalisingKeepsOrderAndDifferences) {
  VirtualClock c(1, kLag);
  c.join(1, 0, 1);
  c.join(2, 0, 1);
  c.charge(2, 5'000);
  c.set_contending(1, true);
  const uint64_t gap = c.vtime(2) - c.vtime(1);
  // Drive the floor past the renormalisation point: both advance together.
  const uint64_t step = 1ull << 40;
  while (c.floor(0) < VirtualClock::kRenormaliseAt / 2) {
    c.charge(1, step);
    c.charge(2, step);
    c.settle_floors();
  }
  for (int i = 0; i < 8192; ++i) {
    c.charge(1, step);
    c.charge(2, step);
    c.settle_floors();
    ASSERT_LT(c.floor(0), VirtualClock::kRenormaliseAt);
  }
  EXPECT_EQ(c.vtime(2) - c.vtime(1), gap);
}

}  // namespace
}  // namespace quanta::arbiter
