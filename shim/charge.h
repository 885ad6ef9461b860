// The allocation protocol every counting wrapper follows: reserve in the pod ledger
// before the driver call, commit (record what to return on free) or cancel after it; a
// free takes its record out first, calls the driver, then refunds (or puts it back).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "shim/allocation_table.h"
#include "shim/link.h"

namespace quanta::shim {

class Charge {
 public:
  // Reserves `bytes` on `device`'s pod account. False when that would pass the pod's cap:
  // the wrapper then returns CUDA_ERROR_OUT_OF_MEMORY without calling the driver. A process
  // without an account (not placed by the arbiter) is neither capped nor counted.
  bool reserve(CUdevice device, uint64_t bytes) noexcept;

  // Reserves `extra` more on the same account (a pitch wider than estimated).
  bool grow(uint64_t extra) noexcept;

  // The driver call failed: give the reservation back.
  void cancel() noexcept;

  // The driver call succeeded: remember what `key` charged so its free returns it.
  void commit(Resource resource, uint64_t key, CUcontext context) noexcept;

  bool counted() const noexcept { return counted_; }
  uint64_t bytes() const noexcept { return bytes_; }

 private:
  MemoryAccount account_{};
  CUdevice device_ = 0;
  uint64_t bytes_ = 0;
  bool counted_ = false;
};

// Returns an allocation's charge to its pod account.
void refund(const Allocation& allocation) noexcept;

// Frees `key` through `release_call` (the real driver's free). Untracked keys still reach
// the driver and change no accounting; a failed free keeps the record and the charge.
template <typename ReleaseCall>
CUresult free_tracked(Resource resource, uint64_t key, ReleaseCall&& release_call) noexcept {
  AllocationTable& table = AllocationTable::instance();
  Allocation allocation;
  const bool tracked = table.remove(resource, key, &allocation);
  const CUresult result = release_call();
  if (!tracked) return result;
  if (result != CUDA_SUCCESS) {
    table.insert(resource, key, allocation);
    return result;
  }
  refund(allocation);
  return result;
}

// A context is gone (destroyed, or the primary context's last release or reset): the
// driver freed everything made in it, so return all of it. The caller tells the link
// (link_forget_context) before the driver destroys the context.
void return_context_allocations(CUcontext context) noexcept;

}  // namespace quanta::shim
