// The arbiter's single-threaded event loop: epoll over sockets, doorbells, pidfds and
// timerfds, each registered with the callback that handles it, and waits that end at the
// earliest deadline the arbiter keeps.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "hosted/unique_fd.h"

struct epoll_event;

namespace quanta::arbiter {

// Throws std::runtime_error naming `what` and errno's text.
[[noreturn]] void throw_errno(const std::string& what);

// The host programs' owning descriptor, by the name the arbiter's files use.
using hosted::UniqueFd;

class EventLoop {
 public:
  using Handler = std::function<void(uint32_t events)>;

  EventLoop();
  // Watches fd for `events` (EPOLLIN by default); the handler runs on readiness.
  void add(int fd, Handler handler, uint32_t events = 0x001 /* EPOLLIN */);
  // Changes what an added fd is watched for (EPOLLIN, EPOLLOUT, both or none).
  void modify(int fd, uint32_t events);
  void remove(int fd);
  // Runs handlers until stop(); each wait is at most max_wait_ms.
  void run();
  void stop() { stopping_ = true; }
  bool stopping() const { return stopping_; }
  // Runs after every batch of events (the arbiter makes its decisions there).
  void set_after_events(std::function<void()> f) { after_events_ = std::move(f); }
  // Asked before every wait: the earliest CLOCK_MONOTONIC deadline (ns; 0: none) to wake
  // for. The wait itself times out there, so deadlines that move at every decision (the
  // schedulers') cost no timer syscall; after_events sees which fell due.
  void set_next_deadline(std::function<uint64_t()> f) { next_deadline_ = std::move(f); }

 private:
  template <typename F>
  void guarded(F&& f);
  int wait(::epoll_event* events, int capacity, uint64_t deadline);

  UniqueFd epoll_;
  std::map<int, std::shared_ptr<Handler>> handlers_;
  std::function<void()> after_events_;
  std::function<uint64_t()> next_deadline_;
  bool stopping_ = false;
  bool precise_wait_ = true;  // epoll_pwait2 works (Linux 5.11+); else millisecond waits
};

// A deadline that may be served anywhere from `at` to `latest` (CLOCK_MONOTONIC ns; `at`
// 0: none; `latest` below `at` counts as `at`).
struct DeadlineWindow {
  uint64_t at = 0;
  uint64_t latest = 0;
};

// When to wake for several deadline windows (0: none): at the latest `at` that is not past
// any window's `latest`, so that one wake-up serves every window whose `at` falls up to it.
// A window alone is served at its `at`. `window(item)` gives an item's DeadlineWindow.
template <typename Range, typename Window>
uint64_t shared_wakeup(const Range& items, Window window) {
  uint64_t bound = 0;
  for (const auto& item : items) {
    const DeadlineWindow w = window(item);
    if (w.at == 0) continue;
    const uint64_t latest = w.latest > w.at ? w.latest : w.at;
    if (bound == 0 || latest < bound) bound = latest;
  }
  uint64_t wake = 0;
  for (const auto& item : items) {
    const DeadlineWindow w = window(item);
    if (w.at != 0 && w.at <= bound && w.at > wake) wake = w.at;
  }
  return wake;
}

// A CLOCK_MONOTONIC timerfd armed at absolute deadlines (0 disarms).
class Timer {
 public:
  Timer();
  void arm_at(uint64_t monotonic_ns);
  // Consumes the expiration count; call from the loop handler.
  void acknowledge();
  int fd() const { return fd_.get(); }
  uint64_t armed_at() const { return armed_at_; }

 private:
  UniqueFd fd_;
  uint64_t armed_at_ = 0;
};

}  // namespace quanta::arbiter
