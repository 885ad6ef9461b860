// Fairness under churn as a property: seeded, reproducible random runs of pods arriving,
// sleeping, waking, leaving and changing policy (every class, weights, max-share and
// min-share), with tenants that handle want as the shim does (sched_sim.h). After every
// event and every 100 ms the run checks two promises against GPU time measured by the
// simulated device, not by the scheduler's books:
//  - wait: a pod that wants the GPU and is entitled to some of it (it is promised a share
//    now and is not at its own ceiling) is served within a bound set by the weights of its
//    competitors and the part of the GPU left to its class:
//        (1 + sum of the other active pods' weights / its weight + active pods)
//          x (quantum_max + longest drain) / (1 - minimums - higher classes' ceilings)
//    (+ the refill of its own ceiling's bucket when it is capped), the largest such bound
//    since it began to wait;
//  - share: over every share window during which nothing changed (nor in the window
//    before it: ceilings and credits look back that far), each active pod is within
//        (quantum_max + quantum + longest drain) / window + 1 point
//    of what it is promised (the minimums first, then what is left divided by class and
//    weight up to each ceiling): GPU time comes in holds of up to a stretched quantum and a
//    drain, so one window may hold one hold more or less than the average. It also gets at
//    least its minimum less (quantum + longest drain) / window + 1 point.
// Both hold again with every deadline served as late as it may be (a quantum's end at the
// end of its slack, as when the arbiter waits for other GPUs' deadlines), counting quanta
// that much longer.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/arbiter/sched_sim.h"

namespace quanta::arbiter {
namespace {

using common::Priority;
using testing::kNsPerMs;
using testing::kNsPerSec;
using testing::Sim;

constexpr uint64_t kLongestDrainNs = 10 * kNsPerMs;  // the longest drain random_policy picks
constexpr uint64_t kCheckEveryNs = 100 * kNsPerMs;
constexpr uint64_t kSettleNs =
    1 * kNsPerSec;  // after a change (ceilings and credits look back a window)

struct PodState {
  common::Policy policy;
  std::vector<SlotId> tenants;  // present
  std::set<SlotId> awake;       // busy tenants
  uint64_t drain_ns = 1 * kNsPerMs;
};

// The promise, computed independently of the scheduler: minimums first (up to each
// ceiling), then the rest class by class, by weight, each pod up to its ceiling.
std::map<PodId, double> promised(const std::map<PodId, PodState>& pods) {
  std::map<PodId, double> share;
  double left = 1.0;
  for (const auto& [id, p] : pods) {
    if (p.awake.empty()) continue;
    share[id] = std::min(p.policy.min_share_ppm, p.policy.max_share_ppm) / 1e6;
    left -= share[id];
  }
  for (Priority cls : {Priority::kInteractive, Priority::kBatch, Priority::kBestEffort}) {
    std::set<PodId> open;
    for (const auto& [id, p] : pods) {
      if (!p.awake.empty() && p.policy.priority == cls && share[id] < p.policy.max_share_ppm / 1e6)
        open.insert(id);
    }
    while (left > 1e-9 && !open.empty()) {
      double w = 0;
      for (PodId id : open) w += pods.at(id).policy.weight;
      PodId capped = 0;
      bool any = false;
      for (PodId id : open) {
        const double cap = pods.at(id).policy.max_share_ppm / 1e6;
        if (share[id] + left * pods.at(id).policy.weight / w > cap + 1e-12) {
          capped = id;
          any = true;
          break;
        }
      }
      if (!any) {
        for (PodId id : open) share[id] += left * pods.at(id).policy.weight / w;
        left = 0;
        break;
      }
      const double cap = pods.at(capped).policy.max_share_ppm / 1e6;
      left -= cap - share[capped];
      share[capped] = cap;
      open.erase(capped);
    }
  }
  return share;
}

class ChurnRun {
 public:
  // late: the scheduler's deadlines are served as late as they may be (a quantum's end at
  // the end of its slack), and the bounds allow quanta that much longer.
  explicit ChurnRun(uint64_t seed, bool late = false) : rng_(seed), sim_(options()), late_(late) {
    sim_.late_deadlines = late;
  }

  // The options the bounds are computed from: served late, every quantum may run into its
  // slack, so the bounds count quanta that long.
  SchedulerOptions bound_options() const {
    SchedulerOptions o = options();
    if (late_) {
      o.quantum_ns += o.quantum_ns / 1000 * o.quantum_slack_ppm / 1000;
      o.quantum_max_ns += o.quantum_max_ns / 1000 * o.quantum_slack_ppm / 1000;
    }
    return o;
  }

  static SchedulerOptions options() {
    SchedulerOptions o;
    o.quantum_ns = 20 * kNsPerMs;
    o.quantum_max_ns = 40 * kNsPerMs;
    return o;
  }

  // Returns "" or the first broken promise, with what led to it.
  std::string run(uint64_t seconds) {
    const uint64_t end = sim_.now + seconds * kNsPerSec;
    for (PodId id = 1; id <= 3; ++id) arrive(id);
    while (sim_.now < end) {
      const uint64_t next_event = sim_.now + pick(150, 2500) * kNsPerMs;
      while (sim_.now < next_event) {
        sim_.run_until(std::min(next_event, sim_.now + kCheckEveryNs));
        if (std::string broken = check(); !broken.empty()) return broken;
      }
      event();
      if (std::string broken = check(); !broken.empty()) return broken;
    }
    return "";
  }

 private:
  uint64_t pick(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  common::Policy random_policy(PodId self) {
    common::Policy p;
    static constexpr uint32_t kWeights[] = {1, 2, 4, 8};
    p.weight = kWeights[pick(0, 3)];
    const uint64_t roll = pick(0, 9);
    p.priority = roll == 0   ? Priority::kInteractive
                 : roll <= 2 ? Priority::kBestEffort
                             : Priority::kBatch;
    if (chance(0.25)) p.max_share_ppm = static_cast<uint32_t>(pick(2, 6) * 100000);
    // A minimum only where the pods' minimums stay within the GPU (as admission enforces).
    if (chance(0.3)) {
      uint32_t others = 0;
      for (const auto& [id, s] : pods_) others += id == self ? 0 : s.policy.min_share_ppm;
      const uint32_t want = static_cast<uint32_t>(pick(1, 3) * 100000);
      if (others + want <= 600000 && want <= p.max_share_ppm) p.min_share_ppm = want;
    }
    return p;
  }

  void note(const std::string& what) {
    std::ostringstream os;
    os << (sim_.now - kNsPerSec) / kNsPerMs << " ms: " << what;
    history_.push_back(os.str());
    if (history_.size() > 12) history_.erase(history_.begin());
    changed_ns_ = sim_.now;
  }

  void arrive(PodId id) {
    PodState& p = pods_[id];
    if (p.tenants.empty()) p.policy = random_policy(id);
    p.drain_ns = std::vector<uint64_t>{200'000, 2'000'000, kLongestDrainNs}[pick(0, 2)];
    const SlotId slot = next_slot_++;
    sim_.add(slot, id, p.policy);
    sim_.busy(slot, true, p.drain_ns);
    p.tenants.push_back(slot);
    p.awake.insert(slot);
    note("pod " + std::to_string(id) + " tenant " + std::to_string(slot) + " arrives (" +
         describe(p.policy) + ")");
  }

  static std::string describe(const common::Policy& p) {
    return std::string(common::priority_name(p.priority)) + " w" + std::to_string(p.weight) +
           " max " + std::to_string(p.max_share_ppm / 10000) + "% min " +
           std::to_string(p.min_share_ppm / 10000) + "%";
  }

  void event() {
    const uint64_t roll = pick(0, 99);
    std::vector<PodId> ids;
    for (const auto& [id, p] : pods_) {
      if (!p.tenants.empty()) ids.push_back(id);
    }
    if (ids.empty() || (roll < 20 && next_slot_ < 200)) {
      PodId id = ids.size() < 6 || chance(0.3) ? static_cast<PodId>(pick(1, 8))
                                               : ids[pick(0, ids.size() - 1)];
      arrive(id);
      return;
    }
    const PodId id = ids[pick(0, ids.size() - 1)];
    PodState& p = pods_[id];
    const SlotId slot = p.tenants[pick(0, p.tenants.size() - 1)];
    if (roll < 45) {  // sleep or wake
      const bool awake = p.awake.count(slot) != 0;
      sim_.busy(slot, !awake, p.drain_ns);
      if (awake) {
        p.awake.erase(slot);
      } else {
        p.awake.insert(slot);
      }
      note("tenant " + std::to_string(slot) + (awake ? " sleeps" : " wakes"));
    } else if (roll < 60) {  // leaves
      sim_.remove(slot);
      p.tenants.erase(std::find(p.tenants.begin(), p.tenants.end(), slot));
      p.awake.erase(slot);
      if (p.tenants.empty()) {
        sim_.sched.forget_pod(id);
        pods_.erase(id);
        waiting_since_.erase(id);
        bound_since_.erase(id);
        last_held_.erase(id);
        all_slots_.erase(id);
      }
      note("tenant " + std::to_string(slot) + " leaves");
    } else {  // live policy change of the whole pod
      p.policy = random_policy(id);
      sim_.policy(id, p.policy);
      note("pod " + std::to_string(id) + " set to " + describe(p.policy));
    }
  }

  uint64_t pod_held(PodId id) {
    uint64_t sum = 0;
    for (SlotId s : all_slots_[id]) sum += sim_.held_ns(s);
    return sum;
  }
  uint64_t pod_turns(PodId id) {
    uint64_t sum = 0;
    for (SlotId s : all_slots_[id]) sum += sim_.turn_ns(s);
    return sum;
  }

  std::string fail(const std::string& what) {
    std::string out = what + "\n  recent events:";
    for (const std::string& h : history_) out += "\n    " + h;
    out += "\n  last decisions:";
    const size_t from = sim_.log.size() > 16 ? sim_.log.size() - 16 : 0;
    for (size_t i = from; i < sim_.log.size(); ++i) {
      const Action& a = sim_.log[i];
      out += std::string(" ") +
             std::to_string((sim_.log_ns[i] - kNsPerSec) / 100000 / 10.0).substr(0, 7) + ":" +
             (a.kind == Action::Kind::kGrant    ? "grant "
              : a.kind == Action::Kind::kRevoke ? "revoke "
                                                : "passover ") +
             std::to_string(a.slot);
    }
    for (const auto& [id, p] : pods_) {
      out += "\n  pod " + std::to_string(id) + " " + describe(p.policy) + " drains " +
             std::to_string(p.drain_ns / 1000) + " us";
      for (SlotId s : p.tenants) {
        out += "\n  tenant " + std::to_string(s) + " pod " + std::to_string(id) + ": " +
               state_name(sim_.sched.state(s)) + (sim_.granted(s) ? " granted" : "") +
               (sim_.wants(s) ? " wants" : "") + (sim_.want_flag(s) ? " want=1" : " want=0");
      }
    }
    return out;
  }

  std::string check() {
    const uint64_t now = sim_.now;
    const SchedulerOptions o = bound_options();
    std::map<PodId, double> promise = promised(pods_);
    for (const auto& [id, p] : pods_) {
      for (SlotId s : p.tenants) all_slots_[id].insert(s);
    }
    // Record each pod's cumulative GPU time, for the windows.
    samples_.push_back({now, {}, {}});
    for (const auto& [id, p] : pods_) {
      samples_.back().held[id] = pod_held(id);
      samples_.back().turns[id] = pod_turns(id);
    }
    while (samples_.size() > 64) samples_.erase(samples_.begin());

    // Share over the last window (the latest sample at least a window old), when nothing
    // changed during it or just before it.
    const uint64_t window = o.share_window_ns;
    const double share_error =
        static_cast<double>(o.quantum_max_ns + o.quantum_ns + kLongestDrainNs) / window + 0.01;
    const double min_error = static_cast<double>(o.quantum_ns + kLongestDrainNs) / window + 0.01;
    for (auto s = samples_.rbegin(); s != samples_.rend(); ++s) {
      if (s->at + window > now) continue;
      if (changed_ns_ + kSettleNs > s->at) break;
      const double length = static_cast<double>(now - s->at);
      for (const auto& [id, p] : pods_) {
        if (p.awake.empty() || !s->held.count(id)) continue;
        const double got = static_cast<double>(pod_held(id) - s->held.at(id)) / length;
        const double target = promise[id];
        if (std::fabs(got - target) > share_error) {
          return fail("pod " + std::to_string(id) + " (" + describe(p.policy) + ") got " +
                      std::to_string(got) + " of the last window, promised " +
                      std::to_string(target));
        }
        if (got + min_error < p.policy.min_share_ppm / 1e6) {
          return fail("pod " + std::to_string(id) + " got " + std::to_string(got) +
                      ", below its minimum");
        }
      }
      break;
    }

    // Waits of entitled pods.
    uint64_t drain_max = 0;
    uint32_t active = 0;
    uint32_t weights = 0;
    uint32_t min_ppm = 0;
    for (const auto& [id, p] : pods_) {
      if (p.awake.empty()) continue;
      drain_max = std::max(drain_max, p.drain_ns);
      ++active;
      weights += p.policy.weight;
      min_ppm += p.policy.min_share_ppm;
    }
    for (const auto& [id, p] : pods_) {
      bool wants = false;
      bool served = false;
      for (SlotId s : p.tenants) {
        wants = wants || sim_.wants(s);
        served = served || sim_.granted(s);
      }
      // Entitled: promised something now, and not held back by its own ceiling.
      bool entitled = wants && !served && promise[id] > 1e-9;
      if (entitled && p.policy.max_share_ppm < common::kShareScale) {
        // Its turns over at least the last window (from the latest sample a window old).
        for (auto s = samples_.rbegin(); s != samples_.rend(); ++s) {
          if (s->at + window > now) continue;
          const double used = s->turns.count(id)
                                  ? static_cast<double>(pod_turns(id) - s->turns.at(id)) / window
                                  : 1.0;
          if (used + 0.05 >= p.policy.max_share_ppm / 1e6) entitled = false;
          break;
        }
        if (samples_.front().at + window > now) entitled = false;  // too early to tell
      }
      // Served since the last look (a grant and its revoke both fell between two checks)
      // counts as served.
      const uint64_t held = pod_held(id);
      const bool got_some = last_held_.count(id) && last_held_[id] != held;
      last_held_[id] = held;
      if (!entitled || got_some) {
        waiting_since_.erase(id);
        if (!entitled) continue;
      }
      auto [it, fresh] = waiting_since_.try_emplace(id, now);
      // The weighted round it waits out runs only in the part of the GPU that the
      // minimums and the higher classes (up to their ceilings) leave to its class.
      uint64_t above = 0;
      for (const auto& [other, q] : pods_) {
        if (!q.awake.empty() && q.policy.priority < p.policy.priority)
          above += q.policy.max_share_ppm;
      }
      const double left = std::max(0.05, 1.0 - (min_ppm + above) / 1e6);
      const double others = static_cast<double>(weights - p.policy.weight) / p.policy.weight;
      const double round =
          (1 + others + active) * static_cast<double>(o.quantum_max_ns + drain_max);
      uint64_t bound =
          static_cast<uint64_t>(std::max(round / left, round + (min_ppm + above) / 1e6 * window)) +
          o.idle_release_ns;
      // A capped pod is paced: between holds it waits for its bucket to hold a quantum
      // again, its last drain included, at its max-share rate.
      if (p.policy.max_share_ppm < common::kShareScale)
        bound += (o.quantum_ns + drain_max) * 1000000 / p.policy.max_share_ppm;
      uint64_t& worst = bound_since_[id];
      if (fresh) worst = 0;
      worst = std::max(worst, bound);  // the competition may have thinned since it began
      if (!fresh && now - it->second > worst) {
        return fail("pod " + std::to_string(id) + " (" + describe(p.policy) + ") waited " +
                    std::to_string((now - it->second) / kNsPerMs) + " ms, bound " +
                    std::to_string(worst / kNsPerMs) + " ms");
      }
    }
    return "";
  }

  struct Sample {
    uint64_t at;
    std::map<PodId, uint64_t> held;   // GPU time
    std::map<PodId, uint64_t> turns;  // time holding a turn (what a ceiling counts)
  };

  std::mt19937_64 rng_;
  Sim sim_;
  std::map<PodId, PodState> pods_;
  std::map<PodId, std::set<SlotId>> all_slots_;
  std::map<PodId, uint64_t> waiting_since_;
  std::map<PodId, uint64_t> last_held_;
  std::map<PodId, uint64_t> bound_since_;
  std::vector<Sample> samples_;
  std::vector<std::string> history_;
  uint64_t changed_ns_ = 0;
  SlotId next_slot_ = 0;
  bool late_ = false;
};

class SchedulerChurn : public ::testing::TestWithParam<uint64_t> {};

TEST_P(SchedulerChurn, EveryWantingPodIsServedWithinItsBoundAndGetsItsShare) {
  ChurnRun run(GetParam());
  const std::string broken = run.run(60);
  EXPECT_EQ(broken, "") << "seed " << GetParam();
}

// The same promises hold when the arbiter ends every quantum at the end of its slack (it
// waited for other GPUs' deadlines), with the bounds counting quanta that much longer.
TEST_P(SchedulerChurn, QuantaEndingAtTheEndOfTheirSlackKeepTheSamePromises) {
  ChurnRun run(GetParam(), true);
  const std::string broken = run.run(60);
  EXPECT_EQ(broken, "") << "seed " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Seeds, SchedulerChurn,
                         ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));

}  // namespace
}  // namespace quanta::arbiter
