// GPU time over sliding windows: what a pod used within the share window (its max-share
// ceiling, the achieved shares quantactl shows) and the credit a guaranteed minimum share
// accrues while the pod wants the GPU (min-share).
#pragma once

#include <cstdint>

#include "arbiter/scheduling/ring.h"

namespace quanta::arbiter {

// The stretches of time a tenant or pod was on the GPU. A stretch shared with others
// (a drain beside a new holder) counts 1/divisor of its length.
class UsageLog {
 public:
  void add(uint64_t start, uint64_t end, uint32_t divisor = 1);
  // Charged nanoseconds within [from, to).
  uint64_t used(uint64_t from, uint64_t to) const;
  // The earliest t >= now at which used(t - window, t) <= target, if nothing is added.
  uint64_t drops_to(uint64_t target, uint64_t now, uint64_t window) const;
  // Forgets stretches that end before `before`.
  void trim(uint64_t before);
  bool empty() const { return pieces_.empty(); }
  void clear() { pieces_.clear(); }

 private:
  struct Piece {
    uint64_t start = 0;
    uint64_t end = 0;
    uint32_t divisor = 1;
  };
  Ring<Piece> pieces_;  // oldest first
};

// A share as a token bucket. For a guaranteed minimum share: while the pod wants the GPU (and is
// not held back by its own ceiling) it earns `rate` of every nanosecond, up to one share window's
// worth; all GPU time it receives on that claim (its drain included) spends the credit, which may
// go below zero by as much (a debt it earns back before it is owed again). A pod with credit of at
// least a quantum is owed, and is served ahead of weights and classes until the credit is spent, so
// over any share window it receives its minimum less about one quantum and one drain, and no more
// than that on the claim. For a ceiling it smooths the pod's use to its max-share rate, bursts of
// one bucket at most, so a capped pod neither takes half a window at once nor then waits half a
// window.
class GuaranteeCredit {
 public:
  static constexpr uint32_t kPpm = 1000000;

  // Earns rate_ppm of every nanosecond, holding at most cap_ns (and owing at most as much).
  void configure(uint32_t rate_ppm, uint64_t cap_ns);
  uint32_t rate_ppm() const { return rate_ppm_; }
  // Brings the credit up to `now`; `earning` says whether the pod was earning since the
  // last settle. Call before every change of `earning` and before reading.
  void settle(uint64_t now, bool earning);
  // The credit, or 0 while in debt.
  uint64_t credit() const { return credit_ns_ > 0 ? static_cast<uint64_t>(credit_ns_) : 0; }
  int64_t balance() const { return credit_ns_; }
  // Spends `ns` (down to minus one window's worth).
  void spend(uint64_t ns);
  void reset() { credit_ns_ = 0; }
  void fill() { credit_ns_ = static_cast<int64_t>(cap_ns_); }
  // Nanoseconds of earning until the credit reaches `target` (0: already there).
  uint64_t time_to(uint64_t target) const;
  uint64_t cap() const { return cap_ns_; }

 private:
  uint32_t rate_ppm_ = 0;
  uint64_t cap_ns_ = 0;
  int64_t credit_ns_ = 0;
  uint64_t settled_ns_ = 0;
  uint64_t remainder_ = 0;  // earned ns * rate not yet a whole nanosecond (times kPpm)
};

}  // namespace quanta::arbiter
