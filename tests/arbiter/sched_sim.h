// A simulated GPU and tenants that behave towards the scheduler as the shim does
// (shim/README.md, "gate"): a busy tenant's launcher that finds its turn even blocks at the
// gate and sets GateChannel::want, which stays set through the grant; on a revoke the
// tenant stops submitting and releases once its queued work has drained, clearing want
// with the release unless a launcher already waits at the gate again. A
// tenant that keeps one kernel in flight (depth 1) waits for it before launching again,
// so it reaches the gate (and sets want) only just after its release; one that keeps more
// queued (depth 2) is back at the gate right after the revoke. The
// arbiter reads every channel at each pass, as sync_and_decide does. The device time-slices
// between the tenants whose work is on it (a holder, and a revoked tenant still draining),
// which is how GPU time is measured here, independently of the scheduler's own books.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "arbiter/scheduling/scheduler.h"
#include "common/clock.h"

namespace quanta::arbiter::testing {

using common::kNsPerMs;
using common::kNsPerSec;
using common::kNsPerUs;

class Sim {
 public:
  explicit Sim(SchedulerOptions o = {}) : sched(o) {}

  void add(SlotId slot, PodId pod, common::Policy policy = {}) {
    sched.set_pod_policy(pod, policy, now);
    sched.add_tenant(slot, pod, now);
    tenants_[slot] = Model{};
    tenants_[slot].pod = pod;
  }
  void remove(SlotId slot) {
    settle();
    sched.remove_tenant(slot, now);
    tenants_.erase(slot);
  }
  void policy(PodId pod, const common::Policy& p) {
    settle();
    sched.set_pod_policy(pod, p, now);
  }
  // A busy tenant always has a launch to make; while holding it keeps `queued_ns` of work
  // on the GPU (what a revoke makes it drain before it releases).
  void busy(SlotId slot, bool b = true, uint64_t queued_ns = 1 * kNsPerMs) {
    Model& m = tenants_.at(slot);
    m.busy = b;
    m.queued_ns = queued_ns;
    if (b && !m.granted && !m.draining) m.want = true;
    if (!b) m.want = false;
  }
  // How many kernels the tenant keeps queued (see the top of the file): 1 or 2.
  void depth(SlotId slot, int d) { tenants_.at(slot).early_want = d > 1; }
  // The tenant's shim rings when its queued work runs out while it holds the GPU (its device
  // thread sees that kRingDelayNs after the last kernel ends; a stopped one never rings).
  void reports_quiet(SlotId slot, bool r = true) {
    tenants_.at(slot).reports_quiet = r;
    sched.set_reports_quiet(slot, r);
  }
  // The holder stops launching: its device thread rings if it reports its quiet.
  void quiet(SlotId slot) {
    busy(slot, false);
    Model& m = tenants_.at(slot);
    if (m.reports_quiet && m.granted && !m.stopped) m.ring_at = now + kRingDelayNs;
  }
  uint64_t rings = 0;  // passes a quiet ring brought
  // Alias used by tests that only care that the tenant asks.
  void want(SlotId slot, bool w = true) { busy(slot, w, tenants_.at(slot).queued_ns); }
  // A stopped tenant neither launches nor releases (SIGSTOP); resuming releases a revoke.
  void stopped(SlotId slot, bool s = true) {
    Model& m = tenants_.at(slot);
    m.stopped = s;
    if (!s && m.draining && m.drain_left == 0 && !m.release_at)
      m.release_at = now + kReleaseDelayNs;
  }

  // One arbiter pass at `now`: events due, the channels as the arbiter reads them, decide.
  void pass() {
    settle();
    // As sync_and_decide reads each channel: want, then the release word, then the hints.
    for (auto& [slot, m] : tenants_) {
      if (m.ring_at && *m.ring_at <= now) {
        m.ring_at.reset();
        ++rings;
      }
      if (m.want_at && *m.want_at <= now) {
        m.want_at.reset();
        if (m.busy && !m.granted) m.want = true;
      }
      // The release clears want first when no launcher waits (depth 1: it is not back yet).
      if (m.release_at && *m.release_at <= now && !m.early_want) m.want = false;
      sched.set_want(slot, m.want, now);
      if (m.release_at && *m.release_at <= now) {
        m.release_at.reset();
        m.draining = false;
        sched.released(slot, now);
        if (m.busy && !m.early_want) m.want_at = now + kWantDelayNs;
      }
      if (m.granted && m.busy && !m.stopped) sched.set_activity(slot, now, m.queued_ns, now);
      if (m.granted && (!m.busy || m.stopped)) sched.set_activity(slot, m.last_launch, 0, now);
    }
    for (const Action& a : sched.decide(now)) {
      log.push_back(a);
      log_ns.push_back(now);
      Model& m = tenants_.at(a.slot);
      if (a.kind == Action::Kind::kGrant) {
        m.granted = true;
        m.last_launch = now;
        ++grants_[a.slot];
      } else if (a.kind == Action::Kind::kRevoke) {
        if (m.granted) {
          m.granted = false;
          m.draining = true;
          // What it queued drains on the device first (a stopped tenant queued nothing
          // more, and releases only when resumed).
          m.drain_left = m.busy && !m.stopped ? m.queued_ns : 0;
          if (m.drain_left == 0 && !m.stopped) m.release_at = now + kReleaseDelayNs;
          if (m.busy && m.early_want) m.want_at = now + kWantDelayNs;
        }
      }
    }
  }

  // As the arbiter's look_at_holder: a wake-up for the scheduler's deadline alone offers
  // the holder's hints to postpone_idle_check before any full pass.
  bool look_at_holder() {
    const auto h = sched.holder();
    if (!h) return false;
    const Model& m = tenants_.at(*h);
    if (!m.granted || (m.release_at && *m.release_at <= now)) return false;
    const bool working_now = m.busy && !m.stopped;
    return sched.postpone_idle_check(working_now ? now : m.last_launch,
                                     working_now ? m.queued_ns : 0, now);
  }

  // Serve each of the scheduler's deadlines at latest_deadline(), as late as the arbiter
  // may when it waits for other GPUs' deadlines, instead of at next_deadline().
  bool late_deadlines = false;

  // Runs until `until`, from event to event. A wake-up with no tenant event due, only the
  // scheduler's deadline, goes through look_at_holder first, as in the arbiter.
  void run_until(uint64_t until) {
    bool deadline_only = false;
    while (now < until) {
      if (deadline_only && look_at_holder()) {
        ++holder_looks;
      } else {
        pass();
      }
      uint64_t events = UINT64_MAX;
      const uint64_t sharing = std::max<size_t>(working().size(), 1);
      for (auto& [slot, m] : tenants_) {
        if (m.release_at && *m.release_at < events) events = *m.release_at;
        if (m.want_at && *m.want_at < events) events = *m.want_at;
        if (m.ring_at && *m.ring_at < events) events = *m.ring_at;
        if (m.drain_left != 0 && now + m.drain_left * sharing < events)
          events = now + m.drain_left * sharing;
      }
      const uint64_t d = late_deadlines ? sched.latest_deadline() : sched.next_deadline();
      uint64_t next = std::min(until, events);
      if (d != 0 && d < next) next = d;
      deadline_only = d != 0 && next == d && d < events && d < until;
      // A scheduler that keeps asking to be woken a few nanoseconds later is spinning.
      tiny_steps_ = next - now < 1000 ? tiny_steps_ + 1 : 0;
      if (tiny_steps_ > 100000) {
        std::fprintf(stderr, "sched_sim: the scheduler asks for a pass every %llu ns at %llu ns\n",
                     static_cast<unsigned long long>(next - now),
                     static_cast<unsigned long long>(now));
        std::abort();
      }
      advance(next > now ? next : now + 1);
    }
    settle();
  }
  void run_for(uint64_t ns) { run_until(now + ns); }

  // Moves the clock without a pass (work keeps running on the device).
  void advance(uint64_t to) {
    settle();
    now = to;
    settle();
  }

  // Time each tenant held a turn (granted, or revoked and not yet released): what a ceiling
  // counts, whether the tenant launched or not.
  uint64_t turn_ns(SlotId slot) {
    settle();
    auto it = turn_ns_.find(slot);
    return it == turn_ns_.end() ? 0 : it->second;
  }

  // Device time each tenant received so far.
  uint64_t held_ns(SlotId slot) {
    settle();
    auto it = gpu_ns_.find(slot);
    return it == gpu_ns_.end() ? 0 : it->second;
  }
  double share(SlotId slot) {
    settle();
    uint64_t total = 0;
    for (auto& [s, ns] : gpu_ns_) total += ns;
    return total == 0 ? 0.0 : static_cast<double>(held_ns(slot)) / static_cast<double>(total);
  }
  size_t count(Action::Kind kind, SlotId slot) const {
    size_t n = 0;
    for (const Action& a : log) n += (a.kind == kind && a.slot == slot) ? 1 : 0;
    return n;
  }
  bool granted(SlotId slot) const { return tenants_.at(slot).granted; }
  bool want_flag(SlotId slot) const { return tenants_.at(slot).want; }
  bool wants(SlotId slot) const {
    const Model& m = tenants_.at(slot);
    return m.busy && !m.granted;
  }
  // Tenants whose work is on the device now.
  std::vector<SlotId> working() const {
    std::vector<SlotId> out;
    for (const auto& [slot, m] : tenants_) {
      if ((m.granted && m.busy && !m.stopped) || m.drain_left != 0) out.push_back(slot);
    }
    return out;
  }

  Scheduler sched;
  uint64_t now = 1 * kNsPerSec;
  std::vector<Action> log;
  std::vector<uint64_t> log_ns;  // when each action was decided

 private:
  // How long after its release a busy tenant's launcher is back at the gate.
  static constexpr uint64_t kWantDelayNs = 10 * kNsPerUs;
  // How long after its queued work finished a revoked tenant's release is published.
  static constexpr uint64_t kReleaseDelayNs = 20 * kNsPerUs;
  // How long after its work ran out a quiet-reporting holder's device thread rings.
  static constexpr uint64_t kRingDelayNs = 1 * kNsPerMs;

  struct Model {
    PodId pod = 0;
    bool busy = false;
    bool stopped = false;
    bool granted = false;     // turn odd
    bool draining = false;    // revoked, queued work still on the device
    bool want = false;        // GateChannel::want
    bool early_want = false;  // depth 2: back at the gate right after a revoke
    bool reports_quiet = false;
    uint64_t queued_ns = 1 * kNsPerMs;
    uint64_t drain_left = 0;  // device time its revoked work still needs
    uint64_t last_launch = 0;
    std::optional<uint64_t> release_at;
    std::optional<uint64_t> want_at;
    std::optional<uint64_t> ring_at;  // a quiet ring's doorbell
  };

  // Device time since the last settle, split between the tenants with work on it.
  void settle() {
    if (now <= settled_) {
      settled_ = std::max(settled_, now);
      return;
    }
    const std::vector<SlotId> on = working();
    const uint64_t dt = now - settled_;
    for (auto& [slot, m] : tenants_) {
      if (m.granted || m.draining) turn_ns_[slot] += dt;
    }
    for (SlotId s : on) {
      Model& m = tenants_.at(s);
      uint64_t got = dt / on.size();
      if (m.drain_left != 0) {
        got = std::min(got, m.drain_left);
        m.drain_left -= got;
        if (m.drain_left == 0 && !m.stopped)
          m.release_at = settled_ + got * on.size() + kReleaseDelayNs;
      }
      gpu_ns_[s] += got;
    }
    for (auto& [slot, m] : tenants_) {
      if (m.granted && m.busy && !m.stopped) m.last_launch = now;
    }
    settled_ = now;
  }

  std::map<SlotId, Model> tenants_;
  std::map<SlotId, uint64_t> gpu_ns_;
  std::map<SlotId, uint64_t> turn_ns_;
  std::map<SlotId, uint64_t> grants_;
  uint64_t settled_ = 1 * kNsPerSec;
  uint64_t tiny_steps_ = 0;

 public:
  uint64_t holder_looks = 0;  // wake-ups that look_at_holder served without a pass
};

inline common::Policy weight(uint32_t w) {
  common::Policy p;
  p.weight = w;
  return p;
}

inline common::Policy priority(common::Priority pr, uint32_t w = 1) {
  common::Policy p;
  p.weight = w;
  p.priority = pr;
  return p;
}

}  // namespace quanta::arbiter::testing
