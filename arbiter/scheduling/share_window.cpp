// UsageLog sums and the guarantee's token bucket. Stretches recorded back to back with the
// same divisor merge, so a hold charged pass by pass is one entry, not one per pass.
#include "arbiter/scheduling/share_window.h"

#include <algorithm>

namespace quanta::arbiter {
namespace {

uint64_t overlap(uint64_t start, uint64_t end, uint64_t from, uint64_t to) {
  const uint64_t s = std::max(start, from);
  const uint64_t e = std::min(end, to);
  return e > s ? e - s : 0;
}

}  // namespace

void UsageLog::add(uint64_t start, uint64_t end, uint32_t divisor) {
  if (end <= start) return;
  divisor = std::max<uint32_t>(divisor, 1);
  if (!pieces_.empty()) {
    Piece& last = pieces_.back();
    if (last.end == start && last.divisor == divisor) {
      last.end = end;
      return;
    }
  }
  pieces_.push_back({start, end, divisor});
}

uint64_t UsageLog::used(uint64_t from, uint64_t to) const {
  uint64_t sum = 0;
  // Newest last: walk back until the pieces end before the window.
  for (size_t i = pieces_.size(); i-- > 0;) {
    const Piece& p = pieces_[i];
    if (p.end <= from) break;
    sum += overlap(p.start, p.end, from, to) / p.divisor;
  }
  return sum;
}

uint64_t UsageLog::drops_to(uint64_t target, uint64_t now, uint64_t window) const {
  const uint64_t from = now > window ? now - window : 0;
  uint64_t used_now = used(from, now);
  if (used_now <= target) return now;
  uint64_t excess = used_now - target;
  // As the window slides, old use leaves it at 1/divisor per nanosecond, oldest first.
  for (const Piece& p : pieces_) {
    const uint64_t s = std::max(p.start, from);
    if (p.end <= s) continue;
    const uint64_t worth = (p.end - s) / p.divisor;
    if (worth >= excess) return s + window + excess * p.divisor;
    excess -= worth;
  }
  return now + window;
}

void UsageLog::trim(uint64_t before) {
  while (!pieces_.empty() && pieces_.front().end < before) pieces_.pop_front();
}

void GuaranteeCredit::configure(uint32_t rate_ppm, uint64_t cap_ns) {
  rate_ppm_ = std::min(rate_ppm, kPpm);
  cap_ns_ = cap_ns;
  const int64_t cap = static_cast<int64_t>(cap_ns_);
  credit_ns_ = std::clamp(credit_ns_, -cap, cap);
  if (rate_ppm_ == 0) remainder_ = 0;
}

void GuaranteeCredit::settle(uint64_t now, bool earning) {
  if (now > settled_ns_ && earning && rate_ppm_ != 0 && settled_ns_ != 0) {
    const unsigned __int128 scaled =
        static_cast<unsigned __int128>(now - settled_ns_) * rate_ppm_ + remainder_;
    const uint64_t earned = static_cast<uint64_t>(scaled / kPpm);
    remainder_ = static_cast<uint64_t>(scaled % kPpm);
    const int64_t cap = static_cast<int64_t>(cap_ns_);
    credit_ns_ =
        std::min(cap, credit_ns_ + static_cast<int64_t>(std::min<uint64_t>(earned, cap_ns_ * 2)));
    if (credit_ns_ == cap) remainder_ = 0;
  }
  settled_ns_ = now;
}

void GuaranteeCredit::spend(uint64_t ns) {
  const int64_t cap = static_cast<int64_t>(cap_ns_);
  credit_ns_ =
      std::max(-cap, credit_ns_ - static_cast<int64_t>(std::min<uint64_t>(ns, cap_ns_ * 2)));
}

uint64_t GuaranteeCredit::time_to(uint64_t target) const {
  if (credit_ns_ >= static_cast<int64_t>(target)) return 0;
  if (rate_ppm_ == 0) return UINT64_MAX;
  const unsigned __int128 need =
      static_cast<unsigned __int128>(static_cast<int64_t>(target) - credit_ns_) * kPpm;
  return static_cast<uint64_t>((need + rate_ppm_ - 1) / rate_ppm_);
}

}  // namespace quanta::arbiter
