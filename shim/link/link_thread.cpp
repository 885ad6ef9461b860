// The link's threads. One device thread per attached GPU releases on revoke (wait until no
// launcher is inside, drain, publish the release) and keeps the queued-work estimate, so a
// long drain on one GPU never delays the release of another. The link thread, one per linked
// process, starts them, notices a lapsed lease or a lost connection and reconnects after an
// arbiter restart.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/sdt.h>
#include <sys/socket.h>

#include <cerrno>

#include "common/futex.h"
#include "common/wire.h"
#include "shim/base/log.h"
#include "shim/base/spin.h"
#include "shim/link/link_state.h"

namespace quanta::shim {

namespace {

// A revoke: wait until no launcher of this process is inside the gate (later ones see the
// even turn and block), drain, then publish the release of `turn` (the even turn the revoke
// made, or the one it will make when the holder ends its own turn) and wake the arbiter.
void release(Binding* binding, const Route* route, uint32_t turn) {
  DTRACE_PROBE2(quanta, drain_begin, route->gpu_index, route->slot_index);
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
  // Its queued work is done: it still wants the GPU only if a launcher waits at the gate
  // (that launcher set want, and nothing cleared it since), and the arbiter reads this
  // with the release, so such a tenant goes straight back to waiting.
  // A launcher that arrives meanwhile counts itself before it sets want, so checking again
  // after the clear means want is never left cleared under a waiting launcher.
  if (binding->gate_waiting.load(std::memory_order_seq_cst) == 0) {
    route->channel->want.store(0, std::memory_order_seq_cst);
    if (binding->gate_waiting.load(std::memory_order_seq_cst) != 0)
      route->channel->want.store(1, std::memory_order_seq_cst);
  }
  // Before the store, so the grant it allows always follows it; with this shim's own clock.
  DTRACE_PROBE3(quanta, release, route->gpu_index, route->slot_index, monotonic_ns());
  route->channel->released_turn.store(turn, std::memory_order_release);
  ring_doorbell();
  binding->handled_turn = turn;
  binding->handled_route = route;
  binding->handled_valid.store(true, std::memory_order_relaxed);
}

// The holder's own end of its quantum (kAttachEndsOwnQuantum): once the end the arbiter
// published passes with others still waiting, the odd turn counts as revoked for this
// process's launchers, and the release of the next turn is published ahead of the revoke,
// which then needs no wake-up of this thread. Returns how long until the end (0: nothing
// to wait for).
uint64_t end_own_turn(Binding* binding, const Route* route, uint32_t turn, uint64_t now) {
  if (!(turn & 1u) || binding->ended_turn.load(std::memory_order_relaxed) == turn) return 0;
  const uint64_t end = route->slot->end_at_ns.load(std::memory_order_acquire);
  if (end == 0) return 0;
  if (now < end) return end - now;
  if (route->control->header.waiters.load(std::memory_order_relaxed) == 0) return 0;
  // The turn the end was published for: a grant or revoke clears the end before moving it.
  if (route->slot->turn.load(std::memory_order_seq_cst) != turn) return 0;
  binding->ended_turn.store(turn, std::memory_order_seq_cst);
  binding->tracking.store(1, std::memory_order_seq_cst);  // the short gate goes to enter()
  release(binding, route, turn + 1);
  return 0;
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
  if (!socket_still_ours()) {
    g_process.socket_lock.unlock();
    return;
  }
  const int fd = g_process.socket.fd.load(std::memory_order_acquire);
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

// One GPU's releases and queued-work estimate, for as long as the process lives.
void* device_thread_main(void* argument) {
  t_in_link = true;
  Binding* binding = static_cast<Binding*>(argument);
  char name[16] = "quanta-gpu";
  const uint32_t index = binding_index(binding);
  if (index < 100) {
    name[10] = static_cast<char>('0' + index / 10 % 10);
    name[index < 10 ? 10 : 11] = static_cast<char>('0' + index % 10);
  }
  prctl(PR_SET_NAME, name, 0, 0, 0);
  for (;;) {
    const Route* route = binding->route.load(std::memory_order_acquire);
    if (!route || binding->state.load(std::memory_order_acquire) != kReady) {
      timespec pause{0, static_cast<long>(kLinkWaitSliceNs)};  // detached: re-attached later
      nanosleep(&pause, nullptr);
      continue;
    }
    const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
    const bool handled = binding->handled_valid.load(std::memory_order_relaxed) &&
                         binding->handled_route == route && binding->handled_turn == turn;
    if (!(turn & 1u) && !handled) release(binding, route, turn);
    // While work is queued, look again when the estimate needs refreshing, so an idle holder
    // is released promptly and a busy one never looks idle.
    uint64_t timeout = kLinkWaitSliceNs;
    const uint64_t now = monotonic_ns();
    const uint64_t until_end = end_own_turn(binding, route, turn, now);
    if (until_end != 0 && until_end < timeout) timeout = until_end;
    const uint64_t again = refresh_inflight(binding, route, now);
    if (again != 0 && again < timeout) timeout = again;
    ring_when_quiet(binding, route);
    const uint64_t unused = ring_when_grant_unused(binding, route, now);
    if (unused != 0 && unused < timeout) timeout = unused;
    common::futex_wait(&route->slot->turn, turn, timeout);
  }
  return nullptr;
}

bool start_thread(void* (*main)(void*), void* argument) {
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);  // signals stay with the application's threads
  pthread_t thread;
  const int rc = pthread_create(&thread, nullptr, main, argument);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (rc != 0) return false;
  pthread_detach(thread);
  return true;
}

void start_device_threads() {
  for (Binding& binding : g_bindings) {
    if (binding.device_thread.load(std::memory_order_relaxed) != 0) continue;
    if (!binding.route.load(std::memory_order_acquire) ||
        binding.state.load(std::memory_order_acquire) != kReady)
      continue;
    start_device_thread(&binding);
  }
}

void* link_thread_main(void*) {
  t_in_link = true;
  prctl(PR_SET_NAME, "quanta-link", 0, 0, 0);
  timespec resolution;
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &resolution) == 0)
    g_coarse_tick_ns = static_cast<uint64_t>(resolution.tv_sec) * kNsPerSec +
                       static_cast<uint64_t>(resolution.tv_nsec);
  uint64_t next_reconnect = 0;
  uint64_t backoff = kReconnectFirstNs;
  for (;;) {
    const uint32_t kick = g_process.kick.load(std::memory_order_acquire);
    start_device_threads();
    private_wait(&g_process.kick, kick, kLinkWaitSliceNs);

    const uint64_t now = monotonic_ns();
    for (Binding& binding : g_bindings) {
      const Route* route = binding.route.load(std::memory_order_acquire);
      if (!route) continue;
      check_lease(&binding, route, now);
    }
    check_socket();
    // Not placed yet, or the arbiter went away: try again, backing off to kReconnectMaxNs
    // while it is unreachable (a connect to a missing socket costs next to nothing).
    if (!g_process.connected.load(std::memory_order_acquire) &&
        !g_process.gave_up.load(std::memory_order_acquire) && now >= next_reconnect) {
      switch (reconnect()) {
        case Rejoin::kJoined:
          backoff = kReconnectFirstNs;
          break;
        case Rejoin::kUnreachable:
          next_reconnect = now + backoff;
          backoff = backoff * 2 > kReconnectMaxNs ? kReconnectMaxNs : backoff * 2;
          break;
        case Rejoin::kRefusedOpen:
        case Rejoin::kRefusedDeny:
          next_reconnect = now + kRefusedRetryNs;
          break;
      }
    }
  }
  return nullptr;
}

}  // namespace

bool start_link_thread() {
  return start_thread(&link_thread_main, nullptr);
}

void start_device_thread(Binding* binding) {
  uint32_t expected = 0;
  if (!binding->device_thread.compare_exchange_strong(expected, 1, std::memory_order_acq_rel))
    return;
  if (!start_thread(&device_thread_main, binding)) {
    binding->device_thread.store(0, std::memory_order_release);
    QUANTA_LOG_WARN("cannot start the device thread for %s: the link thread retries",
                    binding->uuid);
  }
}

// Only the forking thread lives on in the child: no device thread runs there.
void link_threads_reset_in_child() {
  for (Binding& binding : g_bindings) {
    binding.device_thread.store(0);
    binding.gate_waiting.store(0);
    binding.ended_turn.store(0);
    binding.handled_route = nullptr;
  }
}

}  // namespace quanta::shim
