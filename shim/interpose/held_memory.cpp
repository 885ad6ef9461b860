// Pool slots and frees captured into graphs: the bookkeeping behind held_memory.h. The
// slots are fixed, lock-free words; adding a slot and the captured-free list (touched
// only by captures, graph calls and synchronisations, never by a launch of a plain kernel
// or the ledger's reserve) take a mutex.
#define __CUDA_API_VERSION_INTERNAL 1
#include "shim/interpose/held_memory.h"

#include <pthread.h>

#include <atomic>

#include "shim/base/log.h"
#include "shim/interpose/allocation_table.h"
#include "shim/interpose/charge.h"
#include "shim/interpose/pod_ledger.h"
#include "shim/interpose/real_driver.h"

namespace quanta::shim {

namespace {

// ---- Pool slots -------------------------------------------------------------------------

constexpr uint32_t kMaxPools = kNoPoolSlot;

struct PoolSlot {
  std::atomic<uintptr_t> pool{0};  // 0: free
  std::atomic<CUdevice> device{0};
  std::atomic<uint64_t> used{0};
  std::atomic<uint64_t> charged{0};
  std::atomic<bool> destroyed{false};
  std::atomic<uint32_t> epoch{0};  // the ledger `charged` sits in (MemoryAccount::epoch)
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

PoolSlot g_pools[kMaxPools];
std::atomic<uint32_t> g_pool_slots_used{0};  // slots [0, this) have ever held a pool
pthread_mutex_t g_pool_add_lock = PTHREAD_MUTEX_INITIALIZER;
std::atomic<bool> g_pools_full_reported{false};

uintptr_t key_of(CUmemoryPool pool) {
  return reinterpret_cast<uintptr_t>(pool);
}

int64_t find_slot(uintptr_t pool) {
  const uint32_t used = g_pool_slots_used.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < used; ++i)
    if (g_pools[i].pool.load(std::memory_order_acquire) == pool &&
        !g_pools[i].destroyed.load(std::memory_order_acquire))
      return i;
  return -1;
}

int64_t find_or_add_slot(uintptr_t pool, CUdevice device, uint32_t epoch) {
  if (int64_t found = find_slot(pool); found >= 0) return found;
  pthread_mutex_lock(&g_pool_add_lock);
  int64_t slot = find_slot(pool);
  if (slot < 0) {
    for (uint32_t i = 0; i < kMaxPools; ++i) {
      if (g_pools[i].pool.load(std::memory_order_acquire) != 0) continue;
      g_pools[i].device.store(device, std::memory_order_relaxed);
      g_pools[i].used.store(0, std::memory_order_relaxed);
      g_pools[i].charged.store(0, std::memory_order_relaxed);
      g_pools[i].destroyed.store(false, std::memory_order_relaxed);
      g_pools[i].epoch.store(epoch, std::memory_order_relaxed);
      g_pools[i].pool.store(pool, std::memory_order_release);
      if (i >= g_pool_slots_used.load(std::memory_order_relaxed))
        g_pool_slots_used.store(i + 1, std::memory_order_release);
      slot = i;
      break;
    }
  }
  pthread_mutex_unlock(&g_pool_add_lock);
  if (slot < 0 && !g_pools_full_reported.exchange(true))
    QUANTA_LOG_WARN(
        "more than %u memory pools: allocations from the others are returned at their free",
        kMaxPools);
  return slot;
}

bool slot_account(const PoolSlot& slot, MemoryAccount* account) {
  return link_memory_account(slot.device.load(std::memory_order_relaxed), account) &&
         account->pod_used;
}

// The charge never sits below what is in use: whoever lowered `used` or `charged` last
// raises it back (memory the driver holds is charged whatever the cap).
void keep_charge_at_least_used(PoolSlot& slot, const MemoryAccount& account) {
  uint64_t charged = slot.charged.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t used = slot.used.load(std::memory_order_acquire);
    if (charged >= used) return;
    if (slot.charged.compare_exchange_weak(charged, used, std::memory_order_acq_rel)) {
      PodLedger::force_reserve(account, used - charged);
      return;
    }
  }
}

// A reserve charged `missing` to `account` and raised the pool's charge while the process
// moved to a fresh ledger (charge.h, move_charges). Epochs only grow. The pool not moved yet
// (older epoch): the move, which reads the charge after marking the pool, will count these
// bytes with the rest, so they come back off the account now. The pool moved already (newer
// epoch) while this charged the old ledger: the fresh one is charged too; if the move read
// the charge after this raised it, the pod is over-counted by `missing` while the process
// lives (the safe side; its exit returns everything).
void settle_move_race(PoolSlot& slot, CUdevice device, const MemoryAccount& account,
                      uint64_t missing) {
  const uint32_t moved_to = slot.epoch.load(std::memory_order_seq_cst);
  if (moved_to == account.epoch) return;
  if (moved_to < account.epoch) {
    PodLedger::release(account, missing);
    return;
  }
  MemoryAccount current;
  if (link_memory_account(device, &current) && current.pod_used && current.epoch == moved_to)
    PodLedger::force_reserve(current, missing);
}

// Lowers the charge to max(used, min(charged, reserved)): the driver's figure may only
// bring it down (a driver rounding its reserve up does not charge the pod more).
void settle_slot(uint32_t index) {
  PoolSlot& slot = g_pools[index];
  const uintptr_t pool = slot.pool.load(std::memory_order_acquire);
  if (pool == 0) return;
  MemoryAccount account;
  if (!slot_account(slot, &account)) return;
  // Charged to a ledger the process has left: the move to the current one (pool_move_charges)
  // has not reached this pool yet, and the current ledger holds none of it to give back.
  if (slot.epoch.load(std::memory_order_acquire) != account.epoch) return;
  uint64_t reserved = 0;
  const bool destroyed = slot.destroyed.load(std::memory_order_acquire);
  if (!destroyed) {
    auto get_attribute = QUANTA_REAL(cuMemPoolGetAttribute);
    cuuint64_t value = 0;
    if (!get_attribute ||
        get_attribute(reinterpret_cast<CUmemoryPool>(pool), CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                      &value) != CUDA_SUCCESS)
      return;  // the driver cannot say: keep the charge (the safe side)
    reserved = value;
  }
  uint64_t charged = slot.charged.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t used = slot.used.load(std::memory_order_acquire);
    const uint64_t held = charged < reserved ? charged : reserved;
    const uint64_t target = held > used ? held : used;
    if (target >= charged) break;
    if (slot.charged.compare_exchange_weak(charged, target, std::memory_order_acq_rel)) {
      PodLedger::release(account, charged - target);
      break;
    }
  }
  keep_charge_at_least_used(slot, account);
  if (destroyed && slot.used.load(std::memory_order_acquire) == 0 &&
      slot.charged.load(std::memory_order_acquire) == 0) {
    pthread_mutex_lock(&g_pool_add_lock);
    if (slot.used.load(std::memory_order_acquire) == 0)
      slot.pool.store(0, std::memory_order_release);
    pthread_mutex_unlock(&g_pool_add_lock);
  }
}

// ---- Captured frees ---------------------------------------------------------------------

constexpr uint32_t kMaxCapturedFrees = 1024;

enum class CaptureState : uint8_t { empty, capturing, captured, instantiated, launched };

struct CapturedFree {
  CaptureState state = CaptureState::empty;
  uint64_t pointer = 0;
  CUstream stream = nullptr;
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  CUevent done = nullptr;  // recorded after the launch that runs the free
};

CapturedFree g_captured[kMaxCapturedFrees];
std::atomic<uint32_t> g_captured_count{0};  // entries not empty
pthread_mutex_t g_captured_lock = PTHREAD_MUTEX_INITIALIZER;
std::atomic<bool> g_captured_full_reported{false};

void drop(CapturedFree& entry) {
  entry = CapturedFree{};
  g_captured_count.fetch_sub(1, std::memory_order_acq_rel);
}

bool event_in_use(CUevent event) {
  for (const CapturedFree& entry : g_captured)
    if (entry.state == CaptureState::launched && entry.done == event) return true;
  return false;
}

// Refunds each captured free whose launch has completed. Called with g_captured_lock held.
void refund_completed_captured_frees() {
  auto query = QUANTA_REAL(cuEventQuery);
  auto destroy = QUANTA_REAL(cuEventDestroy_v2);
  if (!query) return;
  for (CapturedFree& entry : g_captured) {
    if (entry.state != CaptureState::launched || query(entry.done) != CUDA_SUCCESS) continue;
    Allocation allocation;
    if (AllocationTable::instance().remove(Resource::device_memory, entry.pointer, &allocation))
      refund(allocation);
    const CUevent done = entry.done;
    drop(entry);
    if (destroy && !event_in_use(done)) destroy(done);
  }
}

}  // namespace

bool pool_reserve(CUmemoryPool pool, CUdevice device, const MemoryAccount& account, uint64_t bytes,
                  uint32_t* slot_out) noexcept {
  const int64_t index = find_or_add_slot(key_of(pool), device, account.epoch);
  if (index < 0) {
    *slot_out = kNoPoolSlot;  // no slot: charged and returned like a plain allocation
    return PodLedger::try_reserve(account, bytes);
  }
  PoolSlot& slot = g_pools[index];
  slot.used.fetch_add(bytes, std::memory_order_acq_rel);
  uint64_t charged = slot.charged.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t used = slot.used.load(std::memory_order_acquire);
    if (charged >= used) break;  // the pool's cache covers it
    const uint64_t missing = used - charged;
    if (!PodLedger::try_reserve(account, missing)) {
      pool_return(static_cast<uint32_t>(index), bytes);
      return false;
    }
    // seq_cst: ordered before the epoch load in settle_move_race, as the move's are.
    if (slot.charged.compare_exchange_strong(charged, used, std::memory_order_seq_cst)) {
      settle_move_race(slot, device, account, missing);
      break;
    }
    PodLedger::release(account, missing);  // someone else moved it: look again
  }
  *slot_out = static_cast<uint32_t>(index);
  return true;
}

uint64_t pool_charges_outside(CUdevice device, uint32_t epoch) noexcept {
  uint64_t held = 0;
  const uint32_t slots = g_pool_slots_used.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < slots; ++i) {
    const PoolSlot& slot = g_pools[i];
    if (slot.pool.load(std::memory_order_acquire) != 0 &&
        slot.device.load(std::memory_order_relaxed) == device &&
        slot.epoch.load(std::memory_order_acquire) != epoch)
      held += slot.charged.load(std::memory_order_acquire);
  }
  return held;
}

uint64_t pool_move_charges(CUdevice device, uint32_t epoch) noexcept {
  uint64_t moved = 0;
  const uint32_t slots = g_pool_slots_used.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < slots; ++i) {
    PoolSlot& slot = g_pools[i];
    if (slot.pool.load(std::memory_order_acquire) == 0 ||
        slot.device.load(std::memory_order_relaxed) != device)
      continue;
    // The epoch first: a reserve that reads the old one afterwards charged before this read.
    if (slot.epoch.exchange(epoch, std::memory_order_seq_cst) == epoch) continue;
    moved += slot.charged.load(std::memory_order_seq_cst);
  }
  return moved;
}

void pool_return(uint32_t index, uint64_t bytes) noexcept {
  if (index >= kMaxPools) return;
  PoolSlot& slot = g_pools[index];
  uint64_t used = slot.used.load(std::memory_order_acquire);
  while (!slot.used.compare_exchange_weak(used, used > bytes ? used - bytes : 0,
                                          std::memory_order_acq_rel)) {
  }
  if (slot.destroyed.load(std::memory_order_acquire)) settle_slot(index);
}

void pool_settle(CUmemoryPool pool) noexcept {
  const int64_t index = find_slot(key_of(pool));
  if (index >= 0) settle_slot(static_cast<uint32_t>(index));
}

void pool_destroyed(CUmemoryPool pool) noexcept {
  const int64_t index = find_slot(key_of(pool));
  if (index < 0) return;
  g_pools[index].destroyed.store(true, std::memory_order_release);
  settle_slot(static_cast<uint32_t>(index));
}

bool stream_is_capturing(CUstream stream) noexcept {
  auto is_capturing = QUANTA_REAL(cuStreamIsCapturing);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return is_capturing && is_capturing(stream, &status) == CUDA_SUCCESS &&
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void note_captured_free(uint64_t pointer, CUstream stream) noexcept {
  pthread_mutex_lock(&g_captured_lock);
  bool noted = false;
  for (CapturedFree& entry : g_captured) {
    if (entry.state != CaptureState::empty) continue;
    entry = CapturedFree{CaptureState::capturing, pointer, stream, nullptr, nullptr, nullptr};
    g_captured_count.fetch_add(1, std::memory_order_acq_rel);
    noted = true;
    break;
  }
  pthread_mutex_unlock(&g_captured_lock);
  // Not noted: the record stays and keeps its charge until its context goes (safe side).
  if (!noted && !g_captured_full_reported.exchange(true))
    QUANTA_LOG_WARN("more than %u frees captured in graphs at once: later ones stay charged",
                    kMaxCapturedFrees);
}

void note_capture_ended(CUstream stream, CUgraph graph) noexcept {
  if (g_captured_count.load(std::memory_order_acquire) == 0) return;
  pthread_mutex_lock(&g_captured_lock);
  for (CapturedFree& entry : g_captured) {
    if (entry.state != CaptureState::capturing || entry.stream != stream) continue;
    if (!graph) {
      drop(entry);  // the capture failed: the free will never run
      continue;
    }
    entry.graph = graph;
    entry.state = CaptureState::captured;
  }
  pthread_mutex_unlock(&g_captured_lock);
}

void note_graph_instantiated(CUgraph graph, CUgraphExec exec) noexcept {
  if (g_captured_count.load(std::memory_order_acquire) == 0) return;
  pthread_mutex_lock(&g_captured_lock);
  for (CapturedFree& entry : g_captured) {
    if (entry.state != CaptureState::captured || entry.graph != graph) continue;
    entry.exec = exec;
    entry.state = CaptureState::instantiated;
  }
  pthread_mutex_unlock(&g_captured_lock);
}

void note_graph_launched(CUgraphExec exec, CUstream stream) noexcept {
  if (g_captured_count.load(std::memory_order_acquire) == 0) return;
  auto create = QUANTA_REAL(cuEventCreate);
  auto record = QUANTA_REAL(cuEventRecord);
  auto destroy = QUANTA_REAL(cuEventDestroy_v2);
  if (!create || !record) return;
  pthread_mutex_lock(&g_captured_lock);
  CUevent done = nullptr;
  for (CapturedFree& entry : g_captured) {
    if (entry.state != CaptureState::instantiated || entry.exec != exec) continue;
    if (!done) {
      // Completes when the launch, and so its free nodes, have run.
      if (create(&done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) break;
      if (record(done, stream) != CUDA_SUCCESS) {
        if (destroy) destroy(done);
        done = nullptr;
        break;
      }
    }
    entry.done = done;
    entry.state = CaptureState::launched;
  }
  pthread_mutex_unlock(&g_captured_lock);
}

void note_graph_destroyed(CUgraph graph) noexcept {
  if (g_captured_count.load(std::memory_order_acquire) == 0) return;
  pthread_mutex_lock(&g_captured_lock);
  for (CapturedFree& entry : g_captured)
    if (entry.state == CaptureState::captured && entry.graph == graph) drop(entry);
  pthread_mutex_unlock(&g_captured_lock);
}

void note_graph_exec_destroyed(CUgraphExec exec) noexcept {
  if (g_captured_count.load(std::memory_order_acquire) == 0) return;
  pthread_mutex_lock(&g_captured_lock);
  // Never launched: the free never ran and the memory stays allocated (and charged).
  for (CapturedFree& entry : g_captured)
    if (entry.state == CaptureState::instantiated && entry.exec == exec) drop(entry);
  pthread_mutex_unlock(&g_captured_lock);
}

void settle_held_memory() noexcept {
  if (g_captured_count.load(std::memory_order_acquire) != 0) {
    pthread_mutex_lock(&g_captured_lock);
    refund_completed_captured_frees();
    pthread_mutex_unlock(&g_captured_lock);
  }
  const uint32_t slots = g_pool_slots_used.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < slots; ++i) {
    PoolSlot& slot = g_pools[i];
    if (slot.pool.load(std::memory_order_acquire) == 0) continue;
    if (slot.charged.load(std::memory_order_acquire) > slot.used.load(std::memory_order_acquire))
      settle_slot(i);
  }
}

}  // namespace quanta::shim
