// epoll loop and timerfd wrapper for the arbiter. Handlers are looked up again for every
// event so a handler may remove fds (its own included) safely.
#include "arbiter/loop/event_loop.h"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"

namespace quanta::arbiter {

void throw_errno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

EventLoop::EventLoop() : epoll_(epoll_create1(EPOLL_CLOEXEC)) {
  if (!epoll_) throw_errno("epoll_create1");
}

void EventLoop::add(int fd, Handler handler, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno("epoll_ctl(ADD)");
  handlers_[fd] = std::make_shared<Handler>(std::move(handler));
}

void EventLoop::modify(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) throw_errno("epoll_ctl(MOD)");
}

void EventLoop::remove(int fd) {
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(fd);
}

// One failing handler (a region that vanished, a descriptor limit) must not take the
// daemon and every tenant's gating down with it: log it and serve on.
template <typename F>
void EventLoop::guarded(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    spdlog::error("event handler failed: {}", e.what());
  }
}

// Waits for events until `deadline` (0: for at most a second, as without one). The kernel
// may end the wait up to the thread's timer slack late (50 us by default): small beside a
// quantum, and a tighter slack showed no gain in handoff latency.
int EventLoop::wait(epoll_event* events, int capacity, uint64_t deadline) {
  constexpr uint64_t kIdleWaitNs = 1000000000ull;
  uint64_t remaining = kIdleWaitNs;
  if (deadline != 0) {
    const uint64_t now = common::monotonic_ns();
    remaining = deadline > now ? std::min(deadline - now, kIdleWaitNs) : 0;
  }
  if (precise_wait_) {
#ifdef SYS_epoll_pwait2
    // The system call itself, so the binary does not need glibc 2.35's wrapper.
    const timespec timeout{static_cast<time_t>(remaining / 1000000000ull),
                           static_cast<long>(remaining % 1000000000ull)};
    const int n = static_cast<int>(
        syscall(SYS_epoll_pwait2, epoll_.get(), events, capacity, &timeout, nullptr, 0));
    if (n >= 0 || errno != ENOSYS) return n;
#endif
    precise_wait_ = false;
    spdlog::info("epoll_pwait2 unavailable: deadlines are waited for in whole milliseconds");
  }
  // Rounded up: a wait that ends early would only wait again.
  return epoll_wait(epoll_.get(), events, capacity, static_cast<int>((remaining + 999999) / 1000000));
}

void EventLoop::run() {
  constexpr int kBatch = 64;
  epoll_event events[kBatch];
  while (!stopping_) {
    const int n = wait(events, kBatch, next_deadline_ ? next_deadline_() : 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("epoll_wait");
    }
    for (int i = 0; i < n && !stopping_; ++i) {
      auto it = handlers_.find(events[i].data.fd);
      if (it == handlers_.end()) continue;
      std::shared_ptr<Handler> h = it->second;  // survives removal inside the handler
      guarded([&] { (*h)(events[i].events); });
    }
    if (after_events_ && !stopping_) guarded(after_events_);
  }
}

Timer::Timer() : fd_(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {
  if (!fd_) throw_errno("timerfd_create");
}

void Timer::arm_at(uint64_t monotonic_ns) {
  if (monotonic_ns == armed_at_) return;
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(monotonic_ns / 1000000000ull);
  spec.it_value.tv_nsec = static_cast<long>(monotonic_ns % 1000000000ull);
  if (timerfd_settime(fd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0)
    throw_errno("timerfd_settime");
  armed_at_ = monotonic_ns;
}

void Timer::acknowledge() {
  uint64_t expirations = 0;
  ssize_t r = ::read(fd_.get(), &expirations, sizeof(expirations));
  (void)r;
  armed_at_ = 0;
}

}  // namespace quanta::arbiter
