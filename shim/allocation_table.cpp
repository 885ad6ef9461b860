// AllocationTable: linear probing over one anonymous mapping. Slots move
// empty → busy → full → busy → tombstone, each step by compare-and-swap, so threads never
// take a lock; a busy slot is held only for the few stores that fill or empty it.
// Keys are unique while live (a free takes its entry out before the driver may hand the
// same address out again), so an insert may reuse the first tombstone it meets.
#include "shim/allocation_table.h"

#include <sched.h>
#include <sys/mman.h>

#include "shim/log.h"
#include "shim/spin.h"

namespace quanta::shim {

namespace {

AllocationTable g_table;

}  // namespace

AllocationTable& AllocationTable::instance() noexcept {
  return g_table;
}

AllocationTable::Slot* AllocationTable::slots() const noexcept {
  return slots_.load(std::memory_order_acquire);
}

AllocationTable::Slot* AllocationTable::map_slots() noexcept {
  if (Slot* table = slots()) return table;
  int expected = 0;
  if (map_state_.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    void* memory = mmap(nullptr, sizeof(Slot) * kCapacity, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) {
      QUANTA_LOG_ERROR(
          "cannot map the allocation table (%zu bytes): allocations will be charged but not "
          "returned on free",
          sizeof(Slot) * kCapacity);
      map_state_.store(3, std::memory_order_release);
      return nullptr;
    }
    slots_.store(static_cast<Slot*>(memory), std::memory_order_release);
    map_state_.store(2, std::memory_order_release);
    return static_cast<Slot*>(memory);
  }
  while (map_state_.load(std::memory_order_acquire) == 1) cpu_relax();
  return slots();
}

uint32_t AllocationTable::home(Resource resource, uint64_t key) noexcept {
  uint64_t h = (key ^ (static_cast<uint64_t>(resource) << 56)) * 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  return static_cast<uint32_t>(h) & (kCapacity - 1);
}

uint32_t AllocationTable::wait_not_busy(const Slot& slot) noexcept {
  uint32_t seen = slot.state.load(std::memory_order_acquire);
  for (int spins = 0; (seen & 0xff) == kBusy; ++spins) {
    // The writer is inside a handful of stores; yield if it was preempted there.
    if (spins < 64)
      cpu_relax();
    else
      sched_yield();
    seen = slot.state.load(std::memory_order_acquire);
  }
  return seen;
}

bool AllocationTable::insert(Resource resource, uint64_t key,
                             const Allocation& allocation) noexcept {
  Slot* table = map_slots();
  if (!table) return false;
  if (live_.fetch_add(1, std::memory_order_relaxed) >= kMaxLive) {
    live_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  uint32_t index = home(resource, key);
  for (uint32_t probes = 0; probes < kCapacity; ++probes, index = (index + 1) & (kCapacity - 1)) {
    Slot& slot = table[index];
    uint32_t seen = slot.state.load(std::memory_order_acquire);
    const uint32_t state = seen & 0xff;
    if (state != kEmpty && state != kTombstone) continue;
    if (!slot.state.compare_exchange_strong(seen, kBusy, std::memory_order_acquire,
                                            std::memory_order_relaxed))
      continue;  // someone else took it first; keep probing
    slot.key = key;
    slot.bytes = allocation.bytes;
    slot.device = allocation.device;
    slot.context = allocation.context;
    slot.state.store(full_word(resource), std::memory_order_release);
    return true;
  }
  live_.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

bool AllocationTable::take(Slot& slot, uint32_t seen, Allocation* out) noexcept {
  if (!slot.state.compare_exchange_strong(seen, kBusy, std::memory_order_acquire,
                                          std::memory_order_relaxed))
    return false;
  if (out) *out = Allocation{slot.bytes, slot.device, slot.context};
  slot.state.store(kTombstone, std::memory_order_release);
  live_.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

bool AllocationTable::remove(Resource resource, uint64_t key, Allocation* out) noexcept {
  Slot* table = slots();
  if (!table) return false;
  const uint32_t wanted = full_word(resource);
  uint32_t index = home(resource, key);
  for (uint32_t probes = 0; probes < kCapacity; ++probes, index = (index + 1) & (kCapacity - 1)) {
    Slot& slot = table[index];
    const uint32_t seen = wait_not_busy(slot);
    if ((seen & 0xff) == kEmpty) return false;
    if (seen == wanted && slot.key == key) return take(slot, seen, out);
  }
  return false;
}

bool AllocationTable::find(Resource resource, uint64_t key, Allocation* out) const noexcept {
  Slot* table = slots();
  if (!table) return false;
  const uint32_t wanted = full_word(resource);
  uint32_t index = home(resource, key);
  for (uint32_t probes = 0; probes < kCapacity; ++probes, index = (index + 1) & (kCapacity - 1)) {
    const Slot& slot = table[index];
    const uint32_t seen = wait_not_busy(slot);
    if ((seen & 0xff) == kEmpty) return false;
    if (seen == wanted && slot.key == key) {
      *out = Allocation{slot.bytes, slot.device, slot.context};
      return true;
    }
  }
  return false;
}

}  // namespace quanta::shim
