// The per-GPU scheduling policy. A pod that wants the GPU and is owed its guaranteed
// minimum comes first; then the priority classes, strictly (interactive > batch >
// best-effort: a lower class is never granted, nor kept past its quantum, while a higher
// one waits); within a class, weighted virtual time between pods and plain virtual time
// between a pod's processes, so a pod's share does not grow with its process count.
// Everything a tenant uses is charged to it: holds from grant to release, a drain beside
// a new holder and the queued work of a holder passed over after a revoke timeout (the
// GPU splits its time between the tenants on it, and so does the charge).
#include "arbiter/scheduling/scheduler.h"

#include <algorithm>
#include <tuple>

namespace quanta::arbiter {
namespace {

uint64_t sat_sub(uint64_t a, uint64_t b) {
  return a > b ? a - b : 0;
}

// No decision needs a finer clock than this; looking again sooner only burns the CPU
// (and a credit that shrinks by halves would have it look again every nanosecond).
constexpr uint64_t kRecheckGrainNs = 10'000;

// The earlier of two deadlines, where 0 is none.
uint64_t earliest(uint64_t a, uint64_t b) {
  return a == 0 ? b : b == 0 ? a : std::min(a, b);
}

uint32_t lane_of(common::Priority p) {
  return static_cast<uint32_t>(p);
}

bool is_active(TenantState s) {
  return s == TenantState::kWaiting || s == TenantState::kHolding || s == TenantState::kRevoking;
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

Scheduler::Scheduler(SchedulerOptions options)
    : options_(options), pod_clock_(3, options.lag_ns != 0 ? options.lag_ns : options.quantum_ns) {
  if (options_.lag_ns == 0) options_.lag_ns = options_.quantum_ns;
}

// ---------------------------------------------------------------------------------------
// The decision.
// ---------------------------------------------------------------------------------------

const std::vector<Action>& Scheduler::decide(uint64_t now) {
  trim(now);
  std::vector<Action>& out = decided_;
  out.assign(pending_.begin(), pending_.end());
  pending_.clear();
  account(now);
  expire_presumed(now);
  settle_overtaken(now, out);
  for (int round = 0; round < 3; ++round) {
    bool changed = false;
    if (holder_) {
      const Verdict verdict = judge_holder(now);
      if (verdict.reason != Revoke::kNone) {
        revoke_holder(verdict, now, out);
        changed = true;
      }
    }
    if (!holder_ && !closed_) {
      if (auto next = pick(now, std::nullopt)) {
        grant(*next, now);
        out.push_back({Action::Kind::kGrant, *next});
        changed = true;
      }
    }
    if (!changed) break;
  }
  const Verdict verdict = holder_ ? judge_holder(now) : Verdict{};
  const uint64_t exact = next_wakeup(now, verdict);
  const uint64_t quantum_end = verdict.quantum_end_ns;
  const uint64_t slack = quantum_end == 0 ? 0 : slack_of(tenants_[*holder_]);
  other_deadline_ns_ = earliest(exact, quantum_end);
  other_latest_ns_ = earliest(exact, quantum_end == 0 ? 0 : quantum_end + slack);
  self_end_ns_ = verdict.self_end_ns;
  idle_check_ns_ = verdict.idle_check_ns;
  next_deadline_ = earliest(other_deadline_ns_, idle_check_ns_);
  return out;
}

// Whether the holder keeps the grant. A ceiling binds even on an idle GPU; otherwise the
// holder keeps it until someone waits, and then loses it when it is idle, when the waiter
// outranks it (after the minimum hold, or at once beside its drain for an interactive
// waiter), or at its quantum's end for a waiter of its own rank. A waiter of a lower rank
// only ever gets an idle GPU.
Scheduler::Verdict Scheduler::judge_holder(uint64_t now) const {
  Verdict v;
  auto recheck = [&](uint64_t t) {
    t = std::max(t, now + kRecheckGrainNs);
    if (v.recheck_ns == 0 || t < v.recheck_ns) v.recheck_ns = t;
  };
  auto idle_check = [&](uint64_t t) {
    t = std::max(t, now + kRecheckGrainNs);
    if (v.idle_check_ns == 0 || t < v.idle_check_ns) v.idle_check_ns = t;
  };
  const Tenant& h = tenants_[*holder_];
  const Pod& hp = pods_[h.pod];
  const std::optional<SlotId> next = pick(now, *holder_);

  if (h.state == TenantState::kRevoking) {
    // Revoked for a batch waiter at its quantum's end; an interactive waiter need not
    // wait for the drain (unless the GPU is being drained).
    if (next && !closed_ && options_.drain_overlap && !overtaken_ &&
        pods_[tenants_[*next].pod].policy.priority == common::Priority::kInteractive &&
        hp.policy.priority != common::Priority::kInteractive) {
      v.reason = Revoke::kOutranked;
      v.overlap = true;
    }
    return v;
  }
  if (h.state != TenantState::kHolding) return v;

  if (closed_) {
    v.reason = Revoke::kClosing;
    return v;
  }
  const uint64_t idle_at = last_work_ns(h) + std::max(h.inflight_ns, options_.idle_release_ns);
  if (hp.policy.max_share_ppm < common::kShareScale) {
    const uint64_t used = hp.usage.used(sat_sub(now, options_.share_window_ns), now);
    const uint64_t budget = budget_ns(hp);
    if (used >= budget || hp.pacing.balance() <= 0) {
      v.reason = Revoke::kCeiling;
      return v;
    }
    recheck(now + std::min(budget - used, hp.pacing.credit()));
    // A hold is charged whether or not the holder launches, so a capped pod that goes
    // idle gives the grant back even with nobody waiting: its ceiling is for its work.
    if (idle_holder(h, now)) {
      v.reason = Revoke::kIdle;
      return v;
    }
    idle_check(idle_at > now ? idle_at : now + options_.idle_release_ns);
  }
  if (!next) return v;
  if (idle_holder(h, now)) {
    v.reason = Revoke::kIdle;
    return v;
  }
  const Rank mine = rank_of(h, now);
  const Rank theirs = rank_of(tenants_[*next], now);
  if (theirs < mine) {
    const bool interactive = !theirs.owed() && theirs.priority == common::Priority::kInteractive;
    if (interactive && options_.drain_overlap && !overtaken_) {
      v.reason = Revoke::kOutranked;
      v.overlap = true;
      return v;
    }
    const uint64_t hold_end = h.grant_ns + options_.quantum_min_ns;
    if (now >= hold_end) {
      v.reason = Revoke::kOutranked;
      return v;
    }
    recheck(hold_end);
  } else if (theirs == mine) {
    // A holder that ends its own quantum is revoked at its end only by a pass that falls
    // there anyway; the wake-up the arbiter keeps for it is the backstop.
    if (now >= h.quantum_end_ns) {
      v.reason = Revoke::kQuantumEnd;
      return v;
    }
    v.quantum_end_ns = std::max(h.quantum_end_ns, now + kRecheckGrainNs);
    if (h.ends_own_quantum) {
      v.self_end_ns = h.quantum_end_ns;
      v.quantum_end_ns = h.quantum_end_ns + backstop_of(h);
    }
  }
  // An owed holder's rank drops when its credit is spent (never sooner than this).
  if (mine.owed()) recheck(now + std::max<uint64_t>(hp.credit.credit(), 1));
  // The tenant's hints move without events: look again when they would call it idle.
  if (looks_for_idleness(h))
    idle_check(idle_look_ns(h, now, earliest(v.recheck_ns, v.quantum_end_ns)));
  return v;
}

void Scheduler::revoke_holder(const Verdict& v, uint64_t now, std::vector<Action>& out) {
  Tenant& h = tenants_[*holder_];
  if (h.state == TenantState::kHolding) {
    set_state(h, TenantState::kRevoking, now);
    h.revoke_ns = now;
    h.revoked_busy = v.reason != Revoke::kIdle;
    out.push_back({Action::Kind::kRevoke, h.slot});
  }
  if (v.overlap) {
    overtaken_ = holder_;
    holder_.reset();
  }
}

// The best waiter: owed pods first (the most owed first, whatever their class: each has a
// guarantee), then by class, then the pod's virtual time; then the process's virtual time
// within the pod, then who waited longest.
std::optional<SlotId> Scheduler::pick(uint64_t now, std::optional<SlotId> excluding) const {
  std::optional<SlotId> best;
  std::tuple<Rank, uint64_t, uint64_t, uint64_t, SlotId> best_key{};
  for (SlotId s : present_) {
    if (s == excluding) continue;
    const Tenant& t = tenants_[s];
    if (!eligible(t, now)) continue;
    const Pod& p = pods_[t.pod];
    // While an overtaken holder drains, only interactive tenants may run beside it.
    if (overtaken_ && p.policy.priority != common::Priority::kInteractive) continue;
    const Rank rank = rank_of(t, now);
    const uint64_t order = rank.owed() ? UINT64_MAX - p.credit.credit() : pod_clock_.vtime(t.pod);
    auto key = std::make_tuple(rank, order, p.procs.vtime(s), t.wait_since_ns, s);
    if (!best || key < best_key) {
      best = s;
      best_key = key;
    }
  }
  return best;
}

void Scheduler::grant(SlotId slot, uint64_t now) {
  Tenant& t = tenants_[slot];
  Pod& p = pods_[t.pod];
  t.owed_grant = owed(p);
  t.presumed_until_ns = 0;
  set_state(t, TenantState::kHolding, now);
  t.grant_ns = now;
  t.quantum_end_ns = now + quantum_of(t);
  t.last_active_ns = now;
  t.granted_while_others_wait = waiting_ != 0;
  ++t.grants;
  record_wait(t, sat_sub(now, t.wait_since_ns));
  holder_ = slot;
}

// When decide() must look again without an event.
uint64_t Scheduler::next_wakeup(uint64_t now, const Verdict& v) const {
  uint64_t next = 0;
  auto at = [&](uint64_t t) {
    if (t == 0) return;
    t = std::max(t, now + kRecheckGrainNs);
    if (next == 0 || t < next) next = t;
  };
  at(v.recheck_ns);
  if (holder_ && tenants_[*holder_].state == TenantState::kRevoking)
    at(tenants_[*holder_].revoke_ns + options_.revoke_timeout_ns);
  if (overtaken_) at(tenants_[*overtaken_].revoke_ns + options_.revoke_timeout_ns);
  const uint64_t charge_for =
      std::max(options_.share_window_ns * 10, options_.revoke_timeout_ns * 4);
  for (SlotId s : unreleased_) {
    const uint64_t end = tenants_[s].passed_over_ns + charge_for;
    if (end > now) at(end);
  }
  // Pods held back by their ceiling, pods about to be owed their minimum, tenants whose
  // presumed want lapses.
  for (SlotId s : present_) {
    const Tenant& t = tenants_[s];
    if (t.presumed_until_ns != 0) at(t.presumed_until_ns);
    if (t.state != TenantState::kWaiting) continue;
    const Pod& p = pods_[t.pod];
    if (throttled(p, now)) {
      at(eligible_at(p, now));
    } else if (p.credit.rate_ppm() != 0 && !owed(p)) {
      at(now + p.credit.time_to(owed_threshold(p)));
    }
  }
  return next;
}

// An idle check that falls before the other deadlines is due exactly; one at or after them
// is served by the pass they bring, late or not, like the quantum's end it waits for.
uint64_t Scheduler::latest_deadline() const {
  if (next_deadline_ == 0) return 0;
  if (idle_check_ns_ != 0 && (other_deadline_ns_ == 0 || idle_check_ns_ < other_deadline_ns_))
    return idle_check_ns_;
  return other_latest_ns_;
}

bool Scheduler::postpone_idle_check(uint64_t last_launch_ns, uint64_t inflight_ns, uint64_t now) {
  if (!holder_ || idle_check_ns_ == 0 || now < idle_check_ns_) return false;
  if (other_deadline_ns_ != 0 && other_deadline_ns_ <= now) return false;
  Tenant& h = tenants_[*holder_];
  if (h.state != TenantState::kHolding) return false;
  set_activity(h.slot, last_launch_ns, inflight_ns, now);
  if (idle_holder(h, now)) return false;
  if (!looks_for_idleness(h)) {  // busy, and it rings once its work runs out
    idle_check_ns_ = 0;
    next_deadline_ = other_deadline_ns_;
    return true;
  }
  // As judge_holder would set it now: nothing it reads but these hints and the time moved.
  idle_check_ns_ = std::max(idle_look_ns(h, now, other_deadline_ns_), now + kRecheckGrainNs);
  next_deadline_ = earliest(other_deadline_ns_, idle_check_ns_);
  return true;
}

// ---------------------------------------------------------------------------------------
// The books: charges, credits, floors.
// ---------------------------------------------------------------------------------------

bool Scheduler::on_gpu(const Tenant& t) const {
  if (holder_ == t.slot || overtaken_ == t.slot) {
    return t.state == TenantState::kHolding || t.state == TenantState::kRevoking;
  }
  return false;
}

// Charges every tenant on the GPU for the time since the last pass. A stretch shared by n
// tenants (a holder and the drain it overtook, or the queued work of one passed over)
// costs each 1/n of it: the device time-slices between them.
void Scheduler::account(uint64_t now) {
  if (now <= accounted_ns_) return;
  const uint64_t from = accounted_ns_;
  accounted_ns_ = now;
  for (Pod& p : pods_) {
    if (!p.present) continue;
    if (p.credit.rate_ppm() != 0) p.credit.settle(now, p.earning);
    if (p.pacing.rate_ppm() != 0) p.pacing.settle(now, true);
  }
  if (from != 0) charge_on_gpu(from, now);
  // The floors follow the pods (and processes) that compete by virtual time now. Pods held
  // back by their own ceiling do not compete, bank no credit for it and earn no minimum.
  for (PodId id = 0; id < pods_.size(); ++id) {
    Pod& p = pods_[id];
    if (!p.present) continue;
    const bool active = p.active_tenants != 0;
    const bool held_back = active && throttled(p, now);
    pod_clock_.set_contending(id, active && !held_back);
    // A minimum is never above the ceiling, so the ceiling never keeps the pod from being
    // owed: it earns while it wants the GPU, held back or not.
    p.earning = active;
    if (!p.members.empty()) {
      for (SlotId s : p.members) p.procs.set_contending(s, is_active(tenants_[s].state));
      p.procs.settle_floors();
    }
  }
  pod_clock_.settle_floors();
  for (PodId id = 0; id < pods_.size(); ++id) {
    if (pods_[id].present && pods_[id].active_tenants != 0 && !pod_clock_.contending(id))
      pod_clock_.lift(id);
  }
  if (active_interactive() != 0) interactive_seen_ns_ = now;
}

void Scheduler::charge_on_gpu(uint64_t from, uint64_t now) {
  const uint64_t charge_for =
      std::max(options_.share_window_ns * 10, options_.revoke_timeout_ns * 4);
  struct Piece {
    SlotId slot;
    uint64_t end;
  };
  Piece pieces[3 + common::kMaxSlotsPerGpu];
  uint32_t count = 0;
  if (holder_ && on_gpu(tenants_[*holder_])) pieces[count++] = {*holder_, now};
  if (overtaken_ && on_gpu(tenants_[*overtaken_])) pieces[count++] = {*overtaken_, now};
  for (SlotId s : unreleased_) {
    const uint64_t end = std::min(now, tenants_[s].passed_over_ns + charge_for);
    if (end > from) pieces[count++] = {s, end};
  }
  for (uint32_t i = 0; i < count; ++i) {
    Tenant& t = tenants_[pieces[i].slot];
    Pod& p = pods_[t.pod];
    const uint64_t share = (pieces[i].end - from) / count;
    t.holds.add(from, pieces[i].end, count);
    p.usage.add(from, pieces[i].end, count);
    if (p.pacing.rate_ppm() != 0) p.pacing.spend(share);
    // Time on a guaranteed minimum (its drain included) is outside the weighted order: it
    // spends the credit, not virtual time, so weights divide only what the minimums leave.
    if (t.owed_grant) {
      // Past the credit (the rest of the hold, the drain) it runs into a debt, earned back
      // before the pod is owed again: what it gets on the claim is its minimum, no more.
      p.credit.spend(share);
    } else {
      pod_clock_.charge(t.pod, share);
    }
    p.procs.charge(t.slot, share);
  }
}

void Scheduler::settle_overtaken(uint64_t now, std::vector<Action>& out) {
  auto pass_over = [&](Tenant& t) {
    set_state(t, TenantState::kPassedOver, now);
    t.passed_over_ns = now;
    ++t.pass_overs;
    unreleased_.push_back(t.slot);
    out.push_back({Action::Kind::kPassOver, t.slot});
  };
  if (overtaken_) {
    Tenant& d = tenants_[*overtaken_];
    if (now >= d.revoke_ns + options_.revoke_timeout_ns) {
      overtaken_.reset();
      pass_over(d);
    }
  }
  if (holder_) {
    Tenant& h = tenants_[*holder_];
    if (h.state == TenantState::kRevoking && now >= h.revoke_ns + options_.revoke_timeout_ns) {
      holder_.reset();
      pass_over(h);
    }
  }
}

Scheduler::Rank Scheduler::rank_of(const Tenant& t, uint64_t now) const {
  (void)now;
  const Pod& p = pods_[t.pod];
  const bool holding = holder_ == t.slot && t.state == TenantState::kHolding;
  const bool claim = holding ? t.owed_grant && p.credit.credit() > 0 : owed(p);
  // Guarantees rank alike whatever the class: an owed pod is not kept from its minimum by
  // another pod's minimum of a higher class.
  return Rank{!claim, claim ? common::Priority::kInteractive : p.policy.priority};
}

uint64_t Scheduler::owed_threshold(const Pod& p) const {
  const uint64_t quantum = p.policy.quantum_ns != 0 ? p.policy.quantum_ns : options_.quantum_ns;
  return std::max<uint64_t>(1,
                            p.credit.rate_ppm() != 0 ? std::min(quantum, p.credit.cap()) : quantum);
}

bool Scheduler::owed(const Pod& p) const {
  return p.credit.rate_ppm() != 0 && p.credit.credit() >= owed_threshold(p);
}

uint64_t Scheduler::budget_ns(const Pod& pod) const {
  return options_.share_window_ns / common::kShareScale * pod.policy.max_share_ppm +
         options_.share_window_ns % common::kShareScale * pod.policy.max_share_ppm /
             common::kShareScale;
}

// A pod at its ceiling waits until at least a minimal grant fits under it, so it is not
// granted slivers of a few microseconds.
// ...and, paced, until its bucket holds a quantum, so its holds are quanta, not slivers
// that each cost a switch and a drain.
bool Scheduler::throttled(const Pod& pod, uint64_t now) const {
  if (pod.policy.max_share_ppm >= common::kShareScale) return false;
  const uint64_t budget = budget_ns(pod);
  const uint64_t min_grant = std::min(options_.quantum_min_ns, budget / 2);
  return pod.usage.used(sat_sub(now, options_.share_window_ns), now) + min_grant > budget ||
         pod.pacing.balance() < static_cast<int64_t>(pacing_threshold(pod));
}

uint64_t Scheduler::eligible_at(const Pod& pod, uint64_t now) const {
  const uint64_t budget = budget_ns(pod);
  const uint64_t min_grant = std::min(options_.quantum_min_ns, budget / 2);
  return std::max(pod.usage.drops_to(budget - min_grant, now, options_.share_window_ns),
                  now + pod.pacing.time_to(pacing_threshold(pod)));
}

uint64_t Scheduler::pacing_threshold(const Pod& pod) const {
  return std::min(owed_threshold(pod), pod.pacing.cap() / 2);
}

bool Scheduler::eligible(const Tenant& t, uint64_t now) const {
  return t.state == TenantState::kWaiting && !throttled(pods_[t.pod], now);
}

// The holder's last sign of work: its grant, its last launch, or the moment its queued work
// was seen to end. idle_release counts from the latest, so a process that waits for each
// kernel before it launches the next is not idle while it reacts to a completion (on a
// loaded node that takes milliseconds), however long its kernels ran.
uint64_t Scheduler::last_work_ns(const Tenant& h) {
  return std::max({h.grant_ns, h.last_launch_ns, h.work_done_ns});
}

bool Scheduler::idle_holder(const Tenant& h, uint64_t now) const {
  return h.inflight_ns == 0 && now >= last_work_ns(h) + options_.idle_release_ns;
}

// A holder that reports its quiet is looked at only while it has no queued work published;
// a capped pod's holder is always looked at (its idleness ends the grant with nobody waiting,
// when its shim does not ring).
bool Scheduler::looks_for_idleness(const Tenant& h) const {
  return !h.reports_quiet || h.inflight_ns == 0 ||
         pods_[h.pod].policy.max_share_ppm < common::kShareScale;
}

// A holder granted while others waited whose shim rings if that grant goes unused, and
// which has shown no work since the grant (no launch, no queued work, none seen to end).
bool Scheduler::rings_if_unused(const Tenant& h) const {
  return h.reports_unused_grant && h.granted_while_others_wait && h.inflight_ns == 0 &&
         h.last_launch_ns < h.grant_ns && h.work_done_ns <= h.grant_ns;
}

// When to look at the holder for idleness: when its hints would call it idle, or, for a
// fresh grant its shim rings about (rings_if_unused), no sooner than `recheck_ns` (the
// holder's other deadline; its quantum's end when it has none), so the look shares that
// wake-up instead of costing one of its own at every switch.
uint64_t Scheduler::idle_look_ns(const Tenant& h, uint64_t now, uint64_t recheck_ns) const {
  const uint64_t idle_at = last_work_ns(h) + std::max(h.inflight_ns, options_.idle_release_ns);
  const uint64_t look = idle_at > now ? idle_at : now + options_.idle_release_ns;
  if (!rings_if_unused(h)) return look;
  return std::max(look, recheck_ns != 0 ? recheck_ns : h.quantum_end_ns);
}

uint32_t Scheduler::active_interactive() const {
  uint32_t n = 0;
  for (const Pod& p : pods_) {
    if (p.present && p.policy.priority == common::Priority::kInteractive) n += p.active_tenants;
  }
  return n;
}

bool Scheduler::interactive_recent(uint64_t now) const {
  // "Active" reaches back one share window: interactive tenants idle between requests.
  return interactive_seen_ns_ != 0 && interactive_seen_ns_ + options_.share_window_ns >= now;
}

void Scheduler::set_state(Tenant& t, TenantState state, uint64_t now) {
  const bool was = is_active(t.state);
  if (t.state == TenantState::kWaiting) --waiting_;
  t.state = state;
  if (t.state == TenantState::kWaiting) ++waiting_;
  const bool is = is_active(t.state);
  if (was == is) return;
  Pod& pod = pods_[t.pod];
  const bool pod_was_active = pod.active_tenants != 0;
  if (is) {
    ++pod.active_tenants;
    ++active_count_;
  } else {
    --pod.active_tenants;
    --active_count_;
    t.last_active_ns = now;
  }
  if (pod.policy.priority == common::Priority::kInteractive) interactive_seen_ns_ = now;
  pod_activity_changed(pod, t.pod, pod_was_active, now);
}

// A pod that wakes is lifted to its class's floor less the lag: idle time banks at most
// one quantum of credit. Its minimum earns only while it wants the GPU.
void Scheduler::pod_activity_changed(Pod& pod, PodId id, bool was_active, uint64_t now) {
  const bool active = pod.active_tenants != 0;
  if (active == was_active) return;
  if (pod.credit.rate_ppm() != 0) pod.credit.settle(now, pod.earning);
  pod.earning = active;
  if (active) {
    pod_clock_.lift(id);
    // A guarantee is for a pod that wants the GPU: credit left from before a long absence
    // is not kept (a short pause between requests keeps it).
    if (pod.last_active_ns != 0 && now > pod.last_active_ns + options_.share_window_ns)
      pod.credit.reset();
  } else {
    pod.last_active_ns = now;
  }
}

// A tenant revoked while busy still has work to launch: its launcher was waiting for the
// drain (or launches from a thread that had nothing queued at the gate) and sets want only
// once it is back at the gate, just after this release. Read as idle meanwhile, the next
// waiter would be granted whatever the weights say, so it counts as wanting for
// idle_release; if no launch comes by then it goes idle. One whose want was read with the
// release (its launcher already waits at the gate) needs no presumption, nor the wake-up
// that would end it.
void Scheduler::after_release(Tenant& t, uint64_t now) {
  t.presumed_until_ns = t.revoked_busy && !t.want ? now + options_.idle_release_ns : 0;
  t.revoked_busy = false;
  const bool waits = t.want || t.presumed_until_ns != 0;
  set_state(t, waits ? TenantState::kWaiting : TenantState::kIdle, now);
  t.owed_grant = false;
  if (waits) t.wait_since_ns = now;
}

void Scheduler::expire_presumed(uint64_t now) {
  for (SlotId s : present_) {
    Tenant& t = tenants_[s];
    if (t.presumed_until_ns == 0 || now < t.presumed_until_ns) continue;
    t.presumed_until_ns = 0;
    if (t.state == TenantState::kWaiting && !t.want) set_state(t, TenantState::kIdle, now);
  }
}

void Scheduler::record_wait(Tenant& t, uint64_t waited) {
  t.waits[t.wait_count % t.waits.size()] = waited;
  ++t.wait_count;
}

void Scheduler::trim(uint64_t now) {
  // Stretches older than the windows add nothing to the sums, so a few trims per window
  // bound the memory without a walk over every tenant per pass.
  if (now < next_trim_ns_) return;
  next_trim_ns_ = now + std::min(options_.share_window_ns, options_.stats_window_ns) / 8;
  for (Pod& p : pods_) p.usage.trim(sat_sub(now, options_.share_window_ns));
  for (SlotId s : present_) tenants_[s].holds.trim(sat_sub(now, options_.stats_window_ns));
}

Scheduler::Pod& Scheduler::pod_entry(PodId id) {
  if (id >= pods_.size()) pods_.resize(static_cast<size_t>(id) + 1);
  return pods_[id];
}

// ---------------------------------------------------------------------------------------
// Events.
// ---------------------------------------------------------------------------------------

void Scheduler::set_pod_policy(PodId id, const common::Policy& policy, uint64_t now) {
  // What was used until now is charged at the old policy (weight, ceiling bucket).
  if (now != 0) account(now);
  Pod& p = pod_entry(id);
  common::Policy next = policy;
  next.weight = std::max(next.weight, common::kMinWeight);
  if (!p.present) {
    p.present = true;
    p.policy = next;
    p.procs = VirtualClock(1, options_.lag_ns);
    pod_clock_.join(id, lane_of(next.priority), next.weight);
  } else {
    if (next.weight != p.policy.weight) pod_clock_.set_weight(id, next.weight);
    if (next.priority != p.policy.priority) pod_clock_.set_lane(id, lane_of(next.priority));
    p.policy = next;
  }
  const uint64_t window = options_.share_window_ns;
  p.credit.configure(next.min_share_ppm,
                     window / common::kShareScale * next.min_share_ppm +
                         window % common::kShareScale * next.min_share_ppm / common::kShareScale);
  const bool was_capped = p.pacing.rate_ppm() != 0;
  // The bucket covers a couple of stretched quanta and drains, so a capped pod that waits
  // its turn behind others does not overflow it and lose its share.
  p.pacing.configure(next.max_share_ppm < common::kShareScale ? next.max_share_ppm : 0,
                     2 * (options_.quantum_max_ns + options_.quantum_ns));
  if (!was_capped && p.pacing.rate_ppm() != 0) {  // newly capped: a full bucket from now
    p.pacing.fill();
    p.pacing.settle(accounted_ns_, false);
  }
}

void Scheduler::add_tenant(SlotId slot, PodId pod, uint64_t now) {
  if (has_tenant(slot)) remove_tenant(slot, now);
  if (pod >= pods_.size() || !pods_[pod].present) set_pod_policy(pod, common::Policy{});
  if (slot >= tenants_.size()) tenants_.resize(static_cast<size_t>(slot) + 1);
  Tenant& t = tenants_[slot];
  t = Tenant{};
  t.present = true;
  t.slot = slot;
  t.pod = pod;
  t.arrived_ns = now;
  t.last_active_ns = now;
  Pod& home = pods_[pod];
  // Level with the pod's other processes: a newcomer neither starves nor floods them.
  home.procs.join(slot, 0, 1);
  home.members.push_back(slot);
  present_.push_back(slot);
}

bool Scheduler::adopt_holder(SlotId slot, uint64_t now) {
  if (!has_tenant(slot) || holder_) return false;
  account(now);
  Tenant& t = tenants_[slot];
  set_state(t, TenantState::kHolding, now);
  t.grant_ns = now;
  t.quantum_end_ns = now + quantum_of(t);
  t.granted_while_others_wait = false;
  holder_ = slot;
  return true;
}

void Scheduler::remove_tenant(SlotId slot, uint64_t now) {
  if (!has_tenant(slot)) return;
  account(now);
  Tenant& t = tenants_[slot];
  if (holder_ == slot) holder_.reset();
  if (overtaken_ == slot) overtaken_.reset();
  unreleased_.erase(std::remove(unreleased_.begin(), unreleased_.end(), slot), unreleased_.end());
  set_state(t, TenantState::kIdle, now);
  Pod& pod = pods_[t.pod];
  pod.members.erase(std::remove(pod.members.begin(), pod.members.end(), slot), pod.members.end());
  pod.procs.leave(slot);
  present_.erase(std::remove(present_.begin(), present_.end(), slot), present_.end());
  t = Tenant{};
}

void Scheduler::forget_pod(PodId id) {
  if (id >= pods_.size() || !pods_[id].present || !pods_[id].members.empty()) return;
  pod_clock_.leave(id);
  pods_[id] = Pod{};
}

bool Scheduler::set_want(SlotId slot, bool want, uint64_t now) {
  if (!has_tenant(slot)) return false;
  Tenant& t = tenants_[slot];
  t.want = want;
  if (want && t.state == TenantState::kIdle) {
    // Floors first (without the waker), then the lift: against the pod's process floor
    // (its least-served contending process, never lowered) and, when the pod wakes too,
    // its class's floor, so tenants waking together do not stack one lag of credit each.
    account(now);
    pods_[t.pod].procs.lift(slot);
    set_state(t, TenantState::kWaiting, now);
    t.wait_since_ns = now;
    t.last_active_ns = now;
    return true;
  }
  if (want) t.presumed_until_ns = 0;  // it asked: no need to presume
  if (!want && t.state == TenantState::kWaiting && t.presumed_until_ns == 0) {
    account(now);
    set_state(t, TenantState::kIdle, now);
  }
  return false;
}

void Scheduler::set_reports_quiet(SlotId slot, bool reports_quiet) {
  if (has_tenant(slot)) tenants_[slot].reports_quiet = reports_quiet;
}

void Scheduler::set_reports_unused_grant(SlotId slot, bool reports_unused_grant) {
  if (has_tenant(slot)) tenants_[slot].reports_unused_grant = reports_unused_grant;
}

void Scheduler::set_ends_own_quantum(SlotId slot, bool ends_own_quantum) {
  if (has_tenant(slot)) tenants_[slot].ends_own_quantum = ends_own_quantum;
}

void Scheduler::set_activity(SlotId slot, uint64_t last_launch_ns, uint64_t inflight_ns,
                             uint64_t now) {
  if (!has_tenant(slot)) return;
  // A launch "in the future" is garbage or clock skew: read it as "just now" (busy).
  Tenant& t = tenants_[slot];
  t.last_launch_ns = std::min(last_launch_ns, now);
  if (t.inflight_ns != 0 && inflight_ns == 0) t.work_done_ns = now;
  t.inflight_ns = inflight_ns;
}

void Scheduler::released(SlotId slot, uint64_t now) {
  if (!has_tenant(slot)) return;
  Tenant& t = tenants_[slot];
  switch (t.state) {
    case TenantState::kHolding:  // voluntary give-back of an odd turn: close the turn too
      account(now);
      // Past its quantum's end, a holder that ends its own quantum drained from that end:
      // measured like a revoke's drain (it sets the backstop and stretches the quantum).
      if (t.ends_own_quantum && t.quantum_end_ns != 0 && now >= t.quantum_end_ns) {
        const uint64_t drain = now - t.quantum_end_ns;
        t.drain_ns = t.drain_ns == 0 ? drain : (t.drain_ns * 3 + drain) / 4;
      }
      holder_.reset();
      pending_.push_back({Action::Kind::kRevoke, slot});
      after_release(t, now);
      break;
    case TenantState::kRevoking: {
      account(now);
      // How long its drains take, by this clock: what stretches its quantum and tells the
      // arbiter whether to spin for the release. Its own estimate never counts.
      const uint64_t drain = sat_sub(now, t.revoke_ns);
      t.drain_ns = t.drain_ns == 0 ? drain : (t.drain_ns * 3 + drain) / 4;
      if (holder_ == slot) holder_.reset();
      if (overtaken_ == slot) overtaken_.reset();
      after_release(t, now);
      break;
    }
    case TenantState::kPassedOver:
      account(now);
      unreleased_.erase(std::remove(unreleased_.begin(), unreleased_.end(), slot),
                        unreleased_.end());
      after_release(t, now);
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------
// Queries.
// ---------------------------------------------------------------------------------------

bool Scheduler::idle() const {
  return !holder_ && !overtaken_ && unreleased_.empty();
}

TenantState Scheduler::state(SlotId slot) const {
  return has_tenant(slot) ? tenants_[slot].state : TenantState::kIdle;
}

uint64_t Scheduler::quantum_for(SlotId slot) const {
  if (!has_tenant(slot)) {
    return std::clamp(options_.quantum_ns, options_.quantum_min_ns, options_.quantum_max_ns);
  }
  return quantum_of(tenants_[slot]);
}

uint64_t Scheduler::quantum_of(const Tenant& t) const {
  const Pod& p = pods_[t.pod];
  uint64_t q = options_.quantum_ns;
  if (p.policy.quantum_ns != 0) {
    q = p.policy.quantum_ns;
  } else {
    const uint64_t stretch = t.drain_ns * kKernelsPerQuantum;
    const uint64_t round_cap = options_.share_window_ns / std::max<uint64_t>(active_count_, 1);
    q = std::max(q, std::min(stretch, round_cap));
  }
  return std::clamp(q, options_.quantum_min_ns, options_.quantum_max_ns);
}

uint64_t Scheduler::slack_of(const Tenant& t) const {
  return quantum_of(t) / 1000 * options_.quantum_slack_ppm / 1000;
}

// Long enough for the holder's device thread to wake at the end on a busy node and drain
// what it queued (twice its measured drains, so an ordinary slow one does not bring the
// revoke), never more than a quantum.
uint64_t Scheduler::backstop_of(const Tenant& t) const {
  const uint64_t wake = std::max(slack_of(t), options_.quantum_min_ns);
  return std::min(wake + 2 * t.drain_ns, std::max(wake, quantum_of(t)));
}

uint64_t Scheduler::inflight_limit_for(SlotId slot, uint64_t now) const {
  if (!has_tenant(slot)) return options_.quantum_ns;
  const Tenant& t = tenants_[slot];
  if (pods_[t.pod].policy.priority != common::Priority::kInteractive && interactive_recent(now)) {
    return options_.quantum_min_ns;
  }
  return quantum_of(t);
}

uint64_t Scheduler::expected_drain_ns(SlotId slot) const {
  return has_tenant(slot) ? tenants_[slot].drain_ns : 0;
}

namespace {

// What each pod is promised: its minimum first (up to its ceiling), then what is left,
// class by class, divided by weight up to each pod's ceiling.
struct Claim {
  uint32_t weight;
  common::Priority priority;
  double min;
  double max;
};

std::vector<double> promised_shares(const std::vector<Claim>& claims) {
  std::vector<double> share(claims.size(), 0.0);
  double left = 1.0;
  for (size_t i = 0; i < claims.size(); ++i) {
    share[i] = std::min(claims[i].min, claims[i].max);
    left -= share[i];
  }
  for (auto cls :
       {common::Priority::kInteractive, common::Priority::kBatch, common::Priority::kBestEffort}) {
    std::vector<size_t> open;
    for (size_t i = 0; i < claims.size(); ++i) {
      if (claims[i].priority == cls && share[i] < claims[i].max) open.push_back(i);
    }
    while (left > 1e-12 && !open.empty()) {
      double weights = 0;
      for (size_t i : open) weights += claims[i].weight;
      // Pods that would pass their ceiling take only up to it; the rest share again.
      std::vector<size_t> still;
      double given = 0;
      bool capped = false;
      for (size_t i : open) {
        if (share[i] + left * claims[i].weight / weights >= claims[i].max) {
          given += claims[i].max - share[i];
          share[i] = claims[i].max;
          capped = true;
        } else {
          still.push_back(i);
        }
      }
      if (!capped) {
        for (size_t i : open) share[i] += left * claims[i].weight / weights;
        left = 0;
        break;
      }
      left -= given;
      open = std::move(still);
    }
  }
  return share;
}

}  // namespace

std::vector<TenantReport> Scheduler::report(uint64_t now) const {
  const uint64_t window = options_.stats_window_ns;
  const uint64_t from = sat_sub(now, window);
  auto recently_active = [&](const Tenant& t) {
    return is_active(t.state) || t.last_active_ns + window >= now;
  };
  // Targets among the pods that used or wanted the GPU recently.
  std::vector<uint32_t> procs(pods_.size(), 0);
  for (SlotId s : present_) {
    if (recently_active(tenants_[s])) ++procs[tenants_[s].pod];
  }
  std::vector<Claim> claims;
  std::vector<PodId> claim_pod;
  for (PodId id = 0; id < pods_.size(); ++id) {
    if (procs[id] == 0) continue;
    const common::Policy& pol = pods_[id].policy;
    claims.push_back({pol.weight, pol.priority,
                      pol.min_share_ppm / static_cast<double>(common::kShareScale),
                      pol.max_share_ppm / static_cast<double>(common::kShareScale)});
    claim_pod.push_back(id);
  }
  const std::vector<double> shares = promised_shares(claims);
  std::vector<double> pod_share(pods_.size(), 0.0);
  for (size_t i = 0; i < shares.size(); ++i) pod_share[claim_pod[i]] = shares[i];

  std::vector<TenantReport> out;
  for (SlotId s : present_) {
    const Tenant& t = tenants_[s];
    TenantReport r{};
    r.slot = s;
    r.pod = t.pod;
    r.state = t.state;
    r.quantum_ns = quantum_of(t);
    r.grants = t.grants;
    r.pass_overs = t.pass_overs;
    if (recently_active(t)) r.target_share = pod_share[t.pod] / procs[t.pod];
    const uint64_t span = std::min(window, sat_sub(now, t.arrived_ns));
    const uint64_t held = t.holds.used(from, now);
    r.achieved_share = span == 0 ? 0.0 : static_cast<double>(held) / static_cast<double>(span);
    std::vector<uint64_t> waits(t.waits.begin(),
                                t.waits.begin() + std::min<size_t>(t.wait_count, t.waits.size()));
    if (t.state == TenantState::kWaiting) waits.push_back(sat_sub(now, t.wait_since_ns));
    if (!waits.empty()) {
      std::sort(waits.begin(), waits.end());
      const size_t idx = (waits.size() * 99 + 99) / 100;
      r.wait_p99_ns = waits[std::min(waits.size(), idx) - 1];
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace quanta::arbiter
