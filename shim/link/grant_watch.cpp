// The device thread's watch over a grant made while others wait: if the process launches
// nothing under it for idle_release, the thread rings the doorbell once, so the arbiter need
// not wake at every switch to look at the fresh holder (kAttachReportsUnusedGrant).
#include "shim/link/link_state.h"

namespace quanta::shim {

// The launcher the grant wakes normally launches at once. Nothing comes when the want was
// presumed from a busy release or the launcher gave up, and the GPU would idle under the
// grant until the holder's quantum ends. The arbiter judges idleness from its own records at
// the ring. A launch under the grant shows as a moved launch stamp or queued work; one that
// came before this thread first saw the turn is already in the stamp and reads as none,
// which costs the arbiter one pass (it finds the holder busy), never a wrong decision.
uint64_t ring_when_grant_unused(Binding* binding, const Route* route, uint64_t now) {
  GrantWatch& watch = binding->grant_watch;
  const uint32_t turn = route->slot->turn.load(std::memory_order_acquire);
  const uint64_t idle_release =
      route->control->header.idle_release_ns.load(std::memory_order_relaxed);
  if (!(turn & 1u) || idle_release == 0 ||
      binding->ended_turn.load(std::memory_order_relaxed) == turn) {  // released ahead
    watch.turn = 0;
    return 0;
  }
  const uint64_t stamp = route->channel->last_launch_ns.load(std::memory_order_relaxed);
  if (watch.turn != turn) {
    watch.turn = turn;
    watch.settled = false;
    watch.seen_ns = now;
    watch.launch_stamp = stamp;
  }
  if (watch.settled) return 0;
  if (stamp != watch.launch_stamp ||
      route->channel->inflight_ns.load(std::memory_order_relaxed) != 0 ||
      binding->work.outstanding() != 0) {
    watch.settled = true;  // used: when its work runs out, ring_when_quiet rings
    return 0;
  }
  const uint64_t due = watch.seen_ns + idle_release;
  if (now < due) return due - now;
  // Nobody waits now: nothing to ring about. A waiter that comes later finds the holder idle
  // by the arbiter's own clock at its arrival's pass.
  if (route->control->header.waiters.load(std::memory_order_relaxed) == 0) return 0;
  watch.settled = true;
  ring_doorbell();
  return 0;
}

}  // namespace quanta::shim
