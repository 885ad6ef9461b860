// The arbiter link's process-wide state, shared by its rooms (session.cpp, gate.cpp,
// activity.cpp, contexts.cpp, link_thread.cpp, fork.cpp): fixed tables only, a binding per
// CUdevice ordinal, routes that are never freed, and the few functions one room calls in
// another. Internal to libquanta.so; wrappers use link.h.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "common/clock.h"
#include "common/shm_layout.h"
#include "shim/link.h"
#include "shim/link/arbiter_wire.h"

namespace quanta::shim {

using common::ControlRegion;
using common::ControlSlot;
using common::GateChannel;
using common::GateLimits;
using common::kMaxGpus;
using common::kNsPerMs;
using common::kNsPerSec;
using common::monotonic_ns;
using common::PodRegion;

constexpr uint64_t kGateWaitSliceNs =
    100 * kNsPerMs;  // a blocked launcher re-checks the lease this often
constexpr uint64_t kLinkWaitSliceNs = 50 * kNsPerMs;  // the link thread's loop period at most
constexpr uint64_t kBusyGapNs = 10 * kNsPerMs;        // launch gaps longer than this are idleness
constexpr uint32_t kBusyRunLaunches = 4;  // short gaps in a row before the estimate counts
constexpr uint64_t kInflightClearSlackNs =
    200 * 1000;                             // lateness allowed before clearing the estimate
constexpr uint32_t kLaunchFlushBatch = 64;  // thread-local launches published at most this late
// A thread that keeps launching within one coarse tick reads the clock at most this many
// launches apart (note_launch).
constexpr uint32_t kMaxUnclockedLaunches = 31;
constexpr uint32_t kMaxGateThreads =
    1024;  // threads with their own gate mark; later ones share a counter
constexpr uint64_t kReconnectFirstNs = 100 * kNsPerMs;  // first retry after the arbiter went away
constexpr uint64_t kReconnectMaxNs = 500 * kNsPerMs;    // retries back off to this, no further
constexpr uint64_t kRefusedRetryNs =
    1000 * kNsPerMs;  // after a refusal (deny, or open once placed)
constexpr uint64_t kDefaultLeaseNs = 1000 * kNsPerMs;  // when a region leaves lease_ns at 0
constexpr uint64_t kFirstUseWaitNs =
    5 * kNsPerSec;  // how long a thread waits for another's connect
constexpr int kMaxContexts = 512;
constexpr int kMaxRoutes = kMaxGpus * 8;

#define QUANTA_TLS __attribute__((tls_model("initial-exec"))) thread_local

// Process-private futex helpers (the link's own words, never shared with the arbiter).
inline void private_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / kNsPerSec),
              static_cast<long>(timeout_ns % kNsPerSec)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr,
          0);
}

inline void private_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
}

// A small lock for the socket (no pthread mutex: its symbol versions moved in glibc 2.34
// and a lock this simple needs none of its features).
class SocketLock {
 public:
  void lock() {
    uint32_t expected = 0;
    if (word_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
    while (word_.exchange(2, std::memory_order_acquire) != 0) private_wait(&word_, 2, kNsPerSec);
  }
  bool try_lock() {
    uint32_t expected = 0;
    return word_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }
  void unlock() {
    if (word_.exchange(0, std::memory_order_release) == 2) private_wake_all(&word_);
  }
  void reset() { word_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<uint32_t> word_{0};  // 0 free, 1 held, 2 held with waiters
};

// kLinked: the link thread runs and the process is, or is trying to become, the arbiter's
// (Process::joined tells which). kUnplaced: the arbiter refused it for good (run open) or
// the link cannot run; it stays ungated and uncapped.
enum LinkState : uint32_t { kUntouched = 0, kConnecting = 1, kLinked = 2, kUnplaced = 3 };

// Where one device's gate and ledger live for the current arbiter connection. Immutable
// once published, so a reader sees the ledger words and their epoch together.
struct Route {
  const ControlRegion* control;
  const ControlSlot* slot;
  GateChannel* channel;
  const GateLimits* limits;  // the arbiter's quantum and in-flight limit for it (pod region)
  PodRegion* pod;
  uint32_t gpu_index;
  uint32_t slot_index;
  uint32_t owner;  // ControlSlot::owner while the slot is this process's
  uint32_t ledger_epoch;  // MemoryAccount::epoch of this route's ledger words
  uint32_t entry_made;    // Process::entries_made when the route was made
};

enum BindingState : uint32_t {
  kEmpty = 0,      // never used
  kAttaching = 1,  // one thread is attaching it
  kReady = 2,      // has a route
  kPending = 3,    // known, but the arbiter was unreachable: the link thread attaches it later
  kFailed = 4,     // the arbiter or the driver refused: ungated for good
};

// Device work this process queued on one GPU and has not seen finish, tracked while it matters
// (others wait for the GPU, or the in-flight limit binds): each tracked launch records an
// event from a fixed ring on its own stream, and whoever looks (the device thread, a launcher
// held at the limit) retires events in order as they complete. Lock-free: launchers claim
// entries with a compare-and-swap on `head`, retirers advance `tail` the same way.
constexpr uint32_t kTrackedLaunches = 64;
struct TrackedLaunch {
  std::atomic<uint64_t> sequence{0};  // head value + 1 once recorded (0: being recorded)
  CUevent event = nullptr;
  CUcontext context = nullptr;  // the event's context (recreated when it changes)
  uint64_t launch_ns = 0;
};
struct WorkTracker {
  std::atomic<uint64_t> head{0};            // launches claimed
  std::atomic<uint64_t> tail{0};            // launches seen complete
  std::atomic<uint32_t> retired{0};         // bumped at each retire: a held launcher's futex word
  std::atomic<uint32_t> held{0};            // launchers waiting on `retired`
  std::atomic<uint64_t> kernel_ns{0};       // moving average of one launch's device time
  std::atomic<uint64_t> last_retire_ns{0};  // when the queue was last seen to shrink
  std::atomic<uint64_t> skipped{0};         // launches not tracked (ring full)
  TrackedLaunch ring[kTrackedLaunches];
  uint64_t outstanding() const {
    const uint64_t t = tail.load(std::memory_order_acquire);
    const uint64_t h = head.load(std::memory_order_acquire);
    return h > t ? h - t : 0;
  }
};

// The device thread's watch over a grant made while others wait (grant_watch.cpp): the held
// turn, when this thread first saw it, the launch stamp then, and whether that turn is
// settled (a launch came, or its lack was rung about).
struct GrantWatch {
  uint32_t turn = 0;
  bool settled = false;
  uint64_t seen_ns = 0;
  uint64_t launch_stamp = 0;
};

struct Binding {
  std::atomic<uint32_t> state{kEmpty};
  std::atomic<Route*> route{nullptr};
  // Launchers past the gate that have no thread mark of their own (see gate.cpp).
  std::atomic<uint32_t> launchers_inside{0};
  std::atomic<uint32_t> lapsed{0};  // the arbiter's heartbeat went stale
  std::atomic<uint32_t> lapse_logged{0};
  // Moving average of the gaps between this process's launches while it is busy: the
  // basis of the queued-work estimate published in GateChannel::inflight_ns.
  std::atomic<uint64_t> gap_average_ns{0};
  std::atomic<uint32_t> busy_run{0};  // consecutive launches at most kBusyGapNs apart
  // Activity stamps: the CLOCK_MONOTONIC_COARSE tick of the last precise stamp, and the
  // channel's launch count then (the gap average divides by launches since).
  std::atomic<uint64_t> stamped_tick{0};
  std::atomic<uint64_t> stamped_launches{0};
  // Launchers blocked at this gate now (gate.cpp): while any is, the process wants the GPU.
  std::atomic<uint32_t> gate_waiting{0};
  // 1 while launches record completion events (others wait, or the in-flight limit binds).
  std::atomic<uint32_t> tracking{0};
  WorkTracker work;
  char uuid[common::kUuidLen] = {};
  // The device thread (link_thread.cpp): one per attached GPU, so a long drain on one GPU
  // never delays a release on another.
  std::atomic<uint32_t> device_thread{0};  // 0 none, 1 started
  uint32_t handled_turn = 0;               // device thread only
  // The odd turn the device thread ended itself at its quantum's end (kAttachEndsOwnQuantum):
  // launchers treat it as revoked. Written before the launcher barrier, like a revoke's turn.
  std::atomic<uint32_t> ended_turn{0};
  const Route* handled_route = nullptr;    // device thread only
  // Device thread only (activity.cpp): the turn in which it last cleared the queued-work
  // estimate, and the held turn whose quiet it rang about (0 once work is queued again).
  uint32_t quiet_turn = 0;
  uint32_t quiet_rung_turn = 0;
  GrantWatch grant_watch;                  // device thread only
  std::atomic<bool> handled_valid{false};  // cleared by a re-attach
};

// A control region mapped for one of the arbiter's GPU indices.
struct ControlMapping {
  const ControlRegion* region = nullptr;
  FileIdentity file;
};

// A descriptor the link owns, moved above the numbers applications use and checked before
// every use: an application that closed it and got the number back for a file of its own
// must never see the shim write to, close or replace its file.
struct OwnedFd {
  std::atomic<int> fd{-1};
  std::atomic<uint64_t> device{0};
  std::atomic<uint64_t> inode{0};
};

struct Process {
  std::atomic<uint32_t> state{kUntouched};
  std::atomic<uint32_t> epoch{1};  // bumped when cached lookups must be redone
  OwnedFd socket;                  // written under socket_lock
  OwnedFd doorbell;
  std::atomic<uint32_t> connected{0};
  std::atomic<uint32_t> joined{0};   // 1 once a Welcome was adopted (the pod region is mapped)
  std::atomic<uint32_t> gave_up{0};  // 1: refused before it ever joined; it will not join
  std::atomic<uint32_t> denied{0};   // link_refuses_cuda()
  // The arbiter's settings from the last Welcome (valid once joined).
  std::atomic<uint32_t> welcome_flags{0};
  std::atomic<uint32_t> welcome_count_managed{1};
  std::atomic<uint64_t> welcome_context_overhead{0};
  // Welcomes that gave this process a fresh, empty entry (kWelcomeFreshEntry). A route made
  // before the last of them points at words that no longer hold this process's charges.
  std::atomic<uint32_t> entries_made{0};
  std::atomic<PodRegion*> pod{nullptr};
  std::atomic<uint32_t> proc_index{0};
  std::atomic<uint32_t> pid{0};
  std::atomic<uint32_t> kick{0};  // bumped to wake the link thread (a new binding is ready)
  FileIdentity pod_file;
  uint64_t generation = 0;
  SocketLock socket_lock;
  ControlMapping controls[kMaxGpus];  // under socket_lock
  bool refused_logged = false;
  // The line for an arbiter that closes the connection at each Hello (one of an older
  // release, after a rollback) was logged: once until the process joins again.
  bool unanswered_logged = false;
  bool deny_logged = false;
  bool stolen_logged = false;
};

extern Process g_process;
extern Binding g_bindings[kMaxGpus];

// Per thread: the re-entrancy guard (a driver call made by the link itself must never come
// back into the gate), and per GPU the launch counts not yet published and note_launch's
// clock reads: the tick it read last, the launches its last read let it count unclocked,
// and how many of those are left (activity.cpp).
extern QUANTA_TLS constinit bool t_in_link;
extern QUANTA_TLS constinit uint32_t t_pending_launches[kMaxGpus];
extern QUANTA_TLS constinit uint64_t t_clocked_tick[kMaxGpus];
extern QUANTA_TLS constinit uint32_t t_unclocked_skip[kMaxGpus];
extern QUANTA_TLS constinit uint32_t t_unclocked_left[kMaxGpus];

struct InLink {
  bool previous;
  InLink() : previous(t_in_link) { t_in_link = true; }
  ~InLink() { t_in_link = previous; }
};

inline uint32_t binding_index(const Binding* binding) {
  return static_cast<uint32_t>(binding - g_bindings);
}

inline bool lease_stale(const ControlRegion* control, uint64_t now) {
  const uint64_t heartbeat = control->header.heartbeat_ns.load(std::memory_order_acquire);
  uint64_t lease = control->header.lease_ns.load(std::memory_order_relaxed);
  if (lease == 0) lease = kDefaultLeaseNs;
  return now > heartbeat && now - heartbeat > lease;
}

// Whether the route's slot is still this process's (the arbiter frees a slot, and may give
// it to another process, when it takes this one for dead).
inline bool owns_slot(const Route* route) {
  return route->slot->owner.load(std::memory_order_relaxed) == route->owner;
}

inline uint64_t coarse_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * kNsPerSec + static_cast<uint64_t>(ts.tv_nsec);
}

// --- session.cpp: the arbiter conversation ------------------------------------------
// True when this process is linked to an arbiter (joined, or still trying to join).
bool ensure_linked();
// The binding of a device ordinal, attached on first use; nullptr out of range.
Binding* ensure_binding(CUdevice device);
// While disconnected (never joined, or the arbiter went away): hello again and attach
// every known device.
enum class Rejoin { kJoined, kUnreachable, kRefusedOpen, kRefusedDeny };
Rejoin reconnect();
void ring_doorbell();
// The link thread's socket watch: false (and the connection marked lost) when the socket
// descriptor is no longer the one the link opened.
bool socket_still_ours();
void session_reset_in_child();

// --- gate.cpp: thread marks and the revoke barrier ----------------------------------
// Link thread, after it saw an even turn: true while a launcher that read the odd turn
// before it may still be submitting.
bool anyone_inside(const Binding* binding);
// The heavy half of the asymmetric barrier (see gate.cpp).
void launcher_barrier();
void register_launcher_barrier();
void gate_reset_in_child();

// --- activity.cpp: launch statistics and the queued-work estimate --------------------
extern uint64_t g_coarse_tick_ns;  // CLOCK_MONOTONIC_COARSE resolution (link thread)
void publish_pending_launches(uint32_t index);
void stamp_launch(Binding* binding, const Route* route, uint32_t index, uint64_t tick);
void activity_reset_in_child();

// In-flight limit (the arbiter's GateLimits::inflight_limit_ns, below the quantum while an
// interactive pod is active on this GPU for a non-interactive tenant): 0 when it does not bind.
inline uint64_t binding_limit(const Route* route) {
  const uint64_t limit = route->limits->inflight_limit_ns.load(std::memory_order_relaxed);
  const uint64_t quantum = route->limits->quantum_ns.load(std::memory_order_relaxed);
  return limit != 0 && limit < quantum ? limit : 0;
}
// Launchers: before the gate, waits (not marked inside, so a revoke is never held up) until
// this process's queued work on the GPU is below `limit`; at most one launch beyond it.
void wait_below_limit(Binding* binding, uint64_t limit);
// After a launch that passed the gate: records its completion event when tracking.
void track_launch(Binding* binding, CUcontext context, CUstream stream);
// Device thread: retires completed launches, publishes GateChannel::inflight_ns from them and
// clears the estimate once the process went idle. Returns how soon it wants to look again
// (0: nothing pending).
uint64_t refresh_inflight(Binding* binding, const Route* route, uint64_t now);
// Device thread, after refresh_inflight: while this process holds the GPU and others wait,
// rings the doorbell once when its queued work runs out (the arbiter looks at such a holder
// for idleness only then; AttachMessage's kAttachReportsQuiet).
void ring_when_quiet(Binding* binding, const Route* route);

// --- grant_watch.cpp: a grant that goes unused ------------------------------------------
// Device thread, at every wake-up: while this process holds a grant made while others wait
// and has launched nothing under it, rings the doorbell once when ControlHeader::
// idle_release_ns has passed since it saw the grant (AttachMessage's
// kAttachReportsUnusedGrant: the arbiter does not wake to look at such a grant itself).
// Returns how soon it wants to look again (0: nothing pending).
uint64_t ring_when_grant_unused(Binding* binding, const Route* route, uint64_t now);
// Whether launches on this binding must record completions now.
inline bool should_track(const Route* route) {
  return route->control->header.waiters.load(std::memory_order_relaxed) != 0 ||
         binding_limit(route) != 0;
}

// Counts a launch that passed the gate; stamps its time only when someone can use it: at
// every launch while others wait, otherwise at the first clock read of each coarse tick.
// A thread that reads the same tick again may skip further reads: 1, then 3, 7, ... up to
// kMaxUnclockedLaunches launches, never more than it made in that tick so far. At a steady
// rate a new tick is therefore stamped within about as long again, and a launch-bound loop
// pays for the clock once every 32 launches. The rest is note_launch_rest (activity.cpp).
void note_launch_rest(Binding* binding, const Route* route, uint32_t index, uint32_t pending);
inline void note_launch(Binding* binding, const Route* route, uint32_t index) {
  const uint32_t pending = ++t_pending_launches[index];
  if (__builtin_expect(route->control->header.waiters.load(std::memory_order_relaxed) == 0 &&
                           t_unclocked_left[index] != 0 && pending < kLaunchFlushBatch,
                       1)) {
    --t_unclocked_left[index];
    return;
  }
  note_launch_rest(binding, route, index, pending);
}
inline void note_launch(Binding* binding, const Route* route) {
  note_launch(binding, route, binding_index(binding));
}

// --- contexts.cpp: which binding a context's launches go through ---------------------
struct LastHit {
  CUcontext context;
  Binding* binding;
  uint32_t epoch;
};
extern QUANTA_TLS constinit LastHit t_last;
Binding* binding_for_context_slow(CUcontext context, uint32_t epoch);
// Synchronises every context of this process on the device of `binding`.
void drain_contexts(Binding* binding);
void contexts_reset_in_child();

// The binding a launch on `context` goes through: a couple of thread-local loads when the
// same thread launches on the same context again. No context: the current one's, which in a
// process that sees one device is that device's without asking the driver.
inline Binding* binding_for_context(CUcontext context) {
  if (context == nullptr) {
    if (Binding* sole = g_sole_binding.load(std::memory_order_acquire)) return sole;
  }
  const uint32_t epoch = g_process.epoch.load(std::memory_order_acquire);
  if (__builtin_expect(context != nullptr && t_last.context == context && t_last.epoch == epoch, 1))
    return t_last.binding;
  return binding_for_context_slow(context, epoch);
}

// --- link_thread.cpp ------------------------------------------------------------------
bool start_link_thread();
// The device thread of an attached binding, once (the link thread retries failures).
void start_device_thread(Binding* binding);
void link_threads_reset_in_child();

// --- fork.cpp ----------------------------------------------------------------------------
// The child of a fork is a new process to the arbiter: it keeps no link.
void reset_link_in_child();

}  // namespace quanta::shim
