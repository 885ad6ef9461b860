// pair_handoffs (bpf/handoff_model.h) on hand-made events: which release pairs with which
// gate pass, timed by the stamps the probes carry.
#include "bpf/handoff_model.h"

#include <gtest/gtest.h>

namespace quanta::bpf {
namespace {

// A release by `pid` stamped `at`, and a gate pass by `pid` stamped `at` after waiting
// `waited`, as the handoff session records them (slot = pid here).
quanta_handoff_event release(uint32_t pid, uint64_t at, uint32_t device = 0) {
  return {at, 0, pid, pid, device, pid, QUANTA_PROBE_RELEASE, 0};
}
quanta_handoff_event pass(uint32_t pid, uint64_t waited, uint64_t at, uint32_t device = 0) {
  return {at, waited, pid, pid, device, pid, QUANTA_PROBE_GATE_WAIT_END, 0};
}

TEST(HandoffPairing, CountsFromAReleaseToThePassOfAProcessThatWasWaiting) {
  // Process 10 releases at 100; process 20, waiting since 50, passes its gate at 130.
  const auto handoffs = pair_handoffs({release(10, 100), pass(20, 80, 130)});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_DOUBLE_EQ(handoffs[0].us, 0.03);
  EXPECT_EQ(handoffs[0].released_ns, 100u);
  EXPECT_EQ(handoffs[0].from_pid, 10u);
  EXPECT_EQ(handoffs[0].to_pid, 20u);
  EXPECT_TRUE(handoffs[0].first_pass);
}

TEST(HandoffPairing, LeavesOutWaitsThatBeganAfterTheReleaseOtherDevicesAndTheReleaser) {
  EXPECT_TRUE(pair_handoffs({
                                release(10, 100),
                                pass(20, 1000, 6000),    // started waiting late, at 5000
                                pass(30, 100, 150, 1),   // another device
                                pass(10, 100, 7100),     // the releaser itself
                            })
                  .empty());
  // The release stays for the next process that was waiting: 40 waited from 90.
  const auto handoffs =
      pair_handoffs({release(10, 100), pass(20, 1000, 6000), pass(40, 7010, 7100)});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_EQ(handoffs[0].to_pid, 40u);
  EXPECT_DOUBLE_EQ(handoffs[0].us, 7.0);
}

TEST(HandoffPairing, FollowsTheStampsOrderWhereEventsArriveOutOfIt) {
  // The waiter's pass was recorded before the release's trap ended: it arrives first, but
  // by the stamps it follows the release.
  const auto handoffs = pair_handoffs({pass(20, 60'000, 35'000), release(10, 20'000)});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_DOUBLE_EQ(handoffs[0].us, 15.0);
}

TEST(HandoffPairing, MarksEachProcesssFirstPassOfItsGate) {
  // Process 20 waits from the start and first passes its gate after 10's release; 10's
  // first pass follows 20's release; 20's second pass is a handoff between running ones.
  const auto handoffs = pair_handoffs({
      release(10, 1'000'000), pass(20, 3'900'000, 4'000'000),
      release(20, 5'000'000), pass(10, 4'500'000, 5'010'000),
      release(10, 6'000'000), pass(20, 900'000, 6'030'000),
  });
  ASSERT_EQ(handoffs.size(), 3u);
  EXPECT_TRUE(handoffs[0].first_pass);
  EXPECT_TRUE(handoffs[1].first_pass);
  EXPECT_FALSE(handoffs[2].first_pass);
  EXPECT_DOUBLE_EQ(handoffs[2].us, 30.0);
}

TEST(HandoffPairing, TwoSlotsOfOneProcessHandOffToEachOther) {
  quanta_handoff_event released = release(10, 100);
  quanta_handoff_event passed = pass(10, 80, 130);
  passed.slot = 11;
  passed.tid = 12;
  const auto handoffs = pair_handoffs({released, passed});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_EQ(handoffs[0].from_slot, 10u);
  EXPECT_EQ(handoffs[0].to_slot, 11u);
  EXPECT_EQ(handoffs[0].to_tid, 12u);
}

TEST(HandoffPairing, IgnoresTheProbesThatTimeNoHandoff) {
  quanta_handoff_event begin = release(20, 110);
  begin.probe = QUANTA_PROBE_GATE_WAIT_BEGIN;
  quanta_handoff_event grant = release(20, 120);
  grant.probe = QUANTA_PROBE_GRANT;
  const auto handoffs = pair_handoffs({release(10, 100), begin, grant, pass(20, 80, 130)});
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_EQ(handoffs[0].released_ns, 100u);
}

}  // namespace
}  // namespace quanta::bpf
