// What this process allocated through the shim: device pointer / handle → (bytes, device,
// context), so a free returns exactly what its allocation charged. A fixed-capacity,
// lock-free open-addressing table in one anonymous mapping made at first use.
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
};

// Device value recorded for pools whose memory is not device memory.
constexpr CUdevice kHostDevice = -1;

struct Allocation {
  uint64_t bytes = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;  // allocations freed when this context is destroyed; or null
};

class AllocationTable {
 public:
  static constexpr uint32_t kCapacity = 1u << 18;  // slots (8 MiB mapping, touched lazily)
  static constexpr uint32_t kMaxLive = kCapacity / 4 * 3;

  // The process-wide table. Maps its memory at the first insert, never before.
  static AllocationTable& instance() noexcept;

  // False when the table is full (or its mapping failed): the caller keeps the charge
  // (over-counting is the safe side) and the free later passes through uncounted.
  bool insert(Resource resource, uint64_t key, const Allocation& allocation) noexcept;

  // Takes the entry out and returns it. False when the key is not tracked.
  bool remove(Resource resource, uint64_t key, Allocation* out) noexcept;

  // Reads an entry without removing it.
  bool find(Resource resource, uint64_t key, Allocation* out) const noexcept;

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
  };
  static_assert(sizeof(Slot) == 32);
  static_assert(std::atomic<uint32_t>::is_always_lock_free);

  Slot* slots() const noexcept;
  Slot* map_slots() noexcept;
  static uint32_t home(Resource resource, uint64_t key) noexcept;
  static uint32_t full_word(Resource resource) noexcept {
    return kFull | (static_cast<uint32_t>(resource) << 8);
  }
  static uint32_t wait_not_busy(const Slot& slot) noexcept;
  bool take(Slot& slot, uint32_t seen, Allocation* out) noexcept;

  mutable std::atomic<Slot*> slots_{nullptr};
  std::atomic<int> map_state_{0};  // 0 unmapped, 1 mapping, 2 mapped, 3 failed
  std::atomic<uint32_t> live_{0};
};

template <typename Visit>
void AllocationTable::remove_context(CUcontext context, Visit&& visit) noexcept {
  Slot* table = slots();
  if (!table || !context) return;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    Slot& slot = table[i];
    const uint32_t seen = slot.state.load(std::memory_order_acquire);
    if ((seen & 0xff) != kFull || slot.context != context) continue;
    const uint64_t key = slot.key;
    Allocation allocation;
    if (take(slot, seen, &allocation)) visit(static_cast<Resource>(seen >> 8), key, allocation);
  }
}

}  // namespace quanta::shim
