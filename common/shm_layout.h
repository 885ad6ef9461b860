// Shared-memory layout between quanta-arbiter and libquanta.so: the per-GPU control
// region (arbiter writes, every tenant on the GPU maps it read-only, so it holds only what
// the gate needs: turns, an opaque owner word per slot, the holder's quantum end) and the
// per-pod region (the pod's processes write requests, releases, statistics and ledger
// words; the arbiter writes the pod's caps and each process's quantum there). Both are sealed
// memfds passed over the tenant socket (arbiter/state/regions.h). Fixed layout, magic and
// version first; every field has one writer. Freestanding: no heap, no std::string.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace quanta::common {

// 3: per-slot pids, pod and process indexes, caps, quanta and priorities left the control
// region (the owner word and the pod region's caps and GateLimits replace them).
constexpr uint32_t kLayoutVersion = 3;
constexpr uint32_t kControlMagic = 0x4354514eu;  // "NQTC"
constexpr uint32_t kPodMagic = 0x4450514eu;      // "NQPD"

constexpr uint32_t kMaxGpus = 64;          // GPUs and MIG instances on one node
constexpr uint32_t kMaxSlotsPerGpu = 256;  // tenant processes on one GPU
constexpr uint32_t kMaxProcsPerPod = 64;   // processes of one pod using the GPUs at once
constexpr uint32_t kNoSlot = 0xffffffffu;
constexpr size_t kUuidLen = 64;            // "GPU-…" / "MIG-…" strings, NUL-terminated
constexpr size_t kPodKeyLen = 256;         // "namespace/name" or "uid:…", NUL-terminated

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// ---------------------------------------------------------------------------------------
// Control region: one per GPU UUID and arbiter generation, passed to tenants O_RDONLY and
// sealed so that no descriptor of it can ever write it again.
// ---------------------------------------------------------------------------------------

// One tenant process on this GPU. Written only by the arbiter.
//
// Gate protocol (the launch fast path is one load of `turn`):
//  - `turn` odd: this slot holds the grant and may submit. Even: it must not (never
//    granted yet, or revoked). The arbiter changes it only by +1 (grant: even→odd,
//    revoke: odd→even) and then FUTEX_WAKEs it; blocked launchers futex-wait on it.
//  - On a revoke the tenant stops submitting, waits for its in-flight work, then stores
//    the (even) turn it saw into its GateChannel::released_turn and rings the doorbell.
//  - An idle holder may give the grant back early by storing the (odd) turn it holds
//    into released_turn; the arbiter then revokes and grants the next waiter.
//  - A holder whose shim attached with kAttachEndsOwnQuantum ends its own turn at
//    end_at_ns: it stops submitting, waits for its in-flight work and stores the *next*
//    (even) turn into released_turn ahead of the revoke. The arbiter reads released_turn
//    equal to turn + 1 as that release and bumps the turn without waking the slot; the turn
//    then equals the release, as after any revoke. A backstop revoke that came first leaves
//    the same state, so the order of the two never matters.
struct alignas(64) ControlSlot {
  std::atomic<uint32_t> turn;
  // Whose slot it is: a word the arbiter derives from the process and a secret of its own
  // (arbiter/state/slot_owner.h) and sends the process in its Attached reply; 0 = slot free. A
  // process whose owner word no longer matches has lost the slot. To others it says only
  // that the slot is in use: no pid, pod or policy of any tenant is in this region.
  std::atomic<uint32_t> owner;
  // When the holder's quantum ends while a waiter of its class waits (CLOCK_MONOTONIC ns;
  // 0: nothing to end). Cleared before every grant and revoke of the slot.
  std::atomic<uint64_t> end_at_ns;
  uint64_t reserved[6];
};
static_assert(sizeof(ControlSlot) == 64);

struct alignas(64) ControlHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t size;         // bytes of the whole region
  uint32_t gpu_index;    // the arbiter's index for this GPU (pod regions are indexed by it)
  char uuid[kUuidLen];
  std::atomic<uint64_t> arbiter_generation;  // bumped at every arbiter start
  std::atomic<uint64_t> heartbeat_ns;        // CLOCK_MONOTONIC, refreshed every lease_ns/4
  std::atomic<uint64_t> lease_ns;            // gating lapses when heartbeat is older than this
  std::atomic<uint32_t> holder;              // slot holding the grant, or kNoSlot
  std::atomic<uint32_t> waiters;             // slots that want the GPU and do not hold it
  // The scheduler's idle_release, refreshed with the heartbeat: a shim that announced
  // kAttachReportsUnusedGrant rings when a grant made while others wait goes unused this
  // long. 0 (an arbiter that predates it): the shim does not watch its grants.
  std::atomic<uint64_t> idle_release_ns;
};
static_assert(sizeof(ControlHeader) == 128, "the header keeps its size: new fields use its padding");

struct ControlRegion {
  ControlHeader header;
  ControlSlot slots[kMaxSlotsPerGpu];
};
static_assert(offsetof(ControlRegion, slots) % 64 == 0);

// ---------------------------------------------------------------------------------------
// Pod region: one per pod, passed O_RDWR to that pod's processes only. Nothing a tenant
// writes here is trusted by the arbiter beyond this pod: it validates before acting.
// ---------------------------------------------------------------------------------------

// One process's view of one GPU. Written by that process, except memory_used, which the
// arbiter also decrements when the process dies.
struct alignas(64) GateChannel {
  std::atomic<uint32_t> want;            // 1 from a launcher blocking at the gate until a release
                                         // finds none waiting (kept through the grant)
  std::atomic<uint32_t> released_turn;   // see ControlSlot's protocol
  std::atomic<uint64_t> inflight_ns;     // estimated GPU time queued, not yet finished
  std::atomic<uint64_t> memory_used;     // this process's bytes on this GPU
  std::atomic<uint64_t> launches;        // gated launches
  std::atomic<uint64_t> gate_waits;      // launches that took the slow path
  std::atomic<uint64_t> gate_wait_ns;    // total time spent blocked at the gate
  std::atomic<uint64_t> gate_wait_max_ns;
  std::atomic<uint64_t> last_launch_ns;
};
static_assert(sizeof(GateChannel) == 64);

// What the arbiter sets for one process on one GPU. Written only by the arbiter; the pod's
// processes read it (a process that rewrites its own limits only loosens its own restraint:
// the arbiter revokes by its own clock).
struct alignas(32) GateLimits {
  std::atomic<uint32_t> slot;               // its ControlSlot on this GPU; kNoSlot = none
  uint32_t reserved0;
  std::atomic<uint64_t> quantum_ns;         // its current quantum
  std::atomic<uint64_t> inflight_limit_ns;  // GPU time it may keep queued (binds below quantum_ns)
  uint64_t reserved1;
};
static_assert(sizeof(GateLimits) == 32);

struct alignas(64) ProcEntry {
  std::atomic<uint32_t> pid;   // written by the arbiter at admission (cleared at death)
  uint32_t reserved[15];
  GateChannel gpus[kMaxGpus];
  GateLimits limits[kMaxGpus];
};

struct alignas(64) PodHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t size;
  uint32_t reserved0;
  char pod_key[kPodKeyLen];  // informational: the arbiter trusts its own record, never this
  // A random number the arbiter writes at creation and records in its state file: after a
  // restart it re-adopts a region found in a tenant's mappings only when the tag matches,
  // so a look-alike memfd made by another pod is never taken for this pod's region.
  uint64_t recovery_tag;
};
static_assert(sizeof(PodHeader) == 320, "the recovery tag fits in the header's padding");

struct PodRegion {
  PodHeader header;
  // The pod ledger: bytes in use per GPU summed over all its processes. The shim
  // reserves with a compare-and-swap against memory_cap before every allocation, so
  // concurrent processes can never overshoot.
  alignas(64) std::atomic<uint64_t> memory_used[kMaxGpus];
  // The pod's cap per GPU in bytes (0 = no cap), written by the arbiter. Like the ledger it
  // is the pod's to overwrite; NVML's per-process count, which no tenant can forge, holds
  // the cap against a pod that does ([enforce] over_cap).
  alignas(64) std::atomic<uint64_t> memory_cap[kMaxGpus];
  // Allocations the pod ledger refused at the cap, per GPU (the shim counts; only this
  // pod's metrics read it).
  alignas(64) std::atomic<uint64_t> alloc_denied[kMaxGpus];
  ProcEntry procs[kMaxProcsPerPod];
};
static_assert(offsetof(PodRegion, procs) % 64 == 0);
static_assert(sizeof(PodRegion) < 512 * 1024);

// memfd names (shown in /proc/<pid>/maps as "/memfd:<name> (deleted)"; nothing under
// /dev/shm). `scope` is the arbiter's instance name from its config (default "quanta") so
// tests can run several arbiters side by side. Control: "<scope>.gpu.<gpu_index>"; pod:
// "<scope>.pod.<pod_index>".

}  // namespace quanta::common
