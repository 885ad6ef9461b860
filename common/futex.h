// Process-shared futex calls on words in shared memory. Raw SYS_futex without
// FUTEX_PRIVATE_FLAG: std::atomic::wait is process-private in libstdc++, so a waiter in
// one process would never see a wake from another.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace quanta::common {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Sleeps while *word == expected, at most timeout_ns (0 = no limit). Returns 0 on wake or
// value change, -1 with errno ETIMEDOUT/EINTR/EAGAIN otherwise. Works on read-only mappings.
inline int futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout_ns != 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000ull);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000ull);
    tsp = &ts;
  }
  return static_cast<int>(
      syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected, tsp, nullptr, 0));
}

// Wakes up to `count` waiters on word, in any process that maps it.
inline int futex_wake(std::atomic<uint32_t>* word, int count) {
  return static_cast<int>(
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0));
}

}  // namespace quanta::common
