// Shared-memory layout 2, as release 0.1.0 before layout 3 wrote it and as its libquanta.so
// still reads it: the arbiter keeps serving pods started under that release (their shims
// speak tenant protocol 3) in regions of this layout, so an upgrade never restarts them
// (docs/operator-guide.md, "Upgrade and roll back"). Frozen: nothing here changes while an
// arbiter accepts layout 2; the static_asserts pin every offset a layout-2 shim reads.
//
// What differs from layout 3 (common/shm_layout.h): each ControlSlot names its process (pid,
// pod and entry indexes) and carries its pod's cap, quantum and in-flight limit, so every
// layout-2 tenant of a GPU sees those of the others; the arbiter therefore gives layout-2
// processes a control region of their own per GPU, which no layout-3 process maps. The pod
// region has no caps and no GateLimits. Headers and gate channels are layout 3's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/shm_layout.h"

namespace quanta::common::layout2 {

constexpr uint32_t kVersion = 2;

// One tenant process on this GPU. Written only by the arbiter. The gate protocol of `turn`,
// `end_at_ns` and GateChannel::released_turn is layout 3's.
struct alignas(64) ControlSlot {
  std::atomic<uint32_t> turn;
  std::atomic<uint32_t> pid;          // host pid admitted here; 0 = slot free
  std::atomic<uint32_t> pod_index;    // which pod region (arbiter's table)
  std::atomic<uint32_t> proc_index;   // entry in that pod region's process table
  std::atomic<uint64_t> memory_cap;   // bytes for the whole pod on this GPU; 0 = no cap
  std::atomic<uint64_t> quantum_ns;   // this slot's current quantum
  std::atomic<uint64_t> inflight_limit_ns;  // GPU time it may keep queued
  std::atomic<uint32_t> priority;     // common::Priority, informational for the tenant
  uint32_t reserved0;
  std::atomic<uint64_t> end_at_ns;
  uint32_t reserved[2];
};
static_assert(sizeof(ControlSlot) == 64);
static_assert(offsetof(ControlSlot, pid) == 4 && offsetof(ControlSlot, memory_cap) == 16 &&
              offsetof(ControlSlot, quantum_ns) == 24 &&
              offsetof(ControlSlot, inflight_limit_ns) == 32 && offsetof(ControlSlot, end_at_ns) == 48);

struct ControlRegion {
  ControlHeader header;
  ControlSlot slots[kMaxSlotsPerGpu];
};
static_assert(sizeof(ControlRegion) == 128 + 64 * kMaxSlotsPerGpu);

struct alignas(64) ProcEntry {
  std::atomic<uint32_t> pid;   // written by the arbiter at admission (cleared at death)
  uint32_t reserved[15];
  GateChannel gpus[kMaxGpus];
};
static_assert(sizeof(ProcEntry) == 64 + 64 * kMaxGpus);

struct PodRegion {
  PodHeader header;
  alignas(64) std::atomic<uint64_t> memory_used[kMaxGpus];   // the pod ledger
  alignas(64) std::atomic<uint64_t> alloc_denied[kMaxGpus];  // refusals at the cap
  ProcEntry procs[kMaxProcsPerPod];
};
static_assert(offsetof(PodRegion, memory_used) == 320 && offsetof(PodRegion, alloc_denied) == 832 &&
              offsetof(PodRegion, procs) == 1344);

}  // namespace quanta::common::layout2
