// The per-GPU timeline: tenant state changes become phase time per pod, waits charged to
// whoever held the GPU meanwhile, wait/drain/handoff histograms and a second-by-second
// history. Every entry point first integrates the time since the last one with the
// states as they were, so the order of events within one decision pass does not matter.
#include "arbiter/accounting.h"

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

void GpuAccounting::add_tenant(SlotId slot, const std::string& pod_key, uint64_t now) {
  now = std::max(now, last_ns_);
  advance(now);
  if (tenants_.count(slot) != 0) remove_tenant(slot, now);
  auto found = ids_.find(pod_key);
  PodAccount* pod = nullptr;
  if (found != ids_.end()) {
    pod = &pods_.at(found->second);
  } else {
    const AccountId id = next_id_++;
    ids_.emplace(pod_key, id);
    pod = &pods_[id];
    pod->id = id;
    pod->key = pod_key;
    pod->since_ns = now;
    pod->totals.busy_until_ns = now;  // nothing of it ran before it came
    pod->history.push_back(PodSample{now, pod->totals, 0, false});
  }
  pod->retired_ns = 0;
  ++pod->tenants;
  TenantAccount& t = tenants_[slot];
  t.pod = pod;
  t.serial = next_serial_++;
  dirty_ = true;
}

void GpuAccounting::remove_tenant(SlotId slot, uint64_t now) {
  now = std::max(now, last_ns_);
  advance(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  set_state(it->second, TenantState::kIdle, now);
  PodAccount* pod = it->second.pod;
  tenants_.erase(it);
  if (--pod->tenants == 0) pod->retired_ns = now;
  dirty_ = true;
}

void GpuAccounting::granted(SlotId slot, uint64_t now) {
  now = std::max(now, last_ns_);
  advance(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  set_state(it->second, TenantState::kHolding, now);
  dirty_ = true;
}

void GpuAccounting::revoked(SlotId slot, uint64_t now) {
  now = std::max(now, last_ns_);
  advance(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end() || it->second.state != TenantState::kHolding) return;
  set_state(it->second, TenantState::kRevoking, now);
  dirty_ = true;
}

void GpuAccounting::passed_over(SlotId slot, uint64_t now) {
  now = std::max(now, last_ns_);
  advance(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  set_state(it->second, TenantState::kPassedOver, now);
  dirty_ = true;
}

void GpuAccounting::released(SlotId slot, uint64_t now) {
  now = std::max(now, last_ns_);
  advance(now);
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  // Whether it wants the GPU again the scheduler says at settle(), at this same instant.
  set_state(it->second, TenantState::kIdle, now);
  dirty_ = true;
}

void GpuAccounting::settle(const Scheduler& sched, uint64_t now) {
  now = std::max(now, last_ns_);
  advance(now);
  // Hold ends first, so a grant in the same pass sees the hold it follows as ended.
  for (int round = 0; round < 2; ++round) {
    for (auto& [slot, t] : tenants_) {
      const TenantState s = sched.state(slot);
      if (s == t.state) continue;
      const bool ends_hold = holds(t.state) && !holds(s);
      if ((round == 0) == ends_hold) set_state(t, s, now);
    }
  }
  dirty_ = true;
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
}

namespace {

int rank(Phase p) {
  switch (p) {
    case Phase::kRunning:
      return 0;
    case Phase::kDraining:
      return 1;
    case Phase::kWaiting:
      return 2;
    case Phase::kIdle:
      return 3;
  }
  return 3;
}

Phase phase_of(TenantState s) {
  if (s == TenantState::kHolding) return Phase::kRunning;
  if (draining(s)) return Phase::kDraining;
  if (s == TenantState::kWaiting) return Phase::kWaiting;
  return Phase::kIdle;
}

}  // namespace

void GpuAccounting::refresh() {
  dirty_ = false;
  for (auto& [id, pod] : pods_) {
    pod.tenants_by_state.fill(0);
    pod.phase = Phase::kIdle;
  }
  AccountId holding = kNobody;
  AccountId drainer = kNobody;
  occupied_ = false;
  for (const auto& [slot, t] : tenants_) {
    PodAccount& pod = *t.pod;
    ++pod.tenants_by_state[static_cast<size_t>(t.state)];
    const Phase p = phase_of(t.state);
    if (rank(p) < rank(pod.phase)) pod.phase = p;
    if (t.state == TenantState::kHolding) holding = pod.id;
    if (draining(t.state) && (drainer == kNobody || t.state == TenantState::kRevoking))
      drainer = pod.id;
    occupied_ = occupied_ || holds(t.state);
  }
  holder_ = holding != kNobody ? holding : drainer;
}

void GpuAccounting::advance(uint64_t now) {
  // States changed at last_ns_ hold from there on: bring the phases up to date first.
  if (dirty_) refresh();
  if (last_ns_ == 0) {
    last_ns_ = now;
    return;
  }
  if (now <= last_ns_) return;
  const uint64_t dt = now - last_ns_;
  last_ns_ = now;
  for (auto& [id, pod] : pods_) {
    if (pod.tenants == 0) continue;
    pod.totals.phase_ns[static_cast<size_t>(pod.phase)] += dt;
    if (pod.phase == Phase::kWaiting) pod.totals.waited_behind_ns[holder_] += dt;
  }
  for (auto& [slot, t] : tenants_) {
    if (holds(t.state)) t.pod->totals.held_ns += dt;
  }
  if (occupied_) held_ns_ += dt;
}

void GpuAccounting::tick(const std::map<std::string, double>& target_by_pod, uint64_t now) {
  now = std::max(now, last_ns_);
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
