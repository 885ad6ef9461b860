// One GPU's scheduler: weighted fair sharing by virtual time between pods (and round robin
// by virtual time between a pod's processes), priority classes, max-share ceilings, idle
// and stopped holders. Pure: no I/O, no clock of its own; the arbiter feeds it events and
// applies the actions it returns, so tests drive it with a fake clock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/policy.h"

namespace quanta::arbiter {

using SlotId = uint32_t;
using PodId = uint32_t;

struct SchedulerOptions {
  uint64_t quantum_ns = 20'000'000;
  uint64_t quantum_min_ns = 1'000'000;  // bounds quanta; minimum hold before preemption
  uint64_t quantum_max_ns = 100'000'000;
  uint64_t revoke_timeout_ns = 500'000'000;
  uint64_t idle_release_ns = 2'000'000;
  uint64_t lag_ns = 0;                       // idle credit a waking pod keeps; 0 = one quantum
  uint64_t share_window_ns = 1'000'000'000;  // max-share ceiling window
  uint64_t stats_window_ns = 5'000'000'000;  // achieved-share window for status
  // An interactive tenant preempting a lower class starts at once while the old holder
  // drains its queued work (false: strictly one tenant on the GPU at a time).
  bool drain_overlap = true;
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
  double target_share;
  double achieved_share;
  uint64_t wait_p99_ns;
  uint64_t quantum_ns;
  uint64_t grants;
  uint64_t pass_overs;
};

class Scheduler {
 public:
  // Virtual time advances by charged_ns * kScale / weight.
  static constexpr uint64_t kScale = 1000;
  // A stretched quantum covers this many observed kernels.
  static constexpr uint64_t kKernelsPerQuantum = 4;

  explicit Scheduler(SchedulerOptions options);

  // Policy of a pod; applies at the next decision (live changes included).
  void set_pod_policy(PodId pod, const common::Policy& policy);
  void add_tenant(SlotId slot, PodId pod, uint64_t now);
  // After an arbiter restart: a re-adopted slot whose turn is odd holds the grant.
  bool adopt_holder(SlotId slot, uint64_t now);  // false: another slot already holds
  void remove_tenant(SlotId slot, uint64_t now);
  bool has_tenant(SlotId slot) const { return tenants_.count(slot) != 0; }

  // GateChannel::want as last read. True when it woke the tenant (idle to waiting).
  bool set_want(SlotId slot, bool want, uint64_t now);
  // Hints from the tenant's GateChannel (untrusted: only ever used to shorten its own hold).
  void set_activity(SlotId slot, uint64_t last_launch_ns, uint64_t inflight_ns, uint64_t now);
  // The tenant published a release of its current turn (odd: voluntary give-back).
  void released(SlotId slot, uint64_t now);

  // Runs one decision: returns the grants, revokes and pass-overs to apply, in order.
  std::vector<Action> decide(uint64_t now);
  // When decide() must run again even if no event arrives; 0 = not needed.
  uint64_t next_deadline() const { return next_deadline_; }

  // Drain (`quantactl drain`): while set, no tenant is granted the GPU and the holder is
  // revoked at once (passed over after revoke_timeout like any holder); waiters keep their
  // place and are served when it is cleared. idle(): nobody holds the GPU or drains work
  // queued under a grant, so no work submitted through Quanta is left on it.
  void set_draining(bool on) { drain_requested_ = on; }
  bool drain_requested() const { return drain_requested_; }
  bool idle() const { return !holder_ && !draining_; }

  std::optional<SlotId> holder() const { return holder_; }
  // A holder preempted by an interactive tenant that is still draining (drain_overlap).
  std::optional<SlotId> draining() const { return draining_; }
  TenantState state(SlotId slot) const;
  // The tenant's quantum: the pod's own if it set one, else the node quantum stretched to
  // cover a few of its observed kernels (so switches stay a small fraction of GPU time),
  // clamped to the node bounds. The stretch stops where a round of every active tenant
  // would outlast the share window: with many tenants, long quanta make the rounds so
  // coarse that shares measured over seconds drift far from the weights.
  uint64_t quantum_for(SlotId slot) const;
  // GPU time the tenant may keep queued: its quantum, or quantum_min for a non-interactive
  // tenant while an interactive one is active, so long queues cannot set its latency.
  uint64_t inflight_limit_for(SlotId slot, uint64_t now) const;
  // inflight_limit_for and quantum_for of every tenant in one walk (no lookup per slot).
  template <typename F>
  void for_each_limit(uint64_t now, F&& f) const {
    const bool shrink = interactive_recent(now);
    for (const auto& [slot, t] : tenants_) {
      const uint64_t quantum = quantum_of(t);
      const bool interactive = t.home->policy.priority == common::Priority::kInteractive;
      f(slot, shrink && !interactive ? options_.quantum_min_ns : quantum, quantum);
    }
  }
  uint32_t waiting_count() const;
  std::vector<TenantReport> report(uint64_t now) const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Interval {
    uint64_t start;
    uint64_t end;
  };
  struct Tenant;
  struct Pod {
    common::Policy policy;
    std::vector<Tenant*> members;  // its tenants (map nodes are stable), so no pass scans all
    uint32_t active_tenants = 0;   // members waiting, holding or revoking
    uint64_t vtime = 0;
    uint64_t tenant_floor = 0;  // least-served active process's vtime, never lowered
    bool active = false;
    std::deque<Interval> usage;  // holds within the share window (max-share)
    uint64_t open_since = 0;     // start of the current hold, when one of its tenants holds
  };
  struct Tenant {
    SlotId slot = 0;
    PodId pod = 0;
    Pod* home = nullptr;  // pods_ entries are never erased: looked up once, at add_tenant
    TenantState state = TenantState::kIdle;
    bool want = false;
    uint64_t vtime = 0;  // among the pod's own processes, unweighted ns
    uint64_t grant_ns = 0;
    uint64_t quantum_end_ns = 0;
    uint64_t revoke_ns = 0;
    uint64_t wait_since_ns = 0;
    uint64_t last_launch_ns = 0;
    uint64_t inflight_ns = 0;
    uint64_t kernel_ns = 0;  // moving average of queued GPU time seen while holding
    uint64_t last_active_ns = 0;
    uint64_t grants = 0;
    uint64_t pass_overs = 0;
    std::deque<Interval> holds;     // for the achieved share
    std::deque<uint64_t> waits_ns;  // recent wait durations for the p99
  };

  bool holds_open(SlotId slot, const Tenant& t) const;
  uint64_t quantum_of(const Tenant& t) const;
  Pod& pod_of(const Tenant& t);
  const Pod& pod_of(const Tenant& t) const;
  static bool is_active(const Tenant& t);
  // Every state change goes through here, so the pod's active count stays exact.
  void set_state(Tenant& t, TenantState state);
  bool interactive_recent(uint64_t now) const;
  void refresh_pod_activity(PodId pod, uint64_t now);
  uint64_t pod_vtime_now(PodId id, const Pod& pod, uint64_t now) const;
  uint64_t weight_of(const Pod& pod) const;
  uint64_t budget_ns(const Pod& pod) const;
  uint64_t used_in_window(const Pod& pod, uint64_t now) const;
  bool throttled(const Pod& pod, uint64_t now) const;
  uint64_t eligible_at(const Pod& pod, uint64_t now) const;
  bool eligible(const Tenant& t, uint64_t now) const;
  std::optional<SlotId> pick(uint64_t now) const;
  void end_hold(SlotId slot, Tenant& t, uint64_t now);
  void grant(SlotId slot, uint64_t now);
  void after_release(Tenant& t, uint64_t now);
  void trim(uint64_t now);
  void renormalise();

  SchedulerOptions options_;
  std::map<PodId, Pod> pods_;
  std::map<SlotId, Tenant> tenants_;
  std::optional<SlotId> holder_;
  std::optional<SlotId> draining_;
  std::vector<Action> pending_;
  uint64_t next_deadline_ = 0;
  uint64_t pod_floor_ = 0;     // lowest active pod vtime seen: waking pods are lifted near it
  uint64_t next_trim_ns_ = 0;  // old holds only cost memory: trimmed now and then, not per pass
  uint32_t active_count_ = 0;  // tenants waiting, holding or revoking, on all pods

  // set_draining (quantactl drain).
  bool drain_requested_ = false;

  // interactive_recent() for one `now`: the arbiter asks once per tenant after every
  // decision, and a scan per question would make each pass quadratic in the tenants.
  mutable uint64_t interactive_cache_now_ = 0;
  mutable bool interactive_cache_valid_ = false;
  mutable bool interactive_cache_ = false;
};

}  // namespace quanta::arbiter
