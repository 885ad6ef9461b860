// Charge, refund, the context sweep, and the two passes over the allocation table: charging
// what was allocated before joining, and moving every charge into a fresh ledger after an
// arbiter restart that could not re-adopt the old one.
#include "shim/interpose/charge.h"

#include <atomic>

#include "shim/base/log.h"
#include "shim/interpose/held_memory.h"
#include "shim/interpose/pod_ledger.h"

namespace quanta::shim {

namespace {

std::atomic<bool> g_table_full_reported{false};
// Records still waiting for an account: when 0, joining needs no pass over the table.
std::atomic<uint64_t> g_uncharged{0};

// An uncharged record whose device has an account now (the process joined between this
// allocation's reserve and its commit): charge it, exactly once whoever gets there first.
void settle(Resource resource, uint64_t key, CUdevice device) noexcept {
  MemoryAccount account;
  if (!link_memory_account(device, &account) || !account.pod_used) return;
  AllocationTable::instance().modify(resource, key, [&](Allocation& allocation) {
    if (allocation.flags & kUncharged) {
      PodLedger::force_reserve(account, allocation.bytes);
      allocation.flags &= ~kUncharged;
      allocation.epoch = account.epoch;
      g_uncharged.fetch_sub(1, std::memory_order_relaxed);
    }
    return true;
  });
}

// A record whose bytes sit in a ledger of their own (a pool member's are its pool's; a
// mapping, a pool or a graph's pending total charges nothing itself).
bool carries_charge(Resource resource, const Allocation& allocation) noexcept {
  if (allocation.bytes == 0 || (allocation.flags & (kUncharged | kPoolMember))) return false;
  switch (resource) {
    case Resource::device_memory:
    case Resource::generic_handle:
    case Resource::array:
    case Resource::mipmapped_array:
    case Resource::context:
    case Resource::graph_exec:
      return true;
    default:
      return false;
  }
}

// Pays `bytes` out of `credit` and charges what the credit lacks to the ledger: the
// up-front charge of a move pays for the records it finds until it runs out.
void spend(uint64_t* credit, const MemoryAccount& account, uint64_t bytes) noexcept {
  const uint64_t covered = bytes < *credit ? bytes : *credit;
  *credit -= covered;
  if (bytes > covered) PodLedger::force_reserve(account, bytes - covered);
}

}  // namespace

bool Charge::reserve(CUdevice device, uint64_t bytes) noexcept {
  device_ = device;
  bytes_ = bytes;
  pending_ = false;
  if (link_refuses_cuda()) {
    counted_ = false;
    return false;
  }
  counted_ = bytes != 0 && link_memory_account(device, &account_) && account_.pod_used;
  if (!counted_) {
    pending_ = bytes != 0 && link_may_join(device);
    return true;
  }
  if (PodLedger::try_reserve(account_, bytes)) return true;
  counted_ = false;
  QUANTA_LOG_INFO("refusing %llu bytes on device %d: the pod's memory cap would be passed",
                  static_cast<unsigned long long>(bytes), device);
  return false;
}

bool Charge::grow(uint64_t extra) noexcept {
  if (extra == 0) return true;
  if (!counted_) {
    bytes_ += extra;  // uncounted or pending: only the recorded size grows
    return true;
  }
  if (!PodLedger::try_reserve(account_, extra)) return false;
  bytes_ += extra;
  return true;
}

void Charge::cancel() noexcept {
  if (counted_) PodLedger::release(account_, bytes_);
  counted_ = false;
  pending_ = false;
}

void Charge::commit(Resource resource, uint64_t key, CUcontext context, uint64_t aux) noexcept {
  if (!counted_ && !pending_) return;
  const uint32_t flags = counted_ ? 0 : kUncharged;
  if (pending_) g_uncharged.fetch_add(1, std::memory_order_relaxed);
  if (!AllocationTable::instance().insert(
          resource, key, Allocation{bytes_, device_, context, aux, flags, account_.epoch})) {
    if (pending_) g_uncharged.fetch_sub(1, std::memory_order_relaxed);
    // Keep the charge: over-counting is the safe side of a cap.
    if (!g_table_full_reported.exchange(true))
      QUANTA_LOG_WARN(
          "allocation table full (%u live entries): further allocations stay charged after their "
          "free",
          AllocationTable::instance().live());
    return;
  }
  if (pending_) settle(resource, key, device_);
  if (counted_) charge_follows_account(resource, key, device_, account_.epoch);
}

void refund(const Allocation& allocation) noexcept {
  if (allocation.flags & kPoolMember) {
    pool_return(static_cast<uint32_t>(allocation.aux), allocation.bytes);
    return;
  }
  if (allocation.flags & kUncharged) {
    g_uncharged.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  // A charge from an earlier ledger that the move has not reached yet is not in the current
  // one: the move, finding the record gone, gives its up-front part back instead.
  MemoryAccount account;
  if (link_memory_account(allocation.device, &account) && account.pod_used &&
      account.epoch == allocation.epoch)
    PodLedger::release(account, allocation.bytes);
}

void charge_follows_account(Resource resource, uint64_t key, CUdevice device,
                            uint32_t charged_epoch) noexcept {
  MemoryAccount account;
  if (!link_memory_account(device, &account) || !account.pod_used || account.epoch == charged_epoch)
    return;
  AllocationTable::instance().modify(resource, key, [&](Allocation& allocation) {
    if (carries_charge(resource, allocation) && allocation.epoch != account.epoch) {
      PodLedger::force_reserve(account, allocation.bytes);
      allocation.epoch = account.epoch;
    }
    return true;
  });
}

bool free_failure_means_released(CUresult result) noexcept {
  switch (result) {
    case CUDA_ERROR_INVALID_VALUE:   // not an allocation the driver knows (any more)
    case CUDA_ERROR_INVALID_HANDLE:  // the same, for handles
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_DEINITIALIZED:  // the driver is shutting down with the process
      return true;
    default:
      return false;
  }
}

void return_context_allocations(CUcontext context) noexcept {
  AllocationTable::instance().remove_context(
      context, [](Resource, uint64_t, const Allocation& allocation) { refund(allocation); });
}

uint64_t charge_allocations_made_before_joining(CUdevice device,
                                                const MemoryAccount& account) noexcept {
  uint64_t charged = 0;
  if (g_uncharged.load(std::memory_order_relaxed) == 0) return 0;
  AllocationTable::instance().for_each([&](Resource, uint64_t, Allocation& allocation) {
    if (!(allocation.flags & kUncharged) || allocation.device != device) return;
    PodLedger::force_reserve(account, allocation.bytes);
    allocation.flags &= ~kUncharged;
    allocation.epoch = account.epoch;
    g_uncharged.fetch_sub(1, std::memory_order_relaxed);
    charged += allocation.bytes;
  });
  return charged;
}

uint64_t charges_outside(CUdevice device, uint32_t epoch) noexcept {
  uint64_t held = pool_charges_outside(device, epoch);
  AllocationTable::instance().for_each([&](Resource resource, uint64_t, Allocation& allocation) {
    if (allocation.device == device && allocation.epoch != epoch &&
        carries_charge(resource, allocation))
      held += allocation.bytes;
  });
  return held;
}

uint64_t move_charges(CUdevice device, const MemoryAccount& account, uint64_t credit) noexcept {
  uint64_t moved = 0;
  AllocationTable::instance().for_each([&](Resource resource, uint64_t, Allocation& allocation) {
    if (allocation.device != device || allocation.epoch == account.epoch ||
        !carries_charge(resource, allocation))
      return;
    spend(&credit, account, allocation.bytes);
    allocation.epoch = account.epoch;
    moved += allocation.bytes;
  });
  const uint64_t pooled = pool_move_charges(device, account.epoch);
  spend(&credit, account, pooled);
  moved += pooled;
  if (credit != 0) PodLedger::release(account, credit);  // freed before the move reached them
  return moved;
}

}  // namespace quanta::shim
