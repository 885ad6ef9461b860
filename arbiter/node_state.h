// The arbiter's live state of the node, as the core keeps it: each managed GPU (its control
// regions, scheduler, deadline, slots and what was counted of it) and each admitted process.
// The core (arbiter.h) owns and changes it; the observer (observing/observer.h) reads it, and
// the admin service (serving/admin_service.h) reads the GPUs to answer drains.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <bitset>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "arbiter/observing/gpu_inventory.h"
#include "arbiter/observing/node_view.h"
#include "arbiter/scheduling/accounting.h"
#include "arbiter/scheduling/scheduler.h"
#include "arbiter/state/device_access.h"
#include "arbiter/state/regions.h"
#include "common/shm_layout.h"
#include "hosted/unique_fd.h"

namespace quanta::arbiter {

// The two words of a control slot the gate protocol moves (ControlSlot::turn and end_at_ns),
// in whichever control region of its GPU the slot's process maps.
struct SlotWords {
  std::atomic<uint32_t>& turn;
  std::atomic<uint64_t>& end_at_ns;
};

struct Gpu {
  uint32_t index = 0;
  GpuInfo info;
  std::string uuid;
  ControlRegionMap region;
  // Processes whose shims map shared-memory layout 2 (pods of the previous release) get
  // their slots in this region instead, made when the first of them attaches here; no
  // layout-3 process maps it. Slot numbers are one space over both regions.
  ControlRegion2Map region2;
  std::bitset<common::kMaxSlotsPerGpu> layout2_slots;  // slots that live in region2
  SlotWords words(SlotId slot) const {
    if (layout2_slots.test(slot)) {
      auto& s = region2->slots[slot];
      return {s.turn, s.end_at_ns};
    }
    auto& s = region->slots[slot];
    return {s.turn, s.end_at_ns};
  }
  // Every control header of the GPU (both regions' carry the same words).
  template <typename F>
  void each_header(F&& f) const {
    f(region->header);
    if (region2) f(region2->header);
  }
  std::unique_ptr<Scheduler> sched;
  // The scheduler's next deadline (CLOCK_MONOTONIC ns; 0: none): the event loop's wait ends
  // there, and after_events sees it fall due.
  uint64_t deadline = 0;
  // How late that deadline may be served (Scheduler::latest_deadline): the loop wakes once
  // for every GPU whose deadline falls before the earliest of these.
  uint64_t latest = 0;
  std::map<SlotId, pid_t> slot_pids;  // admitted slots on this GPU
  // The same slots' gate channels in slot order (rebuilt by Arbiter::index_channels whenever
  // slot_pids changes): a decision pass reads every tenant through it, without a lookup per
  // slot. A channel lives in its pod's region, mapped for as long as the process is admitted.
  struct SlotChannel {
    SlotId slot;
    common::GateChannel* channel;  // the process's, in its pod region
    // What the arbiter sets for it: in the same region (layout 3) or in its control slot
    // (layout 2).
    std::atomic<uint64_t>* quantum_ns;
    std::atomic<uint64_t>* inflight_limit_ns;
  };
  std::vector<SlotChannel> channels;
  bool dirty = true;  // needs a sync from shared memory and a decision
  // When ControlHeader::waiters last became non-zero (read after the store); 0 while none.
  uint64_t waiters_visible_ns = 0;
  // NVML's view at the last poll (exported by status and metrics).
  std::vector<UnmanagedProcess> unmanaged;
  std::map<pid_t, uint64_t> nvml_bytes;            // per admitted pid
  std::map<std::string, uint64_t> pod_nvml_bytes;  // per pod key: its processes and its cgroup's
  std::set<std::string> over_cap;                  // pods above their cap by NVML's count
  std::string nvml_error;
  GpuAccounting accounting;  // who held it when (metrics, quantactl top/explain)
  // Since this arbiter started: grants, and grants to another slot than the last one.
  uint64_t grants = 0;
  uint64_t switches = 0;
  uint64_t doorbells = 0;        // rings by its tenants (each makes the arbiter look at the GPU)
  uint64_t passes = 0;           // syncs of every slot with a decision
  uint64_t holder_looks = 0;     // deadlines served by a look at the holder alone
  uint64_t ended_by_holder = 0;  // turns the holder ended itself (kAttachEndsOwnQuantum)
  // The slot whose ControlSlot::end_at_ns was last published, kNoSlot when none.
  uint32_t end_published = common::kNoSlot;
  uint32_t last_granted = common::kNoSlot;
};

struct Process {
  pid_t pid = 0;
  hosted::UniqueFd pidfd;
  uint32_t pod_index = 0;
  uint32_t proc_index = 0;
  std::string cgroup;
  bool registered = false;           // in a registered container (enforcement applies)
  DeviceGrant devices;               // the GPUs it may attach to
  std::map<uint32_t, SlotId> slots;  // GPU index → slot
  bool connected = false;            // its connection said Hello to this arbiter
};

}  // namespace quanta::arbiter
