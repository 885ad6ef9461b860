// Unit tests of how a launch is counted and stamped (note_launch in shim/link/link_state.h, the
// rest in shim/link/activity.cpp), over a control region and gate channel of the test's own. The
// coarse clock is the test's: this binary defines clock_gettime, so CLOCK_MONOTONIC_COARSE
// reads are counted and answer the tick the test sets; other clocks ask the kernel.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <memory>

#include "shim/link/link_state.h"

namespace {

uint64_t g_coarse_now = 0;
int g_coarse_reads = 0;

}  // namespace

extern "C" int clock_gettime(clockid_t clock, timespec* ts) noexcept {
  if (clock != CLOCK_MONOTONIC_COARSE)
    return static_cast<int>(syscall(SYS_clock_gettime, clock, ts));
  ++g_coarse_reads;
  ts->tv_sec = static_cast<time_t>(g_coarse_now / quanta::common::kNsPerSec);
  ts->tv_nsec = static_cast<long>(g_coarse_now % quanta::common::kNsPerSec);
  return 0;
}

namespace quanta::shim {

Process g_process;
Binding g_bindings[kMaxGpus];
QUANTA_TLS constinit bool t_in_link = false;
void* real_driver_symbol(const char*) noexcept {
  return nullptr;
}
void ring_doorbell() {}

namespace {

constexpr uint64_t kTick = 4 * kNsPerMs;

// One process's binding on GPU 0, holding its turn; nobody waits unless a test says so.
struct Holder {
  std::unique_ptr<ControlRegion> control = std::make_unique<ControlRegion>();
  GateChannel channel{};
  Route route{};
  Binding* binding = &g_bindings[0];
  Holder() {
    control->slots[0].turn.store(1);
    route.control = control.get();
    route.slot = &control->slots[0];
    route.channel = &channel;
    binding->route.store(&route);
    activity_reset_in_child();  // this thread's counts and clock reads start afresh
    g_coarse_now = 100 * kTick;
    g_coarse_reads = 0;
  }
  ~Holder() { binding->route.store(nullptr); }
  void launch() { note_launch(binding, &route); }
  uint64_t launches_published() {
    publish_pending_launches(0);
    return channel.launches.load();
  }
};

// The launch-bound loop the fast path is for: the coarse clock is read once every
// kMaxUnclockedLaunches + 1 launches, after a few closer reads at the start of the tick, and
// every launch is counted.
TEST(LaunchStamp, ALaunchBoundThreadReadsTheClockOnceInThirtyTwoLaunches) {
  Holder holder;
  constexpr int kLaunches = 3200;
  for (int i = 0; i < kLaunches; ++i) holder.launch();
  EXPECT_LE(g_coarse_reads, kLaunches / 32 + 8) << "clock reads for " << kLaunches << " launches";
  EXPECT_GE(g_coarse_reads, kLaunches / 32);
  EXPECT_EQ(holder.launches_published(), static_cast<uint64_t>(kLaunches));
  EXPECT_EQ(holder.binding->stamped_tick.load(), g_coarse_now) << "the tick was stamped";
}

// A new tick is stamped within no more launches than the thread made in the tick before
// (and never more than 32), so at a steady rate the stamp follows it within about a tick.
TEST(LaunchStamp, ANewTickIsStampedWithinAsManyLaunchesAsTheTickBefore) {
  for (const int before : {1, 2, 5, 20, 1000}) {
    Holder holder;
    for (int i = 0; i < before; ++i) holder.launch();
    g_coarse_now += kTick;
    int launches = 0;
    while (holder.binding->stamped_tick.load() != g_coarse_now && launches < 10000) {
      holder.launch();
      ++launches;
    }
    EXPECT_GE(launches, 1);
    EXPECT_LE(launches, std::min(before, 32))
        << "after " << before << " launches in the tick before";
    EXPECT_EQ(holder.launches_published(), static_cast<uint64_t>(before + launches));
  }
}

// A thread that launches once per tick reads the clock at every launch and stamps each.
TEST(LaunchStamp, AThreadThatLaunchesOncePerTickStampsEveryLaunch) {
  Holder holder;
  for (int i = 0; i < 50; ++i) {
    g_coarse_now += kTick;
    const uint64_t before = monotonic_ns();
    holder.launch();
    EXPECT_EQ(holder.binding->stamped_tick.load(), g_coarse_now) << "launch " << i;
    EXPECT_GE(holder.channel.last_launch_ns.load(), before) << "launch " << i;
  }
  EXPECT_EQ(g_coarse_reads, 50);
}

// While others wait, every launch is stamped with the precise time, however many launches
// the thread may count unclocked otherwise; the arbiter judges idleness from it.
TEST(LaunchStamp, EveryLaunchIsStampedPreciselyWhileOthersWait) {
  Holder holder;
  for (int i = 0; i < 500; ++i) holder.launch();  // unclocked launches are owed
  holder.control->header.waiters.store(1);
  for (int i = 0; i < 100; ++i) {
    const uint64_t before = monotonic_ns();
    holder.launch();
    EXPECT_GE(holder.channel.last_launch_ns.load(), before) << "launch " << i;
    EXPECT_EQ(holder.binding->stamped_tick.load(), 0u) << "stamped as precise";
  }
  EXPECT_EQ(holder.launches_published(), 600u);
}

}  // namespace

}  // namespace quanta::shim
