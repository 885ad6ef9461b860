// Fixed-window rate limiting of tenant-triggered log lines.
#include "arbiter/loop/log_limit.h"

namespace quanta::arbiter {

bool LogLimiter::allow(const std::string& kind, uint64_t now_ns, uint64_t* suppressed) {
  Bucket& b = buckets_[kind];
  *suppressed = 0;
  if (b.used == 0 || now_ns - b.window_start >= interval_ns_) {
    *suppressed = b.suppressed;
    b.window_start = now_ns;
    b.used = 0;
    b.suppressed = 0;
  }
  if (b.used >= burst_) {
    ++b.suppressed;
    return false;
  }
  ++b.used;
  return true;
}

}  // namespace quanta::arbiter
