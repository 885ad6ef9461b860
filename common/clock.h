// Time as every Quanta part measures it: CLOCK_MONOTONIC nanoseconds, which the shim,
// the arbiter, simgpu's execution log and the eBPF probes (bpf_ktime_get_ns) all share.
#pragma once

#include <time.h>

#include <cstdint>

namespace quanta::common {

inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr uint64_t kNsPerUs = 1000ull;
constexpr uint64_t kNsPerMs = 1000000ull;
constexpr uint64_t kNsPerSec = 1000000000ull;

}  // namespace quanta::common
