// The link thread, one per linked process: releases on revoke (wait until no launcher is
// inside, drain, publish the release), clears the queued-work estimate of an idle holder,
// notices a lapsed lease or a lost connection and reconnects after an arbiter restart.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/sdt.h>
#include <sys/socket.h>

#include <cerrno>

#include "common/futex.h"
#include "common/wire.h"
#include "shim/link_state.h"
#include "shim/log.h"
#include "shim/spin.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

namespace quanta::shim {

namespace {

// A revoke: wait until no launcher of this process is inside the gate (later ones see the
// even turn and block), drain, then publish the release and wake the arbiter.
void release(Binding* binding, const Route* route, uint32_t turn) {
  launcher_barrier();
  for (uint32_t spins = 0; anyone_inside(binding); ++spins) {
    if (spins < 64) {
      cpu_relax();
    } else if (spins < 1024) {
      sched_yield();
    } else {
      timespec pause{0, 20000};
      nanosleep(&pause, nullptr);
    }
  }
  drain_contexts(binding);
  route->channel->released_turn.store(turn, std::memory_order_release);
  ring_doorbell();
  DTRACE_PROBE2(quanta, release, route->gpu_index, route->slot_index);
  binding->handled_turn = turn;
  binding->handled_valid = true;
}

void check_lease(Binding* binding, const Route* route, uint64_t now) {
  const bool stale = lease_stale(route->control, now);
  const uint32_t was = binding->lapsed.load(std::memory_order_relaxed);
  if (stale && !was) {
    binding->lapsed.store(1, std::memory_order_relaxed);
    if (!binding->lapse_logged.exchange(1, std::memory_order_relaxed)) {
      QUANTA_LOG_WARN(
          "the arbiter's lease on %s lapsed: launches run ungated until it is back (memory caps "
          "stay)",
          binding->uuid);
    }
  } else if (!stale && was) {
    binding->lapsed.store(0, std::memory_order_relaxed);
    binding->lapse_logged.store(0, std::memory_order_relaxed);
    QUANTA_LOG_INFO("the arbiter's lease on %s is back: gating resumed", binding->uuid);
  }
}

// Looks at the socket without taking a message: end of stream means the arbiter is gone.
// Anything unexpected that arrived on it is read and discarded with its descriptors.
void check_socket() {
  if (!g_process.connected.load(std::memory_order_acquire)) return;
  if (!g_process.socket_lock.try_lock()) return;  // a request is in flight: it will notice
  const int fd = g_process.socket_fd.load(std::memory_order_acquire);
  char probe;
  const ssize_t peeked = recv(fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  if (peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    g_process.connected.store(0, std::memory_order_release);
    QUANTA_LOG_WARN(
        "lost the arbiter connection: memory caps stay, gating lapses with the lease; "
        "reconnecting");
  } else if (peeked > 0) {
    ArbiterReply stray;
    int fds[4];
    int count = 0;
    wire_receive(fd, &stray, sizeof stray, fds, 4, &count);
    close_all(fds, count);
  }
  g_process.socket_lock.unlock();
}

struct WaitEntry {  // struct futex_waitv, spelled out for older kernel headers
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kFutex32 = 2;
constexpr uint32_t kFutexPrivate = 128;

// Sleeps until a watched turn word changes, the kick word changes, or the slice ends.
void wait_for_change(WaitEntry* entries, int count, uint64_t timeout_ns, bool* waitv_missing) {
  if (!*waitv_missing) {
    timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    const uint64_t end = static_cast<uint64_t>(deadline.tv_sec) * kNsPerSec +
                         static_cast<uint64_t>(deadline.tv_nsec) + timeout_ns;
    deadline.tv_sec = static_cast<time_t>(end / kNsPerSec);
    deadline.tv_nsec = static_cast<long>(end % kNsPerSec);
    const long rc = syscall(SYS_futex_waitv, entries, count, 0, &deadline, CLOCK_MONOTONIC);
    if (rc >= 0 || errno != ENOSYS) return;
    *waitv_missing = true;
    QUANTA_LOG_INFO(
        "futex_waitv unavailable (Linux < 5.16): the link thread polls revokes every millisecond");
  }
  // Older kernels: wait on the first turn word briefly, poll the rest.
  if (count > 1) {
    common::futex_wait(reinterpret_cast<const std::atomic<uint32_t>*>(entries[1].uaddr),
                       static_cast<uint32_t>(entries[1].val), kNsPerMs);
  } else {
    timespec pause{0, static_cast<long>(kNsPerMs)};
    nanosleep(&pause, nullptr);
  }
}

void* link_thread_main(void*) {
  t_in_link = true;
  prctl(PR_SET_NAME, "quanta-link", 0, 0, 0);
  timespec resolution;
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &resolution) == 0)
    g_coarse_tick_ns = static_cast<uint64_t>(resolution.tv_sec) * kNsPerSec +
                       static_cast<uint64_t>(resolution.tv_nsec);
  bool waitv_missing = false;
  uint64_t next_reconnect = 0;
  WaitEntry entries[1 + kMaxGpus];
  for (;;) {
    int count = 0;
    entries[count++] =
        WaitEntry{g_process.kick.load(std::memory_order_acquire),
                  reinterpret_cast<uint64_t>(&g_process.kick), kFutex32 | kFutexPrivate, 0};
    for (Binding& binding : g_bindings) {
      const Route* route = binding.route.load(std::memory_order_acquire);
      if (!route || binding.state.load(std::memory_order_acquire) != kReady) continue;
      const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
      if (!(turn & 1u) && !(binding.handled_valid && binding.handled_turn == turn)) {
        release(&binding, route, turn);
      }
      entries[count++] = WaitEntry{route->slot->turn.load(std::memory_order_acquire),
                                   reinterpret_cast<uint64_t>(&route->slot->turn), kFutex32, 0};
    }
    // While this process holds a GPU others wait for, look again when its queued-work
    // estimate would expire, so an idle holder is released promptly.
    uint64_t timeout = kLinkWaitSliceNs;
    uint64_t now = monotonic_ns();
    for (Binding& binding : g_bindings) {
      const Route* route = binding.route.load(std::memory_order_acquire);
      if (!route) continue;
      const uint64_t again = expire_inflight(&binding, route, now);
      if (again != 0 && again < timeout) timeout = again;
    }
    wait_for_change(entries, count, timeout, &waitv_missing);

    now = monotonic_ns();
    for (Binding& binding : g_bindings) {
      const Route* route = binding.route.load(std::memory_order_acquire);
      if (!route) continue;
      check_lease(&binding, route, now);
      expire_inflight(&binding, route, now);
    }
    check_socket();
    if (!g_process.connected.load(std::memory_order_acquire) && now >= next_reconnect) {
      bool refused = false;
      if (!reconnect(&refused))
        next_reconnect = now + (refused ? kRefusedRetryNs : kReconnectEveryNs);
    }
  }
  return nullptr;
}

}  // namespace

bool start_link_thread() {
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);  // signals stay with the application's threads
  pthread_t thread;
  const int rc = pthread_create(&thread, nullptr, &link_thread_main, nullptr);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (rc != 0) return false;
  pthread_detach(thread);
  return true;
}

}  // namespace quanta::shim
