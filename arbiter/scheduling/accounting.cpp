// The per-GPU timeline: tenant state changes become phase time per pod, waits charged to
// whoever held the GPU meanwhile, wait/drain/handoff histograms and a second-by-second
// history. Time is folded into a pod's totals when its phase or the GPU's holder changes
// (and for everyone at advance()), always with the states as they were until then, so the
// order of events within one decision pass does not matter and a pass costs what changed.
#include "arbiter/scheduling/accounting.h"

#include <algorithm>

namespace quanta::arbiter {
namespace {

bool holds(TenantState s) {
  return s == TenantState::kHolding || s == TenantState::kRevoking;
}

bool draining(TenantState s) {
  return s == TenantState::kRevoking || s == TenantState::kPassedOver;
}

}  // namespace

PodTotals totals_between(const PodTotals& later, const PodTotals& earlier) {
  const PodTotals& b = later;
  const PodTotals& a = earlier;
  PodTotals d;
  for (size_t k = 0; k < kPhaseCount; ++k)
    d.phase_ns[k] = b.phase_ns[k] - std::min(b.phase_ns[k], a.phase_ns[k]);
  d.held_ns = b.held_ns - std::min(b.held_ns, a.held_ns);
  d.busy_ns = b.busy_ns - std::min(b.busy_ns, a.busy_ns);
  // The span the driver's figures cover (they lag the hold timeline by up to a sample).
  d.busy_until_ns = b.busy_until_ns - std::min(b.busy_until_ns, a.busy_until_ns);
  d.grants = b.grants - std::min(b.grants, a.grants);
  d.revoke_timeouts = b.revoke_timeouts - std::min(b.revoke_timeouts, a.revoke_timeouts);
  for (const auto& [holder, ns] : b.waited_behind_ns) {
    auto it = a.waited_behind_ns.find(holder);
    const uint64_t before = it == a.waited_behind_ns.end() ? 0 : it->second;
    if (ns > before) d.waited_behind_ns[holder] = ns - before;
  }
  return d;
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kRunning:
      return "running";
    case Phase::kWaiting:
      return "waiting";
    case Phase::kDraining:
      return "draining";
    case Phase::kIdle:
      return "idle";
  }
  return "idle";
}

void LatencyHistogram::add(uint64_t ns) {
  size_t i = 0;
  while (i < kBoundsNs.size() && ns > kBoundsNs[i]) ++i;
  ++counts_[i];
  ++count_;
  sum_ns_ += ns;
}

uint64_t LatencyHistogram::at_or_below(size_t i) const {
  uint64_t n = 0;
  for (size_t k = 0; k <= i && k < counts_.size(); ++k) n += counts_[k];
  return n;
}

uint64_t GpuAccounting::clock(uint64_t now) {
  last_ns_ = std::max(now, last_ns_);
  return last_ns_;
}

void GpuAccounting::add_tenant(SlotId slot, const std::string& pod_key, uint64_t now) {
  now = clock(now);
  if (tenants_.count(slot) != 0) remove_tenant(slot, now);
  auto found = ids_.find(pod_key);
  PodAccount* pod = nullptr;
  if (found != ids_.end()) {
    pod = &pods_.at(found->second);
    fold(*pod, now);  // a departed pod counts nothing while it has no tenant
  } else {
    const AccountId id = next_id_++;
    ids_.emplace(pod_key, id);
    pod = &pods_[id];
    pod->id = id;
    pod->key = pod_key;
    pod->since_ns = now;
    pod->folded_ns = now;
    pod->totals.busy_until_ns = now;  // nothing of it ran before it came
    pod->history.push_back(PodSample{now, pod->totals, 0, false});
  }
  pod->retired_ns = 0;
  ++pod->tenants;
  ++pod->tenants_by_state[static_cast<size_t>(TenantState::kIdle)];
  TenantAccount& t = tenants_[slot];
  t.slot = slot;
  t.pod = pod;
  t.serial = next_serial_++;
  t.folded_ns = now;
}

void GpuAccounting::remove_tenant(SlotId slot, uint64_t now) {
  now = clock(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  set_state(it->second, TenantState::kIdle, now);
  PodAccount* pod = it->second.pod;
  fold(*pod, now);  // an idle tenant's departure changes no state, only the count
  tenants_.erase(it);
  --pod->tenants_by_state[static_cast<size_t>(TenantState::kIdle)];
  if (--pod->tenants == 0) pod->retired_ns = now;
}

void GpuAccounting::granted(SlotId slot, uint64_t now) {
  now = clock(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  set_state(it->second, TenantState::kHolding, now);
}

void GpuAccounting::revoked(SlotId slot, uint64_t now) {
  now = clock(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end() || it->second.state != TenantState::kHolding) return;
  set_state(it->second, TenantState::kRevoking, now);
}

void GpuAccounting::passed_over(SlotId slot, uint64_t now) {
  now = clock(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  set_state(it->second, TenantState::kPassedOver, now);
}

void GpuAccounting::released(SlotId slot, uint64_t now) {
  now = clock(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  // Whether it wants the GPU again the scheduler says at settle(), at this same instant.
  set_state(it->second, TenantState::kIdle, now);
}

void GpuAccounting::drained_own_quantum(SlotId slot, uint64_t quantum_end_ns) {
  auto it = tenants_.find(slot);
  if (it == tenants_.end() || it->second.state != TenantState::kHolding) return;
  // Time already folded stays as it was: the drain counts from the quantum's end or the
  // last time accounted, whichever is later; its histogram from the quantum's end.
  set_state(it->second, TenantState::kRevoking, clock(quantum_end_ns));
  it->second.revoke_ns = quantum_end_ns;
}

void GpuAccounting::settle(const Scheduler& sched, uint64_t now) {
  now = clock(now);
  // Hold ends first, so a grant in the same pass sees the hold it follows as ended.
  for (int round = 0; round < 2; ++round) {
    for (auto& [slot, t] : tenants_) {
      const TenantState s = sched.state(slot);
      if (s == t.state) continue;
      const bool ends_hold = holds(t.state) && !holds(s);
      if ((round == 0) == ends_hold) set_state(t, s, now);
    }
  }
}

void GpuAccounting::add_busy(const std::string& pod_key, uint64_t ns) {
  auto found = ids_.find(pod_key);
  if (found != ids_.end()) pods_.at(found->second).totals.busy_ns += ns;
}

void GpuAccounting::busy_reported(uint64_t until_ns) {
  for (auto& [id, pod] : pods_) pod.totals.busy_until_ns = until_ns;
}

void GpuAccounting::set_state(TenantAccount& t, TenantState next, uint64_t now) {
  const TenantState was = t.state;
  if (was == next) return;
  PodAccount& pod = *t.pod;
  fold(t, now);
  fold(pod, now);
  if (next == TenantState::kHolding) {
    ++pod.totals.grants;
    const bool was_waiting = was == TenantState::kWaiting;
    if (was_waiting) {
      const uint64_t waited = now > t.wait_since_ns ? now - t.wait_since_ns : 0;
      pod.wait.add(waited);
      pod.waits.push_back(WaitRecord{now, waited});
    }
    if (last_holder_serial_ != 0 && last_holder_serial_ != t.serial) ++switches_;
    // A handoff: the GPU passed from a hold that ended to a tenant that was waiting then.
    // A grant beside a holder that still drains (an interactive preemption) is no handoff.
    if (open_holds_ == 0 && last_holder_serial_ != 0 && last_holder_serial_ != t.serial &&
        was_waiting && t.wait_since_ns <= last_hold_end_ns_) {
      handoff_.add(now - last_hold_end_ns_);
    }
    last_holder_serial_ = t.serial;
    t.revoke_ns = 0;
  }
  if (next == TenantState::kWaiting) t.wait_since_ns = now;
  if (next == TenantState::kRevoking) t.revoke_ns = now;
  if (next == TenantState::kPassedOver) {
    ++pod.totals.revoke_timeouts;
    if (t.revoke_ns == 0) t.revoke_ns = now;
  }
  if (draining(was) && !draining(next) && next != TenantState::kHolding) {
    if (t.revoke_ns != 0) pod.drain.add(now - t.revoke_ns);
    t.revoke_ns = 0;
  }
  if (holds(was) && !holds(next)) {
    last_hold_end_ns_ = now;
    --open_holds_;
  }
  if (!holds(was) && holds(next)) ++open_holds_;
  t.state = next;
  --pod.tenants_by_state[static_cast<size_t>(was)];
  ++pod.tenants_by_state[static_cast<size_t>(next)];
  pod.phase = phase_of(pod);
  // Only a hold or a drain that starts or ends can change who holds the GPU.
  const bool occupies = holds(next) || draining(next);
  if (holds(was) || draining(was) || occupies) {
    const auto at = std::lower_bound(occupants_.begin(), occupants_.end(), t.slot);
    const bool listed = at != occupants_.end() && *at == t.slot;
    if (occupies && !listed) occupants_.insert(at, t.slot);
    if (!occupies && listed) occupants_.erase(at);
    find_holder(now);
  }
}

// A pod's phase: the most active state among its tenants.
Phase GpuAccounting::phase_of(const PodAccount& pod) {
  const auto count = [&](TenantState s) { return pod.tenants_by_state[static_cast<size_t>(s)]; };
  if (count(TenantState::kHolding) != 0) return Phase::kRunning;
  if (count(TenantState::kRevoking) != 0 || count(TenantState::kPassedOver) != 0)
    return Phase::kDraining;
  if (count(TenantState::kWaiting) != 0) return Phase::kWaiting;
  return Phase::kIdle;
}

// The pod's phase time since its last fold, and its wait behind the holder of that stretch.
void GpuAccounting::fold(PodAccount& pod, uint64_t now) {
  if (now <= pod.folded_ns) return;
  const uint64_t dt = now - pod.folded_ns;
  pod.folded_ns = now;
  if (pod.tenants == 0) return;
  pod.totals.phase_ns[static_cast<size_t>(pod.phase)] += dt;
  if (pod.phase == Phase::kWaiting) pod.totals.waited_behind_ns[holder_] += dt;
}

// The tenant's hold since its last fold, into its pod's held time.
void GpuAccounting::fold(TenantAccount& t, uint64_t now) {
  if (now <= t.folded_ns) return;
  if (holds(t.state)) t.pod->totals.held_ns += now - t.folded_ns;
  t.folded_ns = now;
}

void GpuAccounting::fold_held(uint64_t now) {
  if (now <= held_folded_ns_) return;
  if (occupied_) held_ns_ += now - held_folded_ns_;
  held_folded_ns_ = now;
}

// The pod whose process holds the grant, else one that drains (a revoked one before one
// passed over). Waiting pods are folded first: their wait so far was behind the old holder.
void GpuAccounting::find_holder(uint64_t now) {
  AccountId holding = kNobody;
  AccountId drainer = kNobody;
  bool occupied = false;
  for (const SlotId slot : occupants_) {
    const TenantAccount& t = tenants_.at(slot);
    if (t.state == TenantState::kHolding) holding = t.pod->id;
    if (draining(t.state) && (drainer == kNobody || t.state == TenantState::kRevoking))
      drainer = t.pod->id;
    occupied = occupied || holds(t.state);
  }
  const AccountId holder = holding != kNobody ? holding : drainer;
  if (holder != holder_) {
    for (auto& [id, pod] : pods_) {
      if (pod.phase == Phase::kWaiting) fold(pod, now);
    }
    holder_ = holder;
  }
  if (occupied != occupied_) {
    fold_held(now);
    occupied_ = occupied;
  }
}

void GpuAccounting::advance(uint64_t now) {
  now = clock(now);
  for (auto& [id, pod] : pods_) fold(pod, now);
  for (auto& [slot, t] : tenants_) fold(t, now);
  fold_held(now);
}

void GpuAccounting::tick(const std::map<std::string, double>& target_by_pod, uint64_t now) {
  now = clock(now);
  advance(now);
  for (auto it = pods_.begin(); it != pods_.end();) {
    PodAccount& pod = it->second;
    if (pod.tenants == 0 && pod.retired_ns != 0 && now - pod.retired_ns > kRetainNs) {
      ids_.erase(pod.key);
      it = pods_.erase(it);
      continue;
    }
    auto target = target_by_pod.find(pod.key);
    pod.target_share = pod.tenants != 0 && target != target_by_pod.end() ? target->second : 0;
    pod.history.push_back(PodSample{now, pod.totals, pod.target_share, true});
    while (pod.history.size() > kHistoryTicks) pod.history.pop_front();
    while (!pod.waits.empty() && pod.waits.front().end_ns + kHistoryNs < now) pod.waits.pop_front();
    ++it;
  }
  held_history_.emplace_back(now, held_ns_);
  while (held_history_.size() > kHistoryTicks) held_history_.pop_front();
}

const PodAccount* GpuAccounting::pod(const std::string& key) const {
  auto found = ids_.find(key);
  return found == ids_.end() ? nullptr : &pods_.at(found->second);
}

std::string GpuAccounting::key_of(AccountId id) const {
  auto it = pods_.find(id);
  return it == pods_.end() ? std::string() : it->second.key;
}

std::vector<std::pair<std::string, uint64_t>> GpuAccounting::by_holder(
    const std::map<AccountId, uint64_t>& waited_behind_ns) const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [holder, ns] : waited_behind_ns) out.emplace_back(key_of(holder), ns);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

const PodSample* GpuAccounting::sample_before(const PodAccount& pod, uint64_t now,
                                              uint64_t window_ns) const {
  if (pod.history.empty()) return nullptr;
  const PodSample* best = &pod.history.front();
  for (const PodSample& s : pod.history) {
    if (s.at_ns + window_ns <= now) best = &s;
  }
  return best;
}

std::pair<uint64_t, uint64_t> GpuAccounting::held_before(uint64_t now, uint64_t window_ns) const {
  if (held_history_.empty()) return {last_ns_, held_ns_};
  std::pair<uint64_t, uint64_t> best = held_history_.front();
  for (const auto& h : held_history_) {
    if (h.first + window_ns <= now) best = h;
  }
  return best;
}

}  // namespace quanta::arbiter
