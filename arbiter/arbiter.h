// The arbiter daemon's core: the GPUs (control region, scheduler and deadline each), the pods
// and their regions, the admitted processes (pidfd each), start-up with the re-adoption of
// a previous arbiter's regions, the heartbeat, turning scheduler actions into turns, death
// handling, and reconciliation with NVML's per-process view. The state itself (Gpu, Process)
// is node_state.h's. The sockets are servers of their own (tenant_server.h, admin_server.h):
// the tenant server reaches the core through TenantApi, the admin server through the
// AdminService (serving/admin_service.h), which changes the registry itself and asks the core
// for the rest through NodeControl. Status, metrics, top and explain are the Observer's
// (observing/observer.h), which reads the state through ObservedNode. Errors: see
// arbiter/README.md.
#pragma once

#include <sys/types.h>

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
#include "arbiter/node_state.h"
#include "arbiter/observing/gpu_inventory.h"
#include "arbiter/observing/nvml_sampler.h"
#include "arbiter/serving/admin_server.h"
#include "arbiter/serving/admin_service.h"
#include "arbiter/serving/tenant_server.h"
#include "arbiter/state/pod_registry.h"
#include "arbiter/state/region_recovery.h"
#include "arbiter/state/regions.h"
#include "arbiter/state/slot_owner.h"
#include "config/node_config.h"

namespace quanta::arbiter {

class Observer;

class Arbiter final : public TenantApi, public NodeControl {
 public:
  // Discovers the GPUs, re-adopts what a previous arbiter left, binds the sockets. Throws
  // with one clear line on anything that prevents serving (never on a region a tenant
  // could have spoiled: those start afresh with a log line).
  explicit Arbiter(config::NodeConfig config);
  ~Arbiter() override;
  // Serves until SIGTERM/SIGINT (or stop()).
  void run();
  void stop() { loop_.stop(); }

  // What the admin socket serves (tests ask it directly).
  AdminService& admin() { return *admin_service_; }

  // TenantApi.
  Admission admit(const PeerIdentity& peer, const std::string& cgroup,
                  const std::string& claimed_pod, uint32_t layout) override;
  Attachment attach(pid_t pid, const TenantMessage& request) override;
  void refused(const std::string& reason) override;
  void rang(pid_t pid) override;

  // NodeControl: what an admin change does to the schedulers and slots.
  void policy_changed(const std::string& pod_key) override;
  void set_draining(uint32_t gpu_index, bool on) override;

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
  // nvml_reconcile.cpp: per GPU, NVML's processes attributed to pods, then each pod over
  // its cap reported, denied or killed, and each pod back under it given its cap again
  void reconcile(const std::vector<GpuReading>& readings);
  // Fills the GPU's NVML figures; returns the pids NVML lists for each pod.
  std::map<std::string, std::vector<pid_t>> attribute_processes(
      Gpu& gpu, const std::vector<NvmlProcess>& listed);
  void act_over_cap(Gpu& gpu, const std::string& key, const std::vector<pid_t>& pids,
                    uint64_t now);
  void restore_caps(Gpu& gpu, const std::set<std::string>& over);
  // What the shims charge per context and where the figure came from (status).
  nlohmann::json context_overhead_json() const;

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
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<AdminServer> admin_;
  std::unique_ptr<NvmlSampler> nvml_;  // NVML's process view: reconciliation and metrics
  UniqueFd signal_fd_;
  UniqueFd lock_fd_;
  Timer heartbeat_timer_;
  uint64_t generation_ = 0;
  uint64_t started_ns_ = 0;
  // Metrics, history, top and explain; declared last, so destroyed first.
  std::unique_ptr<Observer> observer_;
};

}  // namespace quanta::arbiter
