// AllocationTable: linear probing over one anonymous mapping, bounded to kProbeWindow slots
// from a key's home. Slots move empty → busy → full → busy → tombstone (or back to full),
// each step by compare-and-swap, so threads never take a lock; a busy slot is held only for
// the few stores that fill, edit or empty it. Keys are unique while live (a free takes its
// entry out before the driver may hand the same address out again), so an insert may
// reuse the first tombstone it meets. A search ends at a never-used slot or at the end of
// the window, whichever comes first.
#include "shim/interpose/allocation_table.h"

#include <sched.h>
#include <sys/mman.h>

#include "shim/base/log.h"
#include "shim/base/spin.h"

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
  for (uint32_t probes = 0; probes < kProbeWindow;) {
    Slot& slot = table[index];
    uint32_t seen = wait_not_busy(slot);  // it may become free (a remove) or stay taken
    const uint32_t state = seen & 0xff;
    if ((state == kEmpty || state == kTombstone) &&
        slot.state.compare_exchange_strong(seen, kBusy, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
      slot.key = key;
      write(slot, allocation);
      slot.state.store(full_word(resource), std::memory_order_release);
      return true;
    }
    if (state == kEmpty || state == kTombstone) continue;  // lost the race: this slot again
    ++probes;
    index = (index + 1) & (kCapacity - 1);
  }
  live_.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

bool AllocationTable::remove(Resource resource, uint64_t key, Allocation* out) noexcept {
  Slot* slot = hold(resource, key);
  if (!slot) return false;
  if (out) *out = read(*slot);
  put_back(*slot, resource, false);
  return true;
}

AllocationTable::Slot* AllocationTable::hold(Resource resource, uint64_t key) noexcept {
  Slot* table = slots();
  if (!table) return nullptr;
  const uint32_t wanted = full_word(resource);
  uint32_t index = home(resource, key);
  for (uint32_t probes = 0; probes < kProbeWindow;) {
    Slot& slot = table[index];
    uint32_t seen = wait_not_busy(slot);
    if ((seen & 0xff) == kEmpty) return nullptr;
    if (seen == wanted && slot.key == key) {
      if (slot.state.compare_exchange_strong(seen, kBusy, std::memory_order_acquire,
                                             std::memory_order_relaxed))
        return &slot;
      continue;  // taken or edited meanwhile: look at this slot again
    }
    ++probes;
    index = (index + 1) & (kCapacity - 1);
  }
  return nullptr;
}

void AllocationTable::put_back(Slot& slot, Resource resource, bool keep) noexcept {
  if (keep) {
    slot.state.store(full_word(resource), std::memory_order_release);
    return;
  }
  slot.state.store(kTombstone, std::memory_order_release);
  live_.fetch_sub(1, std::memory_order_relaxed);
}

bool AllocationTable::find(Resource resource, uint64_t key, Allocation* out) const noexcept {
  // Held like an edit, so a concurrent modify is never seen half written.
  auto* self = const_cast<AllocationTable*>(this);
  Slot* slot = self->hold(resource, key);
  if (!slot) return false;
  *out = read(*slot);
  self->put_back(*slot, resource, true);
  return true;
}

}  // namespace quanta::shim
