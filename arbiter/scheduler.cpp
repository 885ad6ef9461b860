// The per-GPU scheduling policy. Pods share the GPU by weighted virtual time (charged from
// grant to release, overruns included); a pod's processes share the pod's time among
// themselves, so a pod's share does not grow with its process count. Priority classes
// are strict (interactive > batch > best-effort) with a minimum hold before preemption.
#include "arbiter/scheduler.h"

#include <algorithm>
#include <tuple>

namespace quanta::arbiter {
namespace {

constexpr size_t kWaitSamples = 256;

uint64_t sat_sub(uint64_t a, uint64_t b) {
  return a > b ? a - b : 0;
}

uint64_t overlap(uint64_t start, uint64_t end, uint64_t from, uint64_t to) {
  uint64_t s = std::max(start, from);
  uint64_t e = std::min(end, to);
  return e > s ? e - s : 0;
}

}  // namespace

const char* state_name(TenantState s) {
  switch (s) {
    case TenantState::kIdle:
      return "idle";
    case TenantState::kWaiting:
      return "waiting";
    case TenantState::kHolding:
      return "holding";
    case TenantState::kRevoking:
      return "revoking";
    case TenantState::kPassedOver:
      return "passed-over";
  }
  return "unknown";
}

Scheduler::Scheduler(SchedulerOptions options) : options_(options) {
  if (options_.lag_ns == 0) options_.lag_ns = options_.quantum_ns;
}

void Scheduler::set_pod_policy(PodId pod, const common::Policy& policy) {
  interactive_cache_valid_ = false;
  auto [it, inserted] = pods_.try_emplace(pod);
  it->second.policy = policy;
  if (it->second.policy.weight < common::kMinWeight) it->second.policy.weight = common::kMinWeight;
  if (inserted) it->second.vtime = pod_floor_;
}

void Scheduler::add_tenant(SlotId slot, PodId pod, uint64_t now) {
  if (tenants_.count(slot) != 0) remove_tenant(slot, now);
  interactive_cache_valid_ = false;
  auto [pit, inserted] = pods_.try_emplace(pod);
  Pod& home = pit->second;
  if (inserted) home.vtime = pod_floor_;
  Tenant t;
  t.slot = slot;
  t.pod = pod;
  t.home = &home;
  t.last_active_ns = now;
  // Start level with the pod's other processes so a newcomer neither starves nor floods them.
  bool first = true;
  for (const Tenant* o : home.members) {
    t.vtime = first ? o->vtime : std::min(t.vtime, o->vtime);
    first = false;
  }
  t.holds.push_back({now, now});  // marks when the tenant arrived (for the achieved share)
  Tenant& added = tenants_[slot] = std::move(t);
  home.members.push_back(&added);
}

bool Scheduler::adopt_holder(SlotId slot, uint64_t now) {
  auto it = tenants_.find(slot);
  if (it == tenants_.end() || holder_) return false;
  Tenant& t = it->second;
  set_state(t, TenantState::kHolding);
  t.grant_ns = now;
  t.quantum_end_ns = now + quantum_for(slot);
  Pod& pod = pod_of(t);
  pod.open_since = now;
  holder_ = slot;
  refresh_pod_activity(t.pod, now);
  return true;
}

void Scheduler::remove_tenant(SlotId slot, uint64_t now) {
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  PodId pod = it->second.pod;
  if (holder_ == slot) {
    end_hold(slot, it->second, now);
    holder_.reset();
  }
  if (draining_ == slot) {
    end_hold(slot, it->second, now);
    draining_.reset();
  }
  Tenant& t = it->second;
  set_state(t, TenantState::kIdle);
  std::vector<Tenant*>& members = t.home->members;
  members.erase(std::find(members.begin(), members.end(), &t));
  tenants_.erase(it);
  interactive_cache_valid_ = false;
  refresh_pod_activity(pod, now);
}

bool Scheduler::set_want(SlotId slot, bool want, uint64_t now) {
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return false;
  Tenant& t = it->second;
  t.want = want;
  if (want && t.state == TenantState::kIdle) {
    // Lift a waking process to the pod's floor (the least-served active peer, never
    // lowered) minus the lag, so idle time is not banked beyond the lag. Lifting against
    // the floor rather than against peers that just woke keeps simultaneous wakers from
    // stacking one lag of credit each.
    Pod& pod = pod_of(t);
    bool found = false;
    uint64_t min_peer = 0;
    for (const Tenant* o : pod.members) {
      if (o == &t || !is_active(*o)) continue;
      uint64_t v = o->vtime;
      if (holds_open(o->slot, *o)) v += sat_sub(now, o->grant_ns);
      min_peer = found ? std::min(min_peer, v) : v;
      found = true;
    }
    if (found) pod.tenant_floor = std::max(pod.tenant_floor, min_peer);
    t.vtime = std::max(t.vtime, sat_sub(pod.tenant_floor, options_.lag_ns));
    set_state(t, TenantState::kWaiting);
    t.wait_since_ns = now;
    t.last_active_ns = now;
    refresh_pod_activity(t.pod, now);
    return true;
  }
  if (!want && t.state == TenantState::kWaiting) {
    set_state(t, TenantState::kIdle);
    refresh_pod_activity(t.pod, now);
  }
  return false;
}

void Scheduler::set_activity(SlotId slot, uint64_t last_launch_ns, uint64_t inflight_ns,
                             uint64_t now) {
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  // A launch "in the future" is garbage or clock skew: read it as "just now" (busy).
  Tenant& t = it->second;
  t.last_launch_ns = std::min(last_launch_ns, now);
  t.inflight_ns = inflight_ns;
  if (t.state == TenantState::kHolding && inflight_ns != 0) {
    uint64_t sample = std::min(inflight_ns, options_.quantum_max_ns);
    t.kernel_ns = t.kernel_ns == 0 ? sample : (t.kernel_ns * 7 + sample) / 8;
  }
}

void Scheduler::released(SlotId slot, uint64_t now) {
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  Tenant& t = it->second;
  switch (t.state) {
    case TenantState::kHolding:  // voluntary give-back of an odd turn: close the turn too
      end_hold(slot, t, now);
      holder_.reset();
      pending_.push_back({Action::Kind::kRevoke, slot});
      after_release(t, now);
      break;
    case TenantState::kRevoking:
      end_hold(slot, t, now);
      if (holder_ == slot) holder_.reset();
      if (draining_ == slot) draining_.reset();
      after_release(t, now);
      break;
    case TenantState::kPassedOver:
      after_release(t, now);
      break;
    default:
      break;
  }
}

std::vector<Action> Scheduler::decide(uint64_t now) {
  trim(now);
  std::vector<Action> out = std::move(pending_);
  pending_.clear();
  next_deadline_ = 0;
  auto arm = [&](uint64_t t) {
    if (t <= now) t = now + 1;
    if (next_deadline_ == 0 || t < next_deadline_) next_deadline_ = t;
  };

  // Keep the floor that waking pods are lifted towards.
  bool any_active = false;
  uint64_t min_active = 0;
  for (const auto& [id, pod] : pods_) {
    if (!pod.active) continue;
    uint64_t v = pod_vtime_now(id, pod, now);
    min_active = any_active ? std::min(min_active, v) : v;
    any_active = true;
  }
  if (any_active) pod_floor_ = std::max(pod_floor_, min_active);
  renormalise();

  // A holder that an interactive tenant overtook drains beside it; if it never finishes,
  // it is passed over like any holder that ignores a revoke.
  if (draining_) {
    SlotId ds = *draining_;
    Tenant& d = tenants_.at(ds);
    if (now >= d.revoke_ns + options_.revoke_timeout_ns) {
      end_hold(ds, d, now);
      set_state(d, TenantState::kPassedOver);
      ++d.pass_overs;
      draining_.reset();
      refresh_pod_activity(d.pod, now);
      out.push_back({Action::Kind::kPassOver, ds});
    } else {
      arm(d.revoke_ns + options_.revoke_timeout_ns);
    }
  }

  for (int round = 0; round < 3; ++round) {
    bool changed = false;
    if (holder_) {
      SlotId hs = *holder_;
      Tenant& h = tenants_.at(hs);
      Pod& hp = pod_of(h);
      std::optional<common::Priority> best_waiting;
      for (const auto& [s, t] : tenants_) {
        if (s == hs || !eligible(t, now)) continue;
        common::Priority p = pod_of(t).policy.priority;
        if (!best_waiting || p < *best_waiting) best_waiting = p;
      }
      // Whatever ends a lower-class hold, an interactive waiter need not wait for the
      // holder's queued kernels: it starts at once and the GPU's own time slicing shares
      // the drain. Between batch tenants the hand-over stays strict.
      const bool overlap = options_.drain_overlap && !draining_ && best_waiting &&
                           *best_waiting == common::Priority::kInteractive &&
                           hp.policy.priority != common::Priority::kInteractive;
      if (h.state == TenantState::kHolding) {
        bool revoke = drain_requested_;
        if (hp.policy.max_share_ppm < common::kShareScale) {
          uint64_t used = used_in_window(hp, now);
          uint64_t budget = budget_ns(hp);
          if (used >= budget) {
            revoke = true;
          } else {
            arm(now + (budget - used));
          }
        }
        if (!revoke && best_waiting) {
          if (now >= h.quantum_end_ns) {
            revoke = true;
          } else {
            arm(h.quantum_end_ns);
          }
          uint64_t last = std::max(h.grant_ns, h.last_launch_ns);
          if (!revoke) {
            if (h.inflight_ns == 0 && now >= last + options_.idle_release_ns) {
              revoke = true;
            } else {
              // The hints move without events. A busy holder's estimate lapses no sooner
              // than its own length after the last launch, so look again then rather than
              // every idle period: with many waiters a fixed short timer wakes the arbiter
              // hundreds of times a second for a holder that is plainly busy.
              uint64_t idle_at = last + std::max(h.inflight_ns, options_.idle_release_ns);
              arm(idle_at > now ? idle_at : now + options_.idle_release_ns);
            }
          }
          if (!revoke && *best_waiting < hp.policy.priority) {
            uint64_t hold_end = h.grant_ns + options_.quantum_min_ns;
            if (now >= hold_end) {
              revoke = true;
            } else {
              arm(hold_end);
            }
          }
        }
        if (revoke) {
          set_state(h, TenantState::kRevoking);
          h.revoke_ns = now;
          out.push_back({Action::Kind::kRevoke, hs});
          arm(now + options_.revoke_timeout_ns);
          changed = true;
          if (overlap) {
            draining_ = hs;
            holder_.reset();
          }
        }
      } else if (h.state == TenantState::kRevoking) {
        if (overlap) {  // revoked for a batch waiter, and now an interactive one came
          draining_ = hs;
          holder_.reset();
          changed = true;
        } else if (now >= h.revoke_ns + options_.revoke_timeout_ns) {
          end_hold(hs, h, now);
          set_state(h, TenantState::kPassedOver);
          ++h.pass_overs;
          holder_.reset();
          refresh_pod_activity(h.pod, now);
          out.push_back({Action::Kind::kPassOver, hs});
          changed = true;
        } else {
          arm(h.revoke_ns + options_.revoke_timeout_ns);
        }
      }
    }
    if (!holder_) {
      if (auto next = pick(now)) {
        grant(*next, now);
        out.push_back({Action::Kind::kGrant, *next});
        changed = true;
      }
    }
    if (!changed) break;
  }

  // Pods held back by their ceiling need a decision when they become eligible again.
  for (const auto& [s, t] : tenants_) {
    if (t.state != TenantState::kWaiting) continue;
    const Pod& p = pod_of(t);
    if (throttled(p, now)) arm(eligible_at(p, now));
  }
  for (auto& [s, t] : tenants_) {
    if (is_active(t)) t.last_active_ns = now;
  }
  interactive_cache_valid_ = false;
  return out;
}

TenantState Scheduler::state(SlotId slot) const {
  auto it = tenants_.find(slot);
  return it == tenants_.end() ? TenantState::kIdle : it->second.state;
}

uint64_t Scheduler::quantum_for(SlotId slot) const {
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) {
    return std::clamp(options_.quantum_ns, options_.quantum_min_ns, options_.quantum_max_ns);
  }
  return quantum_of(it->second);
}

uint64_t Scheduler::quantum_of(const Tenant& t) const {
  uint64_t q = options_.quantum_ns;
  const Pod& p = pod_of(t);
  if (p.policy.quantum_ns != 0) {
    q = p.policy.quantum_ns;
  } else {
    uint64_t stretch = t.kernel_ns * kKernelsPerQuantum;
    uint64_t round_cap = options_.share_window_ns / std::max<uint64_t>(active_count_, 1);
    q = std::max(q, std::min(stretch, round_cap));
  }
  return std::clamp(q, options_.quantum_min_ns, options_.quantum_max_ns);
}

uint64_t Scheduler::inflight_limit_for(SlotId slot, uint64_t now) const {
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return options_.quantum_ns;
  if (pod_of(it->second).policy.priority != common::Priority::kInteractive &&
      interactive_recent(now)) {
    return options_.quantum_min_ns;
  }
  return quantum_for(slot);
}

bool Scheduler::interactive_recent(uint64_t now) const {
  if (interactive_cache_valid_ && interactive_cache_now_ == now) return interactive_cache_;
  bool recent = false;
  for (const auto& [id, pod] : pods_) {
    if (pod.policy.priority != common::Priority::kInteractive) continue;
    for (const Tenant* t : pod.members) {
      // "Active" reaches back one share window: interactive tenants idle between requests.
      if (is_active(*t) || t->last_active_ns + options_.share_window_ns >= now) recent = true;
    }
  }
  interactive_cache_now_ = now;
  interactive_cache_valid_ = true;
  interactive_cache_ = recent;
  return recent;
}

uint32_t Scheduler::waiting_count() const {
  uint32_t n = 0;
  for (const auto& [s, t] : tenants_) n += t.state == TenantState::kWaiting ? 1 : 0;
  return n;
}

std::vector<TenantReport> Scheduler::report(uint64_t now) const {
  const uint64_t window = options_.stats_window_ns;
  const uint64_t from = sat_sub(now, window);
  auto recently_active = [&](const Tenant& t) {
    return is_active(t) || t.last_active_ns + window >= now;
  };

  // Target shares: weights of the pods that used or wanted the GPU recently, within the
  // best priority class present, capped by max-share.
  std::map<PodId, uint32_t> active_procs;
  std::optional<common::Priority> best;
  for (const auto& [s, t] : tenants_) {
    if (!recently_active(t)) continue;
    ++active_procs[t.pod];
    common::Priority p = pod_of(t).policy.priority;
    if (!best || p < *best) best = p;
  }
  uint64_t weight_sum = 0;
  for (const auto& [id, n] : active_procs) {
    const Pod& p = pods_.at(id);
    if (p.policy.priority == *best) weight_sum += weight_of(p);
  }

  std::vector<TenantReport> out;
  for (const auto& [s, t] : tenants_) {
    const Pod& p = pod_of(t);
    TenantReport r{};
    r.slot = s;
    r.pod = t.pod;
    r.state = t.state;
    r.quantum_ns = quantum_for(s);
    r.grants = t.grants;
    r.pass_overs = t.pass_overs;
    if (recently_active(t) && weight_sum != 0 && p.policy.priority == *best) {
      double pod_share = static_cast<double>(weight_of(p)) / static_cast<double>(weight_sum);
      pod_share =
          std::min(pod_share, p.policy.max_share_ppm / static_cast<double>(common::kShareScale));
      r.target_share = pod_share / active_procs[t.pod];
    }
    uint64_t held = 0;
    uint64_t since = t.holds.empty() ? now : t.holds.front().start;
    for (const Interval& iv : t.holds) held += overlap(iv.start, iv.end, from, now);
    if (holds_open(s, t)) held += overlap(t.grant_ns, now, from, now);
    uint64_t span = std::min(window, sat_sub(now, since));
    r.achieved_share = span == 0 ? 0.0 : static_cast<double>(held) / static_cast<double>(span);
    std::vector<uint64_t> waits(t.waits_ns.begin(), t.waits_ns.end());
    if (t.state == TenantState::kWaiting) waits.push_back(sat_sub(now, t.wait_since_ns));
    if (!waits.empty()) {
      std::sort(waits.begin(), waits.end());
      size_t idx = (waits.size() * 99 + 99) / 100;
      r.wait_p99_ns = waits[std::min(waits.size(), idx) - 1];
    }
    out.push_back(r);
  }
  return out;
}

Scheduler::Pod& Scheduler::pod_of(const Tenant& t) {
  return *t.home;
}
const Scheduler::Pod& Scheduler::pod_of(const Tenant& t) const {
  return *t.home;
}

bool Scheduler::is_active(const Tenant& t) {
  return t.state == TenantState::kWaiting || t.state == TenantState::kHolding ||
         t.state == TenantState::kRevoking;
}

void Scheduler::set_state(Tenant& t, TenantState state) {
  const bool was = is_active(t);
  t.state = state;
  const bool is = is_active(t);
  if (was != is) {
    if (is) {
      ++t.home->active_tenants;
      ++active_count_;
    } else {
      --t.home->active_tenants;
      --active_count_;
    }
    interactive_cache_valid_ = false;
  }
}

void Scheduler::refresh_pod_activity(PodId id, uint64_t now) {
  Pod& pod = pods_.at(id);
  const bool active = pod.active_tenants != 0;
  if (active && !pod.active) {
    // A waking pod starts no further back than the lag behind the floor: the least-served
    // active pod, never lowered (pods that woke just before it do not pull it down, or
    // simultaneous wakers would stack one lag of credit each). It cannot monopolise.
    bool found = false;
    uint64_t base = 0;
    for (const auto& [oid, other] : pods_) {
      if (oid == id || !other.active) continue;
      uint64_t v = pod_vtime_now(oid, other, now);
      base = found ? std::min(base, v) : v;
      found = true;
    }
    if (found) pod_floor_ = std::max(pod_floor_, base);
    uint64_t lag = options_.lag_ns * kScale / weight_of(pod);
    pod.vtime = std::max(pod.vtime, sat_sub(pod_floor_, lag));
  }
  pod.active = active;
}

bool Scheduler::holds_open(SlotId slot, const Tenant& t) const {
  return (holder_ == slot || draining_ == slot) &&
         (t.state == TenantState::kHolding || t.state == TenantState::kRevoking);
}

uint64_t Scheduler::pod_vtime_now(PodId id, const Pod& pod, uint64_t now) const {
  uint64_t v = pod.vtime;
  for (std::optional<SlotId> s : {holder_, draining_}) {
    if (!s) continue;
    const Tenant& h = tenants_.at(*s);
    if (h.pod == id && holds_open(*s, h)) v += sat_sub(now, h.grant_ns) * kScale / weight_of(pod);
  }
  return v;
}

uint64_t Scheduler::weight_of(const Pod& pod) const {
  return std::max<uint64_t>(pod.policy.weight, 1);
}

uint64_t Scheduler::budget_ns(const Pod& pod) const {
  return options_.share_window_ns * pod.policy.max_share_ppm / common::kShareScale;
}

uint64_t Scheduler::used_in_window(const Pod& pod, uint64_t now) const {
  uint64_t from = sat_sub(now, options_.share_window_ns);
  uint64_t used = 0;
  for (const Interval& iv : pod.usage) used += overlap(iv.start, iv.end, from, now);
  for (std::optional<SlotId> s : {holder_, draining_}) {
    if (!s) continue;
    const Tenant& h = tenants_.at(*s);
    if (h.home == &pod && holds_open(*s, h)) {
      used += overlap(pod.open_since, now, from, now);
    }
  }
  return used;
}

// Throttled pods wait until at least a minimal grant fits under the ceiling, so a pod at
// its ceiling is not granted slivers of a few microseconds.
bool Scheduler::throttled(const Pod& pod, uint64_t now) const {
  if (pod.policy.max_share_ppm >= common::kShareScale) return false;
  uint64_t budget = budget_ns(pod);
  uint64_t min_grant = std::min(options_.quantum_min_ns, budget / 2);
  return used_in_window(pod, now) + min_grant > budget;
}

uint64_t Scheduler::eligible_at(const Pod& pod, uint64_t now) const {
  uint64_t budget = budget_ns(pod);
  uint64_t target = budget - std::min(options_.quantum_min_ns, budget / 2);
  uint64_t used = used_in_window(pod, now);
  if (used <= target) return now;
  uint64_t excess = used - target;
  const uint64_t window = options_.share_window_ns;
  uint64_t from = sat_sub(now, window);
  // Old holds leave the window one nanosecond per nanosecond, oldest first.
  for (const Interval& iv : pod.usage) {
    uint64_t s = std::max(iv.start, from);
    if (iv.end <= s) continue;
    uint64_t len = iv.end - s;
    if (len >= excess) return s + window + excess;
    excess -= len;
  }
  return now + window;
}

bool Scheduler::eligible(const Tenant& t, uint64_t now) const {
  return t.state == TenantState::kWaiting && !throttled(pod_of(t), now);
}

std::optional<SlotId> Scheduler::pick(uint64_t now) const {
  if (drain_requested_) return std::nullopt;
  std::optional<SlotId> best;
  std::tuple<common::Priority, uint64_t, uint64_t, uint64_t, SlotId> best_key{};
  for (const auto& [s, t] : tenants_) {
    if (!eligible(t, now)) continue;
    const Pod& p = pod_of(t);
    // While an overtaken holder drains, only interactive tenants may run beside it.
    if (draining_ && p.policy.priority != common::Priority::kInteractive) continue;
    auto key = std::make_tuple(p.policy.priority, pod_vtime_now(t.pod, p, now), t.vtime,
                               t.wait_since_ns, s);
    if (!best || key < best_key) {
      best = s;
      best_key = key;
    }
  }
  return best;
}

void Scheduler::end_hold(SlotId slot, Tenant& t, uint64_t now) {
  (void)slot;
  Pod& pod = pod_of(t);
  uint64_t charged = sat_sub(now, t.grant_ns);
  pod.vtime += charged * kScale / weight_of(pod);
  t.vtime += charged;
  pod.usage.push_back({pod.open_since, now});
  t.holds.push_back({t.grant_ns, now});
}

void Scheduler::grant(SlotId slot, uint64_t now) {
  Tenant& t = tenants_.at(slot);
  set_state(t, TenantState::kHolding);
  t.grant_ns = now;
  t.quantum_end_ns = now + quantum_for(slot);
  t.last_active_ns = now;
  ++t.grants;
  t.waits_ns.push_back(sat_sub(now, t.wait_since_ns));
  if (t.waits_ns.size() > kWaitSamples) t.waits_ns.pop_front();
  pod_of(t).open_since = now;
  holder_ = slot;
}

void Scheduler::after_release(Tenant& t, uint64_t now) {
  set_state(t, t.want ? TenantState::kWaiting : TenantState::kIdle);
  if (t.want) t.wait_since_ns = now;
  refresh_pod_activity(t.pod, now);
}

void Scheduler::trim(uint64_t now) {
  // Intervals older than the windows add nothing to the sums (they overlap no window), so
  // a few trims per window bound the memory without a walk over every tenant per pass.
  if (now < next_trim_ns_) return;
  next_trim_ns_ = now + std::min(options_.share_window_ns, options_.stats_window_ns) / 8;
  uint64_t share_from = sat_sub(now, options_.share_window_ns);
  for (auto& [id, pod] : pods_) {
    while (!pod.usage.empty() && pod.usage.front().end < share_from) pod.usage.pop_front();
  }
  uint64_t stats_from = sat_sub(now, options_.stats_window_ns);
  for (auto& [s, t] : tenants_) {
    // Keep the oldest entry as the tenant's arrival mark until the window has passed it.
    while (t.holds.size() > 1 && t.holds[1].end < stats_from) t.holds.pop_front();
  }
}

// Virtual times only grow; shift them all down long before they could overflow.
void Scheduler::renormalise() {
  constexpr uint64_t kLimit = 1ull << 62;
  if (pod_floor_ < kLimit) return;
  uint64_t shift = pod_floor_ - kLimit / 2;
  for (auto& [id, pod] : pods_) pod.vtime = sat_sub(pod.vtime, shift);
  pod_floor_ -= shift;
}

}  // namespace quanta::arbiter
