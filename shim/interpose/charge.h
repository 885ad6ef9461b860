// The allocation protocol every counting wrapper follows: reserve in the pod ledger
// before the driver call, commit (record what to return on free) or cancel after it; a
// free takes its record out first, calls the driver, then refunds (or puts it back while
// the driver still holds the memory).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "shim/interpose/allocation_table.h"
#include "shim/link.h"

namespace quanta::shim {

class Charge {
 public:
  // Reserves `bytes` on `device`'s pod account. False when that would pass the pod's cap,
  // or while the link refuses CUDA to this process (link_refuses_cuda): the wrapper then
  // returns CUDA_ERROR_OUT_OF_MEMORY without calling the driver. A process without an
  // account is neither capped nor counted; while it may still join the arbiter
  // (link_may_join) its allocations are recorded and charged when it joins.
  bool reserve(CUdevice device, uint64_t bytes) noexcept;

  // Reserves `extra` more on the same account (a pitch wider than estimated).
  bool grow(uint64_t extra) noexcept;

  // The driver call failed: give the reservation back.
  void cancel() noexcept;

  // The driver call succeeded: remember what `key` charged so its free returns it. `aux`
  // is the resource's extra word (allocation_table.h).
  void commit(Resource resource, uint64_t key, CUcontext context, uint64_t aux = 0) noexcept;

  bool counted() const noexcept { return counted_; }
  uint64_t bytes() const noexcept { return bytes_; }

 private:
  MemoryAccount account_{};
  CUdevice device_ = 0;
  uint64_t bytes_ = 0;
  bool counted_ = false;
  bool pending_ = false;  // no account yet, but the process may join: record uncharged
};

// Returns an allocation's charge to its pod account (nothing for one never charged). A pool
// allocation's bytes go back to its pool instead, which keeps the charge until the driver
// gives the memory back (held_memory.h).
void refund(const Allocation& allocation) noexcept;

// True when a free the driver refused means the memory is gone anyway: the driver no
// longer knows the pointer or handle (another thread freed it first) or its context died.
// Any other failure (a stream capture in progress, a sticky context error) leaves the
// memory held, so the record stays.
bool free_failure_means_released(CUresult result) noexcept;

// Frees `key` through `release_call` (the real driver's free). Untracked keys still reach
// the driver and change no accounting; a failed free keeps the record and the charge unless
// the failure says the memory was released (a racing double free): then it refunds, so a
// record is never put back for memory nobody holds.
template <typename ReleaseCall>
CUresult free_tracked(Resource resource, uint64_t key, ReleaseCall&& release_call) noexcept {
  AllocationTable& table = AllocationTable::instance();
  Allocation allocation;
  const bool tracked = table.remove(resource, key, &allocation);
  const CUresult result = release_call();
  if (!tracked) return result;
  if (result != CUDA_SUCCESS && !free_failure_means_released(result)) {
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

// The process just got an account on `device` (it joined the arbiter late, or the device
// was attached late): charges every recorded allocation made there without one, whatever
// the cap (the driver holds that memory already). Returns the bytes charged.
uint64_t charge_allocations_made_before_joining(CUdevice device,
                                                const MemoryAccount& account) noexcept;

// ---- Moving to a fresh ledger -------------------------------------------------------------
// An arbiter restart that cannot re-adopt the pod's region (or this process's entry in it)
// hands the process fresh ledger words, which start at 0 while the driver still holds what
// the process allocated. The link moves every charge over in three steps:
//   1. charges_outside: the bytes the process holds on `device` charged to any other ledger
//      (records and pool charges); the link charges them into the fresh ledger in one
//      compare-and-swap (PodLedger::force_reserve), before its route is published, so the
//      pod's other processes never see a part of it;
//   2. the route is published: from now on charges go to the fresh ledger;
//   3. move_charges: marks each record and pool with the fresh epoch, exactly once, paying
//      from that up-front credit (a charge committed meanwhile is paid on top) and returning
//      what is left (records freed between 1 and 3, whose refunds released nothing).
// A refund releases only what sits in the current ledger (matching epoch), and a charge
// committed on an old route follows the account (charge_follows_account), so no byte is
// counted twice or lost. Returns the bytes moved.
uint64_t charges_outside(CUdevice device, uint32_t epoch) noexcept;
uint64_t move_charges(CUdevice device, const MemoryAccount& account, uint64_t credit) noexcept;

// A charge on `key` was just committed to the ledger of `charged_epoch`: if the device's
// ledger is another one by now (an arbiter restart in between), the charge is made there too
// unless the move already counted the record.
void charge_follows_account(Resource resource, uint64_t key, CUdevice device,
                            uint32_t charged_epoch) noexcept;

}  // namespace quanta::shim
