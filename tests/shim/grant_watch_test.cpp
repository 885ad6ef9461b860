// Unit tests of the device thread's watch over unused grants (shim/link/grant_watch.cpp), over a
// control region and gate channel of the test's own, with the doorbell counted.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "shim/link/link_state.h"

namespace quanta::shim {

int g_rings = 0;
void ring_doorbell() {
  ++g_rings;
}

namespace {

constexpr uint64_t kIdleRelease = 2 * kNsPerMs;
constexpr uint64_t kStart = 5 * kNsPerSec;

// One process's binding on one GPU, holding turn 1 of slot 0 while one other slot waits.
struct Held {
  std::unique_ptr<ControlRegion> control = std::make_unique<ControlRegion>();
  GateChannel channel{};
  Binding binding;
  Route route{};
  Held() {
    control->header.idle_release_ns.store(kIdleRelease);
    control->header.waiters.store(1);
    control->slots[0].turn.store(1);
    channel.last_launch_ns.store(kStart - 30 * kNsPerMs);  // its last turn's launches
    route.control = control.get();
    route.slot = &control->slots[0];
    route.channel = &channel;
    g_rings = 0;
  }
  uint64_t look(uint64_t now) { return ring_when_grant_unused(&binding, &route, now); }
};

// Granted while another waits, it launches nothing: one ring, idle_release after the device
// thread saw the grant, and the thread asks to wake for it then.
TEST(GrantWatch, AnUnusedGrantIsRungAboutOnceAfterIdleRelease) {
  Held held;
  EXPECT_EQ(held.look(kStart), kIdleRelease) << "asks to wake when the ring is due";
  EXPECT_EQ(held.look(kStart + kIdleRelease / 2), kIdleRelease / 2);
  EXPECT_EQ(g_rings, 0) << "rang before idle_release";
  EXPECT_EQ(held.look(kStart + kIdleRelease), 0u);
  EXPECT_EQ(g_rings, 1);
  held.look(kStart + 3 * kIdleRelease);
  EXPECT_EQ(g_rings, 1) << "rang twice for one grant";

  // Revoked, then granted again (turn 3) and unused again: rung about again.
  held.control->slots[0].turn.store(2);
  EXPECT_EQ(held.look(kStart + 10 * kNsPerMs), 0u);
  held.control->slots[0].turn.store(3);
  held.look(kStart + 20 * kNsPerMs);
  held.look(kStart + 20 * kNsPerMs + kIdleRelease);
  EXPECT_EQ(g_rings, 2);
}

// A launch under the grant (a moved stamp), or work queued, settles it: its quiet, when the
// work runs out, is ring_when_quiet's to ring about.
TEST(GrantWatch, AGrantThatIsUsedIsNotRungAbout) {
  for (int sign = 0; sign < 3; ++sign) {
    Held held;
    held.look(kStart);
    if (sign == 0) held.channel.last_launch_ns.store(kStart + 100 * 1000);
    if (sign == 1) held.channel.inflight_ns.store(4 * kNsPerMs);
    if (sign == 2) held.binding.work.head.store(1);
    EXPECT_EQ(held.look(kStart + 500 * 1000), 0u) << "sign " << sign;
    held.channel.inflight_ns.store(0);
    held.binding.work.head.store(0);
    held.look(kStart + 5 * kIdleRelease);
    EXPECT_EQ(g_rings, 0) << "sign " << sign;
  }
}

// Nothing to ring about: nobody waits when it falls due, the turn is not held, or the
// arbiter predates the watch (it leaves idle_release_ns at 0 and still looks itself).
TEST(GrantWatch, NoRingWithoutWaitersAHeldTurnOrAnArbiterThatAsks) {
  Held alone;
  alone.control->header.waiters.store(0);
  alone.look(kStart);
  EXPECT_EQ(alone.look(kStart + kIdleRelease), 0u);
  EXPECT_EQ(g_rings, 0);

  Held revoked;
  revoked.control->slots[0].turn.store(2);
  EXPECT_EQ(revoked.look(kStart), 0u);
  revoked.look(kStart + kIdleRelease);
  EXPECT_EQ(g_rings, 0);

  Held older;
  older.control->header.idle_release_ns.store(0);
  EXPECT_EQ(older.look(kStart), 0u);
  older.look(kStart + 10 * kIdleRelease);
  EXPECT_EQ(g_rings, 0);
}

}  // namespace
}  // namespace quanta::shim
