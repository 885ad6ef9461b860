// Charge, refund and the context sweep over the allocation table.
#include "shim/charge.h"

#include <atomic>

#include "shim/log.h"
#include "shim/pod_ledger.h"

namespace quanta::shim {

namespace {

std::atomic<bool> g_table_full_reported{false};

}  // namespace

bool Charge::reserve(CUdevice device, uint64_t bytes) noexcept {
  device_ = device;
  bytes_ = bytes;
  counted_ = bytes != 0 && link_memory_account(device, &account_) && account_.pod_used;
  if (!counted_) return true;
  if (PodLedger::try_reserve(account_, bytes)) return true;
  counted_ = false;
  QUANTA_LOG_INFO("refusing %llu bytes on device %d: the pod's memory cap would be passed",
                  static_cast<unsigned long long>(bytes), device);
  return false;
}

bool Charge::grow(uint64_t extra) noexcept {
  if (!counted_ || extra == 0) return true;
  if (!PodLedger::try_reserve(account_, extra)) return false;
  bytes_ += extra;
  return true;
}

void Charge::cancel() noexcept {
  if (counted_) PodLedger::release(account_, bytes_);
  counted_ = false;
}

void Charge::commit(Resource resource, uint64_t key, CUcontext context) noexcept {
  if (!counted_) return;
  if (!AllocationTable::instance().insert(resource, key, Allocation{bytes_, device_, context})) {
    // Keep the charge: over-counting is the safe side of a cap.
    if (!g_table_full_reported.exchange(true))
      QUANTA_LOG_WARN(
          "allocation table full (%u live entries): further allocations stay charged after their "
          "free",
          AllocationTable::instance().live());
  }
}

void refund(const Allocation& allocation) noexcept {
  MemoryAccount account;
  if (link_memory_account(allocation.device, &account) && account.pod_used)
    PodLedger::release(account, allocation.bytes);
}

void return_context_allocations(CUcontext context) noexcept {
  AllocationTable::instance().remove_context(
      context, [](Resource, uint64_t, const Allocation& allocation) { refund(allocation); });
}

}  // namespace quanta::shim
