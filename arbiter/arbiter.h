// The arbiter daemon's core: the GPUs (control region, scheduler and deadline each), the pods
// and their regions, the admitted processes (pidfd each), start-up with the re-adoption of
// a previous arbiter's regions, the heartbeat, turning scheduler actions into turns, death
// handling, and reconciliation with NVML's per-process view. The tenant and admin sockets
// are servers of their own (tenant_server.h, admin_server.h) that reach this state only
// through TenantApi and AdminApi; metrics, top and explain are observe.cpp's, drains
// admin_drain.cpp's. Errors: see arbiter/README.md.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <bitset>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "arbiter/admission.h"
#include "arbiter/context_overhead.h"
#include "arbiter/loop/event_loop.h"
#include "arbiter/loop/fd_reaper.h"
#include "arbiter/loop/log_limit.h"
#include "arbiter/observing/admin_views.h"
#include "arbiter/observing/gpu_inventory.h"
#include "arbiter/observing/node_view.h"
#include "arbiter/observing/nvml_sampler.h"
#include "arbiter/scheduling/accounting.h"
#include "arbiter/scheduling/scheduler.h"
#include "arbiter/serving/admin_server.h"
#include "arbiter/serving/tenant_server.h"
#include "arbiter/state/device_access.h"
#include "arbiter/state/pod_registry.h"
#include "arbiter/state/region_recovery.h"
#include "arbiter/state/regions.h"
#include "arbiter/state/slot_owner.h"
#include "config/node_config.h"

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
  UniqueFd pidfd;
  uint32_t pod_index = 0;
  uint32_t proc_index = 0;
  std::string cgroup;
  bool registered = false;           // in a registered container (enforcement applies)
  DeviceGrant devices;               // the GPUs it may attach to
  std::map<uint32_t, SlotId> slots;  // GPU index → slot
  bool connected = false;            // its connection said Hello to this arbiter
};

// UUIDs that `quantactl drain` left drained (admin_drain.cpp), re-applied at start.
std::set<std::string> load_drained(const config::NodeConfig& config);
struct Observation;
struct NodeFigures;

class Arbiter final : public TenantApi, public AdminApi {
 public:
  // Discovers the GPUs, re-adopts what a previous arbiter left, binds the sockets. Throws
  // with one clear line on anything that prevents serving (never on a region a tenant
  // could have spoiled: those start afresh with a log line).
  explicit Arbiter(config::NodeConfig config);
  ~Arbiter() override;
  // Serves until SIGTERM/SIGINT (or stop()).
  void run();
  void stop() { loop_.stop(); }

  // AdminApi: one parsed request, one response.
  nlohmann::json handle(const AdminRequest& request) override;
  // The admin protocol from raw JSON (tests): parses, then handle().
  nlohmann::json handle_admin(const nlohmann::json& request);

  // TenantApi.
  Admission admit(const PeerIdentity& peer, const std::string& cgroup,
                  const std::string& claimed_pod, uint32_t layout) override;
  Attachment attach(pid_t pid, const TenantMessage& request) override;
  void refused(const std::string& reason) override { note_refusal(reason); }
  void rang(pid_t pid) override;

  // Read-only views for exporters (metrics).
  const std::vector<std::unique_ptr<Gpu>>& gpus() const { return gpus_; }
  const std::map<pid_t, Process>& processes() const { return processes_; }
  const PodRegistry& pods() const { return pods_; }
  uint64_t generation() const { return generation_; }

 private:
  // arbiter.cpp: start-up and restart recovery, and its steps
  void recover(const SavedState& saved, const std::vector<GpuInfo>& gpus);
  struct PreviousControls {
    bool key_kept = false;  // the state file's slot key: owner words can be matched
    std::map<uint32_t, ControlSnapshot> layout3;  // by GPU index
    std::map<uint32_t, ControlSnapshot> layout2;  // the previous release's pods
  };
  struct Readoption {
    size_t processes = 0;  // live processes re-adopted into their pods
    size_t reclaimed = 0;  // entries of processes gone meanwhile, their memory reclaimed
  };
  RecoveryScan scan_recorded_tenants(const SavedState& saved) const;
  PreviousControls read_previous_controls(const SavedState& saved, const std::vector<GpuInfo>& gpus,
                                          RecoveryScan& scan);
  void make_gpus(const std::vector<GpuInfo>& gpus, uint64_t now);
  Readoption readopt_pods(const SavedState& saved, RecoveryScan& scan);
  void carry_slots(std::map<uint32_t, ControlSnapshot>& old_controls, uint64_t now);
  void carry_layout2_slots(std::map<uint32_t, ControlSnapshot>& old_controls2, uint64_t now);
  void record_node();
  // arbiter.cpp: the loop's work
  void heartbeat();
  // When the loop must wake for the GPUs' deadlines (0: none): at the latest deadline that
  // is still before every GPU's latest, so one wake-up serves all of them that fall there.
  uint64_t shared_wakeup() const;
  void after_events();
  void sync_and_decide(Gpu& gpu);
  // A deadline with nothing else new: true when the holder's hints showed it still busy
  // and the scheduler moved its idle check (no sync of the other slots, no decision).
  bool look_at_holder(Gpu& gpu);
  void apply(Gpu& gpu, const std::vector<Action>& actions);
  void publish_end(Gpu& gpu);
  void on_death(pid_t pid);
  void free_slot(Gpu& gpu, SlotId slot);
  // Makes the GPU's layout-2 control region (Gpu::region2) if it has none yet.
  void open_region2(Gpu& gpu);
  void index_channels(Gpu& gpu);
  // The gate channel of `slot` on `gpu` (nullptr when the slot is not admitted there).
  static const common::GateChannel* channel_of(const Gpu& gpu, SlotId slot);
  static const Gpu::SlotChannel* slot_channel(const Gpu& gpu, SlotId slot);
  uint32_t owner_of(const Process& proc, uint32_t gpu_index) const;
  void reclaim_memory(Pod& pod, uint32_t proc_index);
  void apply_policy(Pod& pod);
  void fill_slot(Gpu& gpu, SlotId slot, const Process& proc, const Pod& pod);
  // A slot of the previous arbiter's control region, carried over to re-adopted `proc`
  // with the turn it had (an odd turn: it held the grant). The slot's layout is set first.
  void carry_slot(Gpu& gpu, SlotId slot, Process& proc, const Pod& pod, uint32_t turn,
                  uint64_t now);
  void watch_process(Process& proc);
  common::GateChannel& channel(const Process& proc, uint32_t gpu_index);
  Gpu* gpu_by_uuid(const std::string& uuid);
  std::string managed_list() const;
  // nvml_reconcile.cpp
  void reconcile(const std::vector<GpuReading>& readings);
  // admin_handlers.cpp
  nlohmann::json status_json();
  NodeStatus status_of_node(uint64_t now) const;
  GpuStatus status_of_gpu(const Gpu& gpu, uint64_t now) const;
  nlohmann::json set_policy(const AdminRequest& request);
  nlohmann::json unset_policy(const AdminRequest& request);
  nlohmann::json policy_json(const AdminRequest& request) const;
  std::string pod_named(const std::string& wanted, std::string* error) const;
  nlohmann::json register_container(const AdminRequest& request);
  nlohmann::json unregister_container(const AdminRequest& request);
  nlohmann::json node_devices_json() const;
  nlohmann::json context_overhead_json() const;
  // admin_drain.cpp
  nlohmann::json handle_drain(const AdminRequest& request, bool on);
  void save_drained() const;

  // observe.cpp: metrics endpoint, history tick, and the view the figures, top and explain
  // are worked out from (figures.cpp, admin_views.cpp)
  void start_observation();
  void observation_tick();
  void charge_nvml_busy();
  // Live state at `now` as the observing side reads it: accounting brought up to `now`,
  // NVML's busy time charged, no other change.
  NodeView view_node(uint64_t now);
  GpuView view_gpu(Gpu& gpu, const std::vector<GpuReading>* readings, uint64_t now);
  std::shared_ptr<const NodeFigures> take_figures(uint64_t now);
  void note_refusal(const std::string& reason);
  std::string metrics_address() const;  // "HOST:PORT" served, "" when not

  config::NodeConfig config_;
  EventLoop loop_;
  FdReaper reaper_;
  LogLimiter tenant_log_;
  PodRegistry pods_;
  std::vector<std::unique_ptr<Gpu>> gpus_;
  std::vector<GpuInfo> gpu_info_;   // the GPUs it manages ([node] gpus, or all)
  std::vector<GpuInfo> node_gpus_;  // every GPU NVML lists, for the hook's device names
  // Bytes every shim charges per context: [shim] context_overhead, or measured at start.
  uint64_t context_overhead_ = 0;
  ContextOverheads context_overheads_;
  // Pods whose layout-2 regions this arbiter re-adopted at start (placed by the previous
  // release): the only pods a process of shared-memory layout 2 may start a region for.
  std::set<std::string> previous_release_pods_;
  // Keys the control slots' owner words (slot_owner.h); kept across restarts in the state file.
  SlotKey slot_key_{};
  std::map<pid_t, Process> processes_;
  std::unique_ptr<TenantServer> tenants_;
  std::unique_ptr<AdminServer> admin_;
  std::unique_ptr<NvmlSampler> nvml_;  // NVML's process view: reconciliation and metrics
  UniqueFd signal_fd_;
  UniqueFd lock_fd_;
  Timer heartbeat_timer_;
  uint64_t generation_ = 0;
  uint64_t started_ns_ = 0;
  std::unique_ptr<Observation> observation_;  // last: stopped first
};

}  // namespace quanta::arbiter
