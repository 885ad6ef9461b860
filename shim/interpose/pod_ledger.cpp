// PodLedger: the compare-and-swap loop against the cap and the saturating release.
#include "shim/interpose/pod_ledger.h"

namespace quanta::shim {

namespace {

void saturating_subtract(std::atomic<uint64_t>* word, uint64_t bytes) {
  uint64_t current = word->load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t next = current > bytes ? current - bytes : 0;
    if (word->compare_exchange_weak(current, next, std::memory_order_acq_rel,
                                    std::memory_order_relaxed))
      return;
  }
}

}  // namespace

bool PodLedger::try_reserve(const MemoryAccount& account, uint64_t bytes) noexcept {
  uint64_t used = account.pod_used->load(std::memory_order_relaxed);
  for (;;) {
    // Re-read the cap on every attempt: the arbiter may lower or raise it meanwhile.
    const uint64_t cap = account.cap ? account.cap->load(std::memory_order_acquire) : 0;
    uint64_t next = 0;
    if (__builtin_add_overflow(used, bytes, &next) || (cap != 0 && next > cap)) {
      if (account.denied) account.denied->fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (account.pod_used->compare_exchange_weak(used, next, std::memory_order_acq_rel,
                                                std::memory_order_relaxed))
      break;
  }
  if (account.process_used) account.process_used->fetch_add(bytes, std::memory_order_acq_rel);
  return true;
}

void PodLedger::force_reserve(const MemoryAccount& account, uint64_t bytes) noexcept {
  uint64_t used = account.pod_used->load(std::memory_order_relaxed);
  uint64_t next = 0;
  do {
    if (__builtin_add_overflow(used, bytes, &next)) next = UINT64_MAX;
  } while (!account.pod_used->compare_exchange_weak(used, next, std::memory_order_acq_rel,
                                                    std::memory_order_relaxed));
  if (account.process_used) account.process_used->fetch_add(bytes, std::memory_order_acq_rel);
}

void PodLedger::release(const MemoryAccount& account, uint64_t bytes) noexcept {
  if (account.process_used) saturating_subtract(account.process_used, bytes);
  saturating_subtract(account.pod_used, bytes);
}

uint64_t PodLedger::room(const MemoryAccount& account) noexcept {
  const uint64_t cap = account.cap ? account.cap->load(std::memory_order_acquire) : 0;
  const uint64_t used = account.pod_used->load(std::memory_order_acquire);
  return used >= cap ? 0 : cap - used;
}

}  // namespace quanta::shim
