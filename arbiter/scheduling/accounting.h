// Who held each GPU when, who wanted it meanwhile and who drained: the per-GPU timeline
// behind the contention metrics, `quantactl top` and `quantactl explain`. The arbiter feeds
// it where it applies grants, revokes, releases and pass-overs, and once per decision pass
// with every tenant's state; it keeps no clock of its own, so tests drive it with a fake one.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "arbiter/scheduling/ring.h"
#include "arbiter/scheduling/scheduler.h"

namespace quanta::arbiter {

// How a pod spends its time on one GPU (the `state` label of quanta_pod_time_seconds_total):
// running while one of its processes holds the grant, draining while one was revoked and
// has not released yet, waiting while one wants the GPU and none holds it, idle otherwise.
enum class Phase : uint8_t { kRunning, kWaiting, kDraining, kIdle };
inline constexpr size_t kPhaseCount = 4;
const char* phase_name(Phase phase);

// A latency histogram with fixed bounds, exported in seconds.
class LatencyHistogram {
 public:
  static constexpr std::array<uint64_t, 17> kBoundsNs = {
      50'000,      100'000,       250'000,       500'000,       1'000'000,     2'500'000,
      5'000'000,   10'000'000,    25'000'000,    50'000'000,    100'000'000,   250'000'000,
      500'000'000, 1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000};

  void add(uint64_t ns);
  uint64_t count() const { return count_; }
  uint64_t sum_ns() const { return sum_ns_; }
  // Observations at or below kBoundsNs[i] (cumulative, as Prometheus buckets are).
  uint64_t at_or_below(size_t i) const;

 private:
  std::array<uint64_t, kBoundsNs.size() + 1> counts_{};  // last: above every bound
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;
};

// Pod ids are the accounting's own (never reused while it runs), so a pod region index the
// registry hands to a new pod never merges two pods' counters.
using AccountId = uint32_t;
inline constexpr AccountId kNobody = 0;  // "no pod held the GPU" in the waiter x holder matrix

// Everything that only grows, for one pod on one GPU.
struct PodTotals {
  std::array<uint64_t, kPhaseCount> phase_ns{};
  uint64_t held_ns = 0;        // grant to release (overruns included), summed over its processes
  uint64_t busy_ns = 0;        // device time its work ran, where the driver reports it (add_busy)
  uint64_t busy_until_ns = 0;  // busy_ns covers the time up to here (the driver's last report)
  uint64_t grants = 0;
  uint64_t revoke_timeouts = 0;
  std::map<AccountId, uint64_t> waited_behind_ns;  // holder -> time this pod waited for it
};

// One second of a pod's history: its totals then, and the target share the policy gave it.
// What a pod's totals grew by from `earlier` to `later`, taken at two instants (a figure
// that went back, as the driver's busy time can, counts as none).
PodTotals totals_between(const PodTotals& later, const PodTotals& earlier);

struct PodSample {
  uint64_t at_ns = 0;
  PodTotals totals;
  double target_share = 0;
  bool ticked = false;  // false for the mark made at arrival (no target known then)
};

struct WaitRecord {
  uint64_t end_ns;
  uint64_t wait_ns;
};

struct PodAccount {
  AccountId id = 0;
  std::string key;
  uint32_t tenants = 0;
  std::array<uint32_t, 5> tenants_by_state{};  // indexed by TenantState
  Phase phase = Phase::kIdle;
  uint64_t since_ns = 0;    // first seen on this GPU
  uint64_t folded_ns = 0;   // totals hold the time up to here (GpuAccounting::advance: up to now)
  uint64_t retired_ns = 0;  // when its last tenant left (kept a while for explain), 0 = live
  PodTotals totals;
  LatencyHistogram wait;          // want to grant
  LatencyHistogram drain;         // revoke to release
  std::deque<PodSample> history;  // one per tick, the last kHistoryTicks
  Ring<WaitRecord> waits;         // ended within the last kHistoryNs
  double target_share = 0;        // at the last tick
};

class GpuAccounting {
 public:
  static constexpr uint64_t kHistoryNs = 60'000'000'000;  // what explain looks back on
  static constexpr size_t kHistoryTicks = 62;             // ticks are about a second apart
  static constexpr uint64_t kRetainNs = 300'000'000'000;  // a departed pod stays this long

  // Tenants come and go with their slot on this GPU.
  void add_tenant(SlotId slot, const std::string& pod_key, uint64_t now);
  void remove_tenant(SlotId slot, uint64_t now);

  // What the arbiter applied or saw, as it happens.
  void granted(SlotId slot, uint64_t now);
  void revoked(SlotId slot, uint64_t now);
  void passed_over(SlotId slot, uint64_t now);
  void released(SlotId slot, uint64_t now);
  // A holder that ends its own quantum (kAttachEndsOwnQuantum) is never revoked: when its
  // release comes after that end, it drained from there, and its pod's phase time and drain
  // histogram say so as they do for a revoked holder. Call it before released().
  void drained_own_quantum(SlotId slot, uint64_t quantum_end_ns);
  // After every decision pass: the scheduler's state of each tenant (catches want changes
  // and anything the calls above did not say).
  void settle(const Scheduler& sched, uint64_t now);
  // Device time the pod's processes ran, as the driver reports it (NVML per process).
  void add_busy(const std::string& pod_key, uint64_t ns);
  // The driver's figures given with add_busy cover the time up to `until_ns`, for all pods.
  void busy_reported(uint64_t until_ns);

  // About once a second: records a history sample per pod with its current target share,
  // and forgets pods that left more than kRetainNs ago.
  void tick(const std::map<std::string, double>& target_by_pod, uint64_t now);

  // Brings every total up to `now`; call it before reading pods(). Between calls, a pod's
  // totals run only to its last change (PodAccount::folded_ns): a decision pass folds the
  // pods whose phase changed, and the waiting pods when the holder changed.
  void advance(uint64_t now);

  const std::map<AccountId, PodAccount>& pods() const { return pods_; }
  const PodAccount* pod(const std::string& key) const;
  std::string key_of(AccountId id) const;  // "" for kNobody or an unknown id
  // Time waited behind each holder (PodTotals::waited_behind_ns) by holder key, largest first.
  std::vector<std::pair<std::string, uint64_t>> by_holder(
      const std::map<AccountId, uint64_t>& waited_behind_ns) const;
  uint64_t switches() const { return switches_; }
  const LatencyHistogram& handoff() const { return handoff_; }
  uint64_t held_ns() const { return held_ns_; }  // some tenant held the grant
  // Cumulative figures `window_ns` back, from the history (the oldest sample inside it,
  // or the pod's arrival when it is younger): a pod's totals and when they were taken.
  const PodSample* sample_before(const PodAccount& pod, uint64_t now, uint64_t window_ns) const;
  // held_ns() as of a tick at least `window_ns` ago (or the first), with its time.
  std::pair<uint64_t, uint64_t> held_before(uint64_t now, uint64_t window_ns) const;

 private:
  struct TenantAccount {
    SlotId slot = 0;
    PodAccount* pod = nullptr;
    TenantState state = TenantState::kIdle;
    uint64_t wait_since_ns = 0;
    uint64_t revoke_ns = 0;  // 0 = not revoked
    uint64_t serial = 0;     // unique per tenant while the arbiter runs (slots are reused)
    uint64_t folded_ns = 0;  // its pod's held_ns holds this tenant's hold up to here
  };

  uint64_t clock(uint64_t now);  // now, never before a time already seen
  void set_state(TenantAccount& t, TenantState state, uint64_t now);
  void fold(PodAccount& pod, uint64_t now);
  void fold(TenantAccount& t, uint64_t now);
  void fold_held(uint64_t now);
  void find_holder(uint64_t now);
  static Phase phase_of(const PodAccount& pod);

  std::map<SlotId, TenantAccount> tenants_;
  std::vector<SlotId> occupants_;  // slots holding, revoked or passed over, in slot order
  std::map<AccountId, PodAccount> pods_;
  std::map<std::string, AccountId, std::less<>> ids_;
  AccountId next_id_ = 1;
  uint64_t last_ns_ = 0;        // the latest time an entry point was given
  AccountId holder_ = kNobody;  // the pod whose process holds the grant, else one draining
  bool occupied_ = false;       // some tenant holds or drains
  uint64_t held_ns_ = 0;        // up to held_folded_ns_
  uint64_t held_folded_ns_ = 0;
  std::deque<std::pair<uint64_t, uint64_t>> held_history_;  // (tick time, held_ns_)
  // The tenant granted last and when the last hold ended, for switches and handoffs.
  uint64_t next_serial_ = 1;
  uint64_t last_holder_serial_ = 0;
  uint64_t last_hold_end_ns_ = 0;
  uint32_t open_holds_ = 0;  // tenants holding or revoking (a grant beside one is no handoff)
  uint64_t switches_ = 0;
  LatencyHistogram handoff_;
};

}  // namespace quanta::arbiter
