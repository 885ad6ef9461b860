// The arbiter's event loop: waits that end at the deadline the arbiter keeps (no timerfd per
// GPU), one wake-up shared by the GPUs' deadlines that may wait for each other, and
// edge-triggered eventfds whose every write is an event though nothing reads them.
#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "arbiter/loop/event_loop.h"
#include "common/clock.h"

namespace quanta::arbiter {
namespace {

using common::monotonic_ns;
constexpr uint64_t kMs = 1000000;

TEST(SharedWakeup, DeadlinesThatMayWaitForEachOtherShareOneWakeUp) {
  auto wake = [](std::vector<DeadlineWindow> windows) {
    return shared_wakeup(windows, [](const DeadlineWindow& w) { return w; });
  };
  EXPECT_EQ(wake({}), 0u);
  EXPECT_EQ(wake({{0, 0}, {0, 0}}), 0u) << "no deadline, no wake-up";
  EXPECT_EQ(wake({{100, 100}}), 100u) << "an exact deadline alone";
  EXPECT_EQ(wake({{100, 120}}), 100u) << "a window alone is served at its start";
  EXPECT_EQ(wake({{100, 120}, {110, 110}}), 110u) << "one wake-up for both";
  EXPECT_EQ(wake({{100, 120}, {115, 130}, {118, 140}}), 118u) << "three quanta in one wake-up";
  EXPECT_EQ(wake({{100, 120}, {121, 130}}), 100u) << "apart: the first is not kept waiting";
  EXPECT_EQ(wake({{100, 120}, {105, 105}, {110, 130}}), 105u)
      << "never past an exact deadline";
  EXPECT_EQ(wake({{100, 50}, {101, 101}}), 100u) << "a latest before its start counts as exact";
  EXPECT_EQ(wake({{0, 0}, {100, 120}, {0, 0}, {119, 119}}), 119u) << "GPUs without a deadline";
}

TEST(EventLoop, AWaitEndsAtTheNextDeadlineAndAfterEventsSeesItDue) {
  EventLoop loop;
  const uint64_t start = monotonic_ns();
  std::vector<uint64_t> deadlines = {start + 30 * kMs, start + 60 * kMs, start + 90 * kMs};
  size_t next = 0;
  std::vector<uint64_t> served;
  loop.set_next_deadline([&] { return next < deadlines.size() ? deadlines[next] : 0; });
  loop.set_after_events([&] {
    const uint64_t now = monotonic_ns();
    if (next < deadlines.size() && deadlines[next] <= now) {
      served.push_back(now);
      ++next;
    }
    if (next == deadlines.size()) loop.stop();
  });
  loop.run();
  ASSERT_EQ(served.size(), deadlines.size());
  for (size_t i = 0; i < deadlines.size(); ++i) {
    EXPECT_GE(served[i], deadlines[i]) << "deadline " << i << " served early";
    // Generous: a loaded machine may run the loop late, never a second late.
    EXPECT_LT(served[i] - deadlines[i], 500 * kMs) << "deadline " << i;
  }
}

TEST(EventLoop, WithNothingToDoTheLoopSleepsUntilItsDeadline) {
  EventLoop loop;
  const uint64_t deadline = monotonic_ns() + 300 * kMs;
  int passes = 0;
  loop.set_next_deadline([&] { return deadline; });
  loop.set_after_events([&] {
    ++passes;
    if (monotonic_ns() >= deadline) loop.stop();
  });
  loop.run();
  EXPECT_LE(passes, 3) << "the loop woke " << passes << " times in 300 ms with nothing to do";
}

// Stops itself (handlers and after_events run on the loop's thread); the ringer thread only
// writes to the eventfd and reads the atomic count.
TEST(EventLoop, EveryWriteToAnEdgeTriggeredEventfdIsAnEventThoughNothingReadsIt) {
  EventLoop loop;
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  constexpr int kRings = 5;
  std::atomic<int> rings{0};
  loop.add(
      fd,
      [&](uint32_t) {
        if (rings.fetch_add(1) + 1 == kRings) loop.stop();
      },
      EPOLLIN | EPOLLET);
  const uint64_t give_up = monotonic_ns() + 10000 * kMs;
  loop.set_next_deadline([&] { return give_up; });
  loop.set_after_events([&] {
    if (monotonic_ns() >= give_up) loop.stop();
  });
  std::thread ringer([&] {
    for (int i = 0; i < kRings; ++i) {
      const uint64_t one = 1;
      EXPECT_EQ(write(fd, &one, sizeof one), static_cast<ssize_t>(sizeof one));
      // The next ring only once the loop saw this one: each write must be an event of its own.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (rings.load() <= i && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  loop.run();
  ringer.join();
  EXPECT_EQ(rings.load(), kRings) << "rings after the first were lost";
  close(fd);
}

}  // namespace
}  // namespace quanta::arbiter
