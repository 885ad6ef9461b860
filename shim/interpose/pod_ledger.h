// The pod memory ledger: reservations against the pod's cap on one GPU, made with a
// compare-and-swap on the pod-wide word, so processes of a pod racing each other can
// never commit a byte past the cap (no check-then-add).
#pragma once

#include <cstdint>

#include "shim/link.h"

namespace quanta::shim {

struct PodLedger {
  // Adds `bytes` to the pod's usage if that keeps it within the cap (no cap: always), then
  // to this process's part. False, with nothing changed, when it would pass the cap.
  static bool try_reserve(const MemoryAccount& account, uint64_t bytes) noexcept;

  // Adds `bytes` whatever the cap: memory the driver already holds (allocated before the
  // process joined the arbiter) is charged even if that puts the pod over its cap, which
  // then refuses further allocations until enough is freed.
  static void force_reserve(const MemoryAccount& account, uint64_t bytes) noexcept;

  // Returns `bytes` reserved earlier: this process's part first, then the pod's, so a
  // death in between leaves the pod over-counted (safe), never under-counted. Both words
  // saturate at zero (the arbiter may have reclaimed them already).
  static void release(const MemoryAccount& account, uint64_t bytes) noexcept;

  // What the memory views show for a capped account: bytes still reservable.
  static uint64_t room(const MemoryAccount& account) noexcept;
};

}  // namespace quanta::shim
