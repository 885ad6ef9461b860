// One GPU's scheduler: guaranteed minimum shares first, then strict priority classes,
// then weighted fair sharing by virtual time between pods (and between a pod's processes),
// under max-share ceilings; idle, stopped and draining holders. Pure: no I/O, no clock of
// its own; the arbiter feeds it events and applies the actions it returns, so tests drive
// it with a fake clock.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "arbiter/scheduling/share_window.h"
#include "arbiter/scheduling/virtual_clock.h"
#include "common/policy.h"
#include "common/shm_layout.h"
#include "config/node_config.h"

namespace quanta::arbiter {

using SlotId = uint32_t;
using PodId = uint32_t;

// The node's [scheduler] table (config::SchedulerConfig, with its defaults: the quantum and
// its bounds, the revoke timeout, the idle release, drain overlap and quantum slack), and what
// only the scheduler's own tests and figures set.
struct SchedulerOptions : config::SchedulerConfig {
  uint64_t lag_ns = 0;                       // idle credit a waking pod keeps; 0 = one quantum
  uint64_t share_window_ns = 1'000'000'000;  // max-share and min-share window
  uint64_t stats_window_ns = 5'000'000'000;  // achieved-share window for status
};

enum class TenantState { kIdle, kWaiting, kHolding, kRevoking, kPassedOver };
const char* state_name(TenantState s);

struct Action {
  enum class Kind { kGrant, kRevoke, kPassOver };
  Kind kind;
  SlotId slot;
  bool operator==(const Action&) const = default;
};

// What `quantactl status` shows about one tenant.
struct TenantReport {
  SlotId slot;
  PodId pod;
  TenantState state;
  double target_share;    // the tenant's part of what its pod is promised now
  double achieved_share;  // GPU time over the stats window
  uint64_t wait_p99_ns;
  uint64_t quantum_ns;
  uint64_t grants;
  uint64_t pass_overs;
};

class Scheduler {
 public:
  static constexpr uint64_t kScale = VirtualClock::kScale;
  // A stretched quantum covers this many of the tenant's measured drains.
  static constexpr uint64_t kKernelsPerQuantum = 4;

  explicit Scheduler(SchedulerOptions options);

  // --- membership and policy ---------------------------------------------------------
  // Policy of a pod; applies at the next decision (live changes included). `now` (when
  // known) settles what the pod used so far under its old policy.
  void set_pod_policy(PodId pod, const common::Policy& policy, uint64_t now = 0);
  void add_tenant(SlotId slot, PodId pod, uint64_t now);
  // After an arbiter restart: a re-adopted slot whose turn is odd holds the grant.
  bool adopt_holder(SlotId slot, uint64_t now);  // false: another slot already holds
  void remove_tenant(SlotId slot, uint64_t now);
  // The pod index was released (no process left): a later pod under it starts afresh.
  void forget_pod(PodId pod);
  bool has_tenant(SlotId slot) const { return slot < tenants_.size() && tenants_[slot].present; }

  // --- what the tenants said ---------------------------------------------------------
  // GateChannel::want as last read (the shim sets it when a launcher blocks at the gate,
  // keeps it through the grant and clears it with its release unless a launcher waits
  // again). True when it woke the tenant.
  bool set_want(SlotId slot, bool want, uint64_t now);
  // The tenant's shim rings the doorbell when its queued work runs out while it holds the GPU
  // and others wait (kAttachReportsQuiet): while it holds with work queued, decide() does not
  // look at it for idleness, and the ring brings the look. A shim that claims this and never
  // rings keeps the grant to its quantum's end, as a busy holder would.
  void set_reports_quiet(SlotId slot, bool reports_quiet);
  // The tenant's shim also rings when a grant made while others waited goes unused for
  // idle_release (kAttachReportsUnusedGrant): decide() then does not wake idle_release after
  // such a grant to look at it, but no sooner than the holder's next deadline (its quantum's
  // end, say); the ring brings the look sooner. A shim that claims this and never rings keeps
  // an unused grant to that deadline, as a holder launching now and then would.
  void set_reports_unused_grant(SlotId slot, bool reports_unused_grant);
  // The tenant's shim ends its own turn at the quantum's end the arbiter publishes
  // (kAttachEndsOwnQuantum, self_end_ns()): decide() then does not wake at that end but a
  // backstop later (the quantum's slack, at least quantum_min, plus twice its measured
  // drain), and revokes the holder there if its release has not come. A shim that claims
  // this and never ends its turns keeps each grant that much longer, as a slow drain would.
  void set_ends_own_quantum(SlotId slot, bool ends_own_quantum);
  // Hints from the tenant's GateChannel (untrusted: only ever used to shorten its hold).
  void set_activity(SlotId slot, uint64_t last_launch_ns, uint64_t inflight_ns, uint64_t now);
  // The tenant published a release of its current turn (odd: voluntary give-back).
  void released(SlotId slot, uint64_t now);

  // --- the operator ------------------------------------------------------------------
  // Drain (`quantactl drain`): while set, no tenant is granted the GPU and the holder is
  // revoked at once (passed over after revoke_timeout like any holder); waiters keep their
  // place and are served when it is cleared. idle(): nobody holds the GPU or drains work
  // queued under a grant (a holder passed over for not releasing no longer counts).
  void set_draining(bool on) { closed_ = on; }
  bool drain_requested() const { return closed_; }
  bool idle() const;

  // --- decisions ---------------------------------------------------------------------
  // Runs one decision: returns the grants, revokes and pass-overs to apply, in order. The
  // list is the scheduler's own, valid until the next decide(), so a pass allocates nothing.
  const std::vector<Action>& decide(uint64_t now);
  // When decide() must run again even if no event arrives; 0 = not needed.
  uint64_t next_deadline() const { return next_deadline_; }
  // How late next_deadline() may be served (0 when it is 0). A quantum's end may slip by
  // quantum_slack of the quantum, so the arbiter can end the quanta of several GPUs with
  // one wake-up; every other deadline is due exactly, and this is then next_deadline().
  uint64_t latest_deadline() const;
  // The look decide() schedules, while someone waits, to see whether the holder went idle
  // needs no decision when the holder has worked since: given its latest hints, this moves
  // that look and returns true when the deadline that fell due was that look alone and the
  // holder is still busy. False: something else is due, or the holder is idle now, and
  // decide() must run. (On a contended GPU most deadlines are this look.)
  bool postpone_idle_check(uint64_t last_launch_ns, uint64_t inflight_ns, uint64_t now);

  // When the holder should end its own turn (its quantum's end while a waiter of its rank
  // waits, for a holder that ends its own quantum); 0: nothing to publish.
  uint64_t self_end_ns() const { return self_end_ns_; }

  std::optional<SlotId> holder() const { return holder_; }
  // A holder preempted by an interactive tenant that still drains beside it (drain_overlap).
  std::optional<SlotId> overtaken() const { return overtaken_; }
  TenantState state(SlotId slot) const;
  // The tenant's quantum: the pod's own if it set one, else the node quantum stretched to
  // cover a few of its drains as the arbiter measured them (revoke to release; never the
  // tenant's own estimate), clamped to the node bounds. The stretch stops where a round of
  // every active tenant would outlast the share window.
  uint64_t quantum_for(SlotId slot) const;
  // GPU time the tenant may keep queued: its quantum, or quantum_min for a non-interactive
  // tenant while an interactive one is active, so long queues cannot set its latency.
  uint64_t inflight_limit_for(SlotId slot, uint64_t now) const;
  // inflight_limit_for and quantum_for of every tenant in one walk.
  template <typename F>
  void for_each_limit(uint64_t now, F&& f) const {
    const bool shrink = interactive_recent(now);
    for (SlotId slot : present_) {
      const Tenant& t = tenants_[slot];
      const uint64_t quantum = quantum_of(t);
      const bool interactive = pods_[t.pod].policy.priority == common::Priority::kInteractive;
      f(slot, shrink && !interactive ? options_.quantum_min_ns : quantum, quantum);
    }
  }
  // How long this tenant's releases took after a revoke (0 = not measured yet): the
  // arbiter waits for a release this short by spinning instead of sleeping.
  uint64_t expected_drain_ns(SlotId slot) const;
  uint32_t waiting_count() const { return waiting_; }
  std::vector<TenantReport> report(uint64_t now) const;
  const SchedulerOptions& options() const { return options_; }

 private:
  // Why a holder loses the grant (none: it keeps it), and when to look again.
  enum class Revoke { kNone, kCeiling, kIdle, kOutranked, kQuantumEnd, kClosing };
  struct Verdict {
    Revoke reason = Revoke::kNone;
    bool overlap = false;     // the preemptor starts while this holder drains
    uint64_t recheck_ns = 0;  // 0: nothing to wait for
    // When the holder's hints would call it idle (0: the verdict does not wait on that);
    // kept apart from recheck_ns so that look can move without a decision.
    uint64_t idle_check_ns = 0;
    // The holder's quantum's end, when a waiter of its rank waits for it (0: none); kept
    // apart from recheck_ns because it may be served late. For a holder that ends its own
    // quantum this is the backstop after that end.
    uint64_t quantum_end_ns = 0;
    // That end itself, for a holder that ends its own quantum (0: none).
    uint64_t self_end_ns = 0;
  };
  // The order of claims: a pod owed its minimum first, then the class. Lower is better.
  struct Rank {
    bool unowed;  // false sorts first
    common::Priority priority;
    bool owed() const { return !unowed; }
    auto operator<=>(const Rank&) const = default;
  };

  struct Tenant {
    bool present = false;
    SlotId slot = 0;
    PodId pod = 0;
    TenantState state = TenantState::kIdle;
    bool want = false;
    bool owed_grant = false;                 // granted on its pod's minimum (not in fair order)
    bool revoked_busy = false;               // revoked with work still coming (not for idleness)
    bool reports_quiet = false;              // set_reports_quiet
    bool reports_unused_grant = false;       // set_reports_unused_grant
    bool ends_own_quantum = false;           // set_ends_own_quantum
    bool granted_while_others_wait = false;  // others waited when its grant was made
    uint64_t presumed_until_ns = 0;          // counts as wanting until then, want or not
    uint64_t grant_ns = 0;
    uint64_t quantum_end_ns = 0;
    uint64_t revoke_ns = 0;
    uint64_t passed_over_ns = 0;
    uint64_t wait_since_ns = 0;
    uint64_t last_launch_ns = 0;
    uint64_t inflight_ns = 0;
    uint64_t work_done_ns = 0;  // when its queued work was last seen to end (inflight_ns to 0)
    uint64_t drain_ns = 0;      // moving average of revoke-to-release, measured here
    uint64_t last_active_ns = 0;
    uint64_t arrived_ns = 0;
    uint64_t grants = 0;
    uint64_t pass_overs = 0;
    UsageLog holds;                     // for the achieved share
    std::array<uint64_t, 256> waits{};  // recent wait durations, for the p99
    uint32_t wait_count = 0;
  };
  struct Pod {
    bool present = false;
    common::Policy policy;
    std::vector<SlotId> members;
    uint32_t active_tenants = 0;  // members waiting, holding or revoking
    VirtualClock procs{1, 0};     // its processes' order (unweighted)
    UsageLog usage;               // within the share window
    GuaranteeCredit credit;       // min-share
    GuaranteeCredit pacing;       // max-share, smoothed (the window stays the hard bound)
    bool earning = false;         // credit.settle's flag since the last settle
    uint64_t last_active_ns = 0;
  };

  // Decision steps (decide() reads as the policy; these keep the books).
  void account(uint64_t now);
  void charge_on_gpu(uint64_t from, uint64_t now);
  void settle_overtaken(uint64_t now, std::vector<Action>& out);
  Verdict judge_holder(uint64_t now) const;
  void revoke_holder(const Verdict& v, uint64_t now, std::vector<Action>& out);
  std::optional<SlotId> pick(uint64_t now, std::optional<SlotId> excluding) const;
  void grant(SlotId slot, uint64_t now);
  uint64_t next_wakeup(uint64_t now, const Verdict& v) const;

  // Bookkeeping.
  Rank rank_of(const Tenant& t, uint64_t now) const;
  bool owed(const Pod& pod) const;
  uint64_t owed_threshold(const Pod& pod) const;
  uint64_t pacing_threshold(const Pod& pod) const;
  bool throttled(const Pod& pod, uint64_t now) const;
  uint64_t budget_ns(const Pod& pod) const;
  uint64_t eligible_at(const Pod& pod, uint64_t now) const;
  bool eligible(const Tenant& t, uint64_t now) const;
  bool on_gpu(const Tenant& t) const;

  static uint64_t last_work_ns(const Tenant& h);
  bool idle_holder(const Tenant& h, uint64_t now) const;
  bool looks_for_idleness(const Tenant& h) const;
  bool rings_if_unused(const Tenant& h) const;
  uint64_t idle_look_ns(const Tenant& h, uint64_t now, uint64_t recheck_ns) const;
  uint64_t quantum_of(const Tenant& t) const;
  uint64_t slack_of(const Tenant& t) const;     // how late its quantum may end
  uint64_t backstop_of(const Tenant& t) const;  // how long it has to end its own quantum
  bool interactive_recent(uint64_t now) const;
  uint32_t active_interactive() const;
  void set_state(Tenant& t, TenantState state, uint64_t now);
  void pod_activity_changed(Pod& pod, PodId id, bool was_active, uint64_t now);
  void after_release(Tenant& t, uint64_t now);
  void expire_presumed(uint64_t now);
  void record_wait(Tenant& t, uint64_t waited);
  void trim(uint64_t now);
  Pod& pod_entry(PodId id);

  SchedulerOptions options_;
  VirtualClock pod_clock_;  // lanes are the priority classes
  std::vector<Pod> pods_;
  std::vector<Tenant> tenants_;     // by slot
  std::vector<SlotId> present_;     // slots with a tenant, in arrival order
  std::vector<SlotId> unreleased_;  // passed over with work perhaps still on the GPU
  std::optional<SlotId> holder_;
  std::optional<SlotId> overtaken_;
  std::vector<Action> pending_;  // decided between passes (set_pod_policy), applied at the next
  std::vector<Action> decided_;  // what decide() returned last
  bool closed_ = false;
  uint64_t next_deadline_ = 0;
  // next_deadline_'s parts: the holder's idle check, and every other reason (0: none).
  uint64_t idle_check_ns_ = 0;
  uint64_t other_deadline_ns_ = 0;
  // How late other_deadline_ns_ may be served (the quantum's end plus its slack, or the
  // earliest exact deadline).
  uint64_t other_latest_ns_ = 0;
  uint64_t self_end_ns_ = 0;   // self_end_ns()
  uint64_t accounted_ns_ = 0;  // on-GPU tenants are charged up to here
  uint64_t next_trim_ns_ = 0;
  uint32_t active_count_ = 0;  // tenants waiting, holding or revoking, on all pods
  uint32_t waiting_ = 0;
  uint64_t interactive_seen_ns_ = 0;  // last time an interactive tenant was active
};

}  // namespace quanta::arbiter
