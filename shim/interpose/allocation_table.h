// What this process allocated through the shim: device pointer / handle → (bytes, device,
// context), so a free returns exactly what its allocation charged. A fixed-capacity,
// lock-free open-addressing table in one anonymous mapping made at first use. A key lives
// within kProbeWindow slots of its home, so every lookup (a miss too) is bounded however
// long the process has churned.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>

namespace quanta::shim {

// Resource kinds live in separate key spaces (a CUarray and a device pointer may be
// numerically equal).
enum class Resource : uint8_t {
  device_memory = 1,  // cuMemAlloc*, pitch, managed, async and pool allocations
  generic_handle,     // cuMemCreate handles
  array,              // cuArrayCreate, cuArray3DCreate
  mipmapped_array,    // cuMipmappedArrayCreate
  context,            // per-context overhead (cuCtxCreate, primary retain)
  graph_pending,      // bytes of a graph's memory-alloc nodes (not charged yet)
  graph_exec,         // charged at instantiation, returned at cuGraphExecDestroy
  memory_pool,        // cuMemPoolCreate: the pool's device, or kHostDevice
  vmm_mapping,        // cuMemMap of a tracked handle: the handle (aux) mapped at this address
};

// Device value recorded for pools whose memory is not device memory.
constexpr CUdevice kHostDevice = -1;

// Allocation::flags
constexpr uint32_t kUncharged = 1u << 0;  // made while the process had no account yet
// device_memory from a pool: its charge is the pool's (held_memory.h), aux the pool slot.
constexpr uint32_t kPoolMember = 1u << 1;
// generic_handle released by cuMemRelease while still mapped (aux: live mappings); the
// charge returns with its last cuMemUnmap.
constexpr uint32_t kReleased = 1u << 2;

struct Allocation {
  uint64_t bytes = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // allocations freed when this context is destroyed; or null
  uint64_t aux = 0;             // per resource, see the wrappers (pool, reference count)
  uint32_t flags = 0;
  // The ledger the charge sits in (MemoryAccount::epoch): an arbiter restart that hands the
  // process a fresh ledger moves each charge over once (charge_follows_account).
  uint32_t epoch = 0;
};

class AllocationTable {
 public:
  static constexpr uint32_t kCapacity = 1u << 18;  // slots (12 MiB mapping, touched lazily)
  static constexpr uint32_t kMaxLive = kCapacity / 2;
  // Slots a key may sit from its home. Freed slots stay tombstones (clearing them safely
  // would need a lock), so this bound is what keeps a miss cheap after millions of frees;
  // at most half the slots live, a window this long is full only with odds below 1e-5.
  static constexpr uint32_t kProbeWindow = 64;

  // The process-wide table. Maps its memory at the first insert, never before.
  static AllocationTable& instance() noexcept;

  // False when the table is full (or its mapping failed): the caller keeps the charge
  // (over-counting is the safe side) and the free later passes through uncounted.
  bool insert(Resource resource, uint64_t key, const Allocation& allocation) noexcept;

  // Takes the entry out and returns it. False when the key is not tracked.
  bool remove(Resource resource, uint64_t key, Allocation* out) noexcept;

  // Reads an entry without removing it.
  bool find(Resource resource, uint64_t key, Allocation* out) const noexcept;

  // Changes an entry in place, atomically with respect to every other operation on it:
  // edit(Allocation&) returns true to keep the entry, false to remove it. The entry as it
  // was goes to `out`. False when the key is not tracked.
  template <typename Edit>
  bool modify(Resource resource, uint64_t key, Edit&& edit, Allocation* out = nullptr) noexcept;

  // Calls visit(resource, key, Allocation&) on every entry, each held while visited; the
  // visitor edits it in place. An entry another thread holds is waited for, not skipped.
  // For rare whole-table passes (joining the arbiter late, moving to a fresh ledger).
  template <typename Visit>
  void for_each(Visit&& visit) noexcept;

  // Removes every entry made in `context` and calls visit(resource, key, allocation) for
  // each. Used when a context is destroyed: the driver frees its memory with it.
  template <typename Visit>
  void remove_context(CUcontext context, Visit&& visit) noexcept;

  uint32_t live() const noexcept { return live_.load(std::memory_order_relaxed); }

  AllocationTable() = default;
  AllocationTable(const AllocationTable&) = delete;
  AllocationTable& operator=(const AllocationTable&) = delete;

 private:
  // Slot state word: low byte the state, next byte the resource.
  enum State : uint32_t { kEmpty = 0, kBusy = 1, kFull = 2, kTombstone = 3 };
  struct Slot {
    std::atomic<uint32_t> state;
    CUdevice device;
    uint64_t key;
    uint64_t bytes;
    CUcontext context;
    uint64_t aux;
    uint32_t flags;
    uint32_t epoch;
  };
  static_assert(sizeof(Slot) == 48);
  static_assert(std::atomic<uint32_t>::is_always_lock_free);

  Slot* slots() const noexcept;
  Slot* map_slots() noexcept;
  static uint32_t home(Resource resource, uint64_t key) noexcept;
  static uint32_t full_word(Resource resource) noexcept {
    return kFull | (static_cast<uint32_t>(resource) << 8);
  }
  static uint32_t wait_not_busy(const Slot& slot) noexcept;
  static Allocation read(const Slot& slot) noexcept {
    return Allocation{slot.bytes, slot.device, slot.context, slot.aux, slot.flags, slot.epoch};
  }
  static void write(Slot& slot, const Allocation& allocation) noexcept {
    slot.bytes = allocation.bytes;
    slot.device = allocation.device;
    slot.context = allocation.context;
    slot.aux = allocation.aux;
    slot.flags = allocation.flags;
    slot.epoch = allocation.epoch;
  }
  // The slot holding `key`, held busy (the caller stores its state word back), or nullptr.
  Slot* hold(Resource resource, uint64_t key) noexcept;
  void put_back(Slot& slot, Resource resource, bool keep) noexcept;

  mutable std::atomic<Slot*> slots_{nullptr};
  std::atomic<int> map_state_{0};  // 0 unmapped, 1 mapping, 2 mapped, 3 failed
  std::atomic<uint32_t> live_{0};
};

template <typename Edit>
bool AllocationTable::modify(Resource resource, uint64_t key, Edit&& edit,
                             Allocation* out) noexcept {
  Slot* slot = hold(resource, key);
  if (!slot) return false;
  Allocation allocation = read(*slot);
  if (out) *out = allocation;
  const bool keep = edit(allocation);
  if (keep) write(*slot, allocation);
  put_back(*slot, resource, keep);
  return true;
}

template <typename Visit>
void AllocationTable::for_each(Visit&& visit) noexcept {
  Slot* table = slots();
  if (!table) return;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    Slot& slot = table[i];
    uint32_t seen = wait_not_busy(slot);
    // Taken again meanwhile: wait for this slot once more rather than skip a live entry.
    while ((seen & 0xff) == kFull &&
           !slot.state.compare_exchange_strong(seen, kBusy, std::memory_order_acquire,
                                               std::memory_order_relaxed))
      seen = wait_not_busy(slot);
    if ((seen & 0xff) != kFull) continue;
    Allocation allocation = read(slot);
    visit(static_cast<Resource>(seen >> 8), slot.key, allocation);
    write(slot, allocation);
    slot.state.store(seen, std::memory_order_release);
  }
}

template <typename Visit>
void AllocationTable::remove_context(CUcontext context, Visit&& visit) noexcept {
  Slot* table = slots();
  if (!table || !context) return;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    Slot& slot = table[i];
    uint32_t seen = slot.state.load(std::memory_order_acquire);
    if ((seen & 0xff) != kFull || slot.context != context) continue;
    if (!slot.state.compare_exchange_strong(seen, kBusy, std::memory_order_acquire,
                                            std::memory_order_relaxed))
      continue;
    const Resource resource = static_cast<Resource>(seen >> 8);
    if (slot.context != context) {  // freed and reused for another context meanwhile
      put_back(slot, resource, true);
      continue;
    }
    const uint64_t key = slot.key;
    const Allocation allocation = read(slot);
    put_back(slot, resource, false);
    visit(resource, key, allocation);
  }
}

}  // namespace quanta::shim
