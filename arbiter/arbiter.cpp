// The arbiter's core: start-up (GPU discovery, re-adoption of a previous arbiter's regions
// through its tenants' mappings), the heartbeat, turning scheduler actions into turns in
// the control regions, admission and attachment behind TenantApi, and death handling
// (grant taken back, slot freed, memory returned to the pod ledger).
#include "arbiter/arbiter.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/sdt.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "arbiter/loop/death_watch.h"
#include "arbiter/loop/unix_socket.h"
#include "arbiter/observing/gpu_inventory.h"
#include "arbiter/observing/observer.h"
#include "arbiter/state/region_recovery.h"
#include "common/clock.h"
#include "common/futex.h"
#include "hosted/names.h"

namespace quanta::arbiter {

using common::monotonic_ns;

namespace {

constexpr int kRecoveryDeadlineMs = 1500;
// How long measuring one GPU model's context cost may take (a context's creation takes
// well under a second; a wedged driver must not stop the arbiter from starting).
constexpr int kContextMeasureTimeoutMs = 20'000;
// Registrations whose cgroup one heartbeat looks at (a stat each): a full registry is
// gone through in a few seconds at the default lease.
constexpr size_t kRegistrationsReapedPerBeat = 256;

SchedulerOptions scheduler_options(const config::SchedulerConfig& c) {
  SchedulerOptions o;
  static_cast<config::SchedulerConfig&>(o) = c;
  return o;
}

// `wake`: false only for a revoke the holder's shim released ahead (it ended its own turn
// and waits for nothing; its blocked launchers wait for the next grant, which wakes them).
void bump_turn(SlotWords slot, bool wake = true) {
  slot.end_at_ns.store(0, std::memory_order_relaxed);  // before the turn it belongs to moves
  slot.turn.fetch_add(1, std::memory_order_acq_rel);
  if (wake) common::futex_wake(&slot.turn, INT_MAX);
}

// Named regions under /dev/shm are what arbiters before sealed memfds left; tenants that
// still map them move to the new regions when they reconnect.
void remove_named_regions(const std::string& scope) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    for (const char* kind : {".gpu.", ".pod."}) {
      const std::string prefix = scope + kind;
      if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() ||
          name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
        continue;
      std::filesystem::remove(entry.path(), ec);
      spdlog::warn(
          "removed /dev/shm/{}, a region file of an older arbiter: its tenants are "
          "admitted afresh when they reconnect",
          hosted::printable(name));
    }
  }
}

}  // namespace

Arbiter::Arbiter(config::NodeConfig config)
    : config_(std::move(config)), tenant_log_(20, 10 * common::kNsPerSec), pods_(config_) {
  started_ns_ = monotonic_ns();
  pods_.close_replaced_with([this](int fd) { reaper_.close_later(fd); });
  std::error_code ec;
  std::filesystem::create_directories(config_.state_dir, ec);
  std::string lock_path = config_.state_dir + "/" + config_.scope + ".lock";
  lock_fd_.reset(::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
  if (!lock_fd_) throw_errno("cannot open " + lock_path);
  if (flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    throw std::runtime_error("another quanta-arbiter with scope \"" + config_.scope +
                             "\" is running (it holds " + lock_path + ")");
  }
  const SavedState saved = pods_.load_state();

  node_gpus_ = discover_gpu_info({});
  gpu_info_ = config_.gpus.empty() ? node_gpus_ : discover_gpu_info(config_.gpus);
  if (gpu_info_.empty()) throw std::runtime_error("NVML reports no GPU to manage");
  if (gpu_info_.size() > common::kMaxGpus) {
    throw std::runtime_error("NVML reports " + std::to_string(gpu_info_.size()) +
                             " devices; at most " + std::to_string(common::kMaxGpus) +
                             " can be managed: list them in [node] gpus");
  }
  context_overhead_ = config_.shim.context_overhead;
  if (config_.shim.measure_context_overhead) {
    context_overheads_ = measure_context_overheads(gpu_info_, kContextMeasureTimeoutMs);
    context_overhead_ = context_overheads_.charge;
    for (const auto& [model, bytes] : context_overheads_.bytes_by_model)
      spdlog::info("a CUDA context takes {} bytes on {} by NVML's count", bytes,
                   hosted::printable(model));
    for (const std::string& e : context_overheads_.errors)
      spdlog::warn("cannot measure a context's cost on {}", hosted::printable(e));
    spdlog::info("shims charge {} bytes per CUDA context{}", context_overhead_,
                 context_overheads_.bytes_by_model.empty()
                     ? " (nothing measured: set [shim] context_overhead to your GPUs' figure)"
                     : "");
  }
  remove_named_regions(config_.scope);
  recover(saved, gpu_info_);

  // Signals arrive through the loop, so shutdown never interrupts a half-applied decision.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal_fd_.reset(signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_) throw_errno("signalfd");
  loop_.add(signal_fd_.get(), [this](uint32_t) {
    signalfd_siginfo info{};
    ssize_t r = ::read(signal_fd_.get(), &info, sizeof(info));
    (void)r;
    spdlog::info(
        "signal {} received: stopping (tenants keep their regions; a restart re-adopts them)",
        info.ssi_signo);
    loop_.stop();
  });

  // Test switches for the paths older kernels take (arbiter/README.md).
  const bool peer_pidfd = std::getenv("QUANTA_ARBITER_NO_PEERPIDFD") == nullptr;
  TenantLimits limits;
  limits.accept_rights = std::getenv("QUANTA_ARBITER_NO_PASSRIGHTS") != nullptr;
  tenants_ = std::make_unique<TenantServer>(loop_, *this, reaper_, tenant_log_,
                                            config_.tenant_socket, limits, peer_pidfd);
  {
    const std::string tenant_dir =
        config_.tenant_socket.substr(0, config_.tenant_socket.rfind('/') + 1);
    if (config_.admin_socket.rfind(tenant_dir, 0) == 0)
      spdlog::warn(
          "[node] admin_socket {} is in the tenant socket's folder {}, which every GPU "
          "container mounts: containers see it (the socket refuses them); give it a "
          "folder of its own (\"/run/quanta-admin/admin.sock\")",
          config_.admin_socket, tenant_dir);
  }

  loop_.set_next_deadline([this] { return shared_wakeup(); });
  loop_.add(heartbeat_timer_.fd(), [this](uint32_t) {
    heartbeat_timer_.acknowledge();
    heartbeat();
  });
  std::vector<std::string> uuids;
  for (const auto& g : gpus_) uuids.push_back(g->uuid);
  nvml_ = std::make_unique<NvmlSampler>(uuids, config_.nvml_interval_ns);
  loop_.add(nvml_->fd(), [this](uint32_t) {
    nvml_->acknowledge();
    if (auto readings = nvml_->latest()) reconcile(*readings);
  });
  loop_.set_after_events([this] { after_events(); });
  heartbeat();
  observer_ = std::make_unique<Observer>(
      loop_, ObservedNode{config_, gpus_, processes_, pods_, *nvml_, generation_, started_ns_,
                          context_overhead_json(),
                          [this] { return tenants_ ? tenants_->connections() : size_t{0}; }});
  admin_service_ =
      std::make_unique<AdminService>(config_, pods_, gpus_, node_gpus_, *observer_, *this);
  admin_ = std::make_unique<AdminServer>(loop_, *admin_service_, reaper_, config_.admin_socket);

  spdlog::info("quanta-arbiter generation {} serving {} GPU(s) [{}] on {} (admin {}), scope \"{}\"",
               generation_, gpus_.size(), managed_list(), config_.tenant_socket,
               config_.admin_socket, config_.scope);
}

Arbiter::~Arbiter() {
  observer_.reset();  // its endpoint's thread reads nothing of ours, but stop it first
  // A clean stop lets tenants lapse to ungated launches now rather than after the lease:
  // zero the heartbeat and wake every launcher blocked at a gate so it notices. A restart
  // brings gating back as each tenant reconnects; grants carry over to the new regions.
  for (auto& gpu : gpus_) {
    gpu->each_header(
        [](common::ControlHeader& h) { h.heartbeat_ns.store(0, std::memory_order_release); });
    for (const auto& [slot, pid] : gpu->slot_pids)
      common::futex_wake(&gpu->words(slot).turn, INT_MAX);
  }
  if (nvml_) loop_.remove(nvml_->fd());
  nvml_.reset();
  tenants_.reset();
  admin_.reset();
  pods_.save_state();
}

void Arbiter::run() {
  after_events();
  loop_.run();
}

void Arbiter::record_node() {
  std::map<uint32_t, SavedGpu> gpus;
  for (const auto& g : gpus_) {
    // The layout-2 region first: a release that reads one region per GPU reads that one.
    SavedGpu saved{g->uuid, {}};
    if (g->region2) saved.inodes.push_back(g->region2.inode());
    saved.inodes.push_back(g->region.inode());
    gpus[g->index] = std::move(saved);
  }
  pods_.set_node_record(generation_, std::move(gpus), slot_key_text(slot_key_));
  pods_.save_state();
}

// Restart recovery, in order: find what the recorded tenants map, read the previous control
// regions, make this generation's GPUs, re-adopt pods and their live processes, carry their
// slots and grants over (layout 3, then the previous release's layout 2), then watch them.
void Arbiter::recover(const SavedState& saved, const std::vector<GpuInfo>& gpus) {
  const uint64_t now = monotonic_ns();
  RecoveryScan scan = scan_recorded_tenants(saved);
  PreviousControls previous = read_previous_controls(saved, gpus, scan);
  make_gpus(gpus, now);
  const Readoption readopted = readopt_pods(saved, scan);
  if (previous.key_kept) carry_slots(previous.layout3, now);
  carry_layout2_slots(previous.layout2, now);
  for (auto& [pid, proc] : processes_) watch_process(proc);
  std::vector<uint32_t> unused;
  for (const auto& [index, pod] : pods_.pods()) {
    if (pod.processes() == 0) unused.push_back(index);
  }
  for (uint32_t index : unused) pods_.release_if_unused(index);
  record_node();
  if (readopted.processes != 0 || readopted.reclaimed != 0 || !saved.pods.empty()) {
    spdlog::info(
        "re-adopted {} live process(es) in {} pod region(s) through their mappings; "
        "reclaimed the memory of {} that exited meanwhile",
        readopted.processes, pods_.pods().size(), readopted.reclaimed);
  }
}

RecoveryScan Arbiter::scan_recorded_tenants(const SavedState& saved) const {
  std::vector<pid_t> pids;
  for (const auto& [index, pod] : saved.pods)
    pids.insert(pids.end(), pod.pids.begin(), pod.pids.end());
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  RecoveryScan scan = scan_tenant_mappings(config_.scope, pids, kRecoveryDeadlineMs);
  for (pid_t pid : scan.unanswered) {
    spdlog::error(
        "pid {} did not let its memory maps be read within {} ms: its regions are not "
        "re-adopted; it is admitted afresh when it reconnects",
        pid, kRecoveryDeadlineMs);
  }
  for (const auto& [inode, f] : scan.regions) {
    spdlog::debug("recovery: pid {} maps {} (inode {}){}", f.pid, hosted::printable(f.name), inode,
                  f.fd ? "" : ", which could not be reopened");
  }
  return scan;
}

// The previous generation's control regions, read-only, to carry slots and grants over;
// their owner words were made with the key the state file kept. Sets this generation.
Arbiter::PreviousControls Arbiter::read_previous_controls(const SavedState& saved,
                                                          const std::vector<GpuInfo>& gpus,
                                                          RecoveryScan& scan) {
  PreviousControls previous;
  previous.key_kept = parse_slot_key(saved.slot_key, &slot_key_);
  if (!previous.key_kept) slot_key_ = new_slot_key();
  generation_ = saved.generation;
  for (const auto& [index, g] : saved.gpus) {
    if (index >= gpus.size() || g.uuid != gpus[index].uuid) continue;
    for (uint64_t inode : g.inodes) {
      FoundRegion* f = recorded_region(scan, inode, control_region_name(config_.scope, index));
      if (f == nullptr) continue;
      std::string why;
      ControlSnapshot snap(f->fd, &why);
      if (!snap || snap.get()->header.gpu_index != index ||
          std::strncmp(snap.get()->header.uuid, g.uuid.c_str(), common::kUuidLen) != 0) {
        spdlog::warn(
            "a previous control region of GPU {} is not usable ({}): its grants start afresh",
            index, why.empty() ? "another GPU's" : why);
        continue;
      }
      generation_ = std::max(generation_, snap.get()->header.arbiter_generation.load());
      auto& into = snap.layout() == common::layout2::kVersion ? previous.layout2 : previous.layout3;
      into[index] = std::move(snap);
    }
  }
  ++generation_;
  return previous;
}

// This generation's GPUs, each with a fresh control region; drained GPUs stay drained.
void Arbiter::make_gpus(const std::vector<GpuInfo>& gpus, uint64_t now) {
  const std::set<std::string> drained = load_drained(config_);
  for (uint32_t i = 0; i < gpus.size(); ++i) {
    auto gpu = std::make_unique<Gpu>();
    gpu->index = i;
    gpu->info = gpus[i];
    gpu->uuid = gpus[i].uuid;
    gpu->region = ControlRegionMap::create(control_region_name(config_.scope, i));
    common::ControlHeader& h = gpu->region->header;
    h.gpu_index = i;
    std::strncpy(h.uuid, gpu->uuid.c_str(), common::kUuidLen - 1);
    h.holder.store(common::kNoSlot);
    h.arbiter_generation.store(generation_);
    h.lease_ns.store(config_.scheduler.lease_ns);
    h.idle_release_ns.store(config_.scheduler.idle_release_ns);
    h.heartbeat_ns.store(now);
    gpu->sched = std::make_unique<Scheduler>(scheduler_options(config_.scheduler));
    if (drained.count(gpu->uuid) != 0) {
      gpu->sched->set_draining(true);
      spdlog::warn("GPU {} {} stays drained (quantactl undrain {} resumes grants)", i, gpu->uuid,
                   i);
    }
    gpus_.push_back(std::move(gpu));
  }
}

// Pod regions: only those the state file recorded, found with the recorded inode, name
// and tag. Anything else a tenant maps is not ours and is never looked at.
Arbiter::Readoption Arbiter::readopt_pods(const SavedState& saved, RecoveryScan& scan) {
  Readoption counts;
  for (const auto& [index, saved_pod] : saved.pods) {
    FoundRegion* f = recorded_region(scan, saved_pod.inode, pod_region_name(config_.scope, index));
    if (f == nullptr) continue;  // every process of it exited: the region is gone
    Pod* pod = nullptr;
    try {
      pod = &pods_.adopt(index, std::move(f->fd), saved_pod);
    } catch (const RegionError& e) {
      spdlog::error("not re-adopting the region of pod {}: {}; its processes are admitted afresh",
                    hosted::printable(saved_pod.key), e.what());
      continue;
    }
    if (pod->region.layout() == common::layout2::kVersion) previous_release_pods_.insert(pod->key);
    const std::set<pid_t> recorded(saved_pod.pids.begin(), saved_pod.pids.end());
    const std::set<pid_t> unanswered(scan.unanswered.begin(), scan.unanswered.end());
    for (uint32_t pi = 0; pi < common::kMaxProcsPerPod; ++pi) {
      const pid_t pid = static_cast<pid_t>(pod->region.pid(pi).load());
      if (pid == 0) continue;
      // The entry is tenant-writable: entry_fate adopts only a process this arbiter admitted
      // into this pod, alive, that maps this very region.
      EntryFacts facts;
      facts.recorded = recorded.count(pid) != 0;
      facts.unanswered = unanswered.count(pid) != 0;
      UniqueFd pidfd = facts.recorded && !facts.unanswered ? open_pidfd(pid) : UniqueFd();
      auto maps = scan.mapped_by.find(pid);
      facts.alive = static_cast<bool>(pidfd);
      facts.adopted_already = processes_.count(pid) != 0;
      facts.maps_region =
          maps != scan.mapped_by.end() && maps->second.count(pod->region.inode()) != 0;
      const EntryFate fate = entry_fate(facts);
      if (fate == EntryFate::kKeepCounted) {
        pod->entries.set(pi);  // alive but unreadable: its memory stays counted (never under)
        continue;
      }
      if (fate == EntryFate::kReclaim) {
        if (pidfd) {
          spdlog::warn("pod {} lists pid {}, which does not map its region: entry cleared",
                       hosted::printable(pod->key), pid);
        }
        reclaim_memory(*pod, pi);
        ++counts.reclaimed;
        continue;
      }
      Process& proc = processes_[pid];
      proc.pid = pid;
      proc.pidfd = std::move(pidfd);
      proc.pod_index = index;
      proc.proc_index = pi;
      proc.cgroup = cgroup_of(pid);
      const Registration* reg = pods_.match_cgroup(proc.cgroup);
      proc.registered = reg != nullptr && reg->pod_key() == pod->key;
      proc.devices = devices_granted(proc.registered ? reg : nullptr, pid, gpu_info_);
      // A state file from before claimers were recorded: the pod's own processes' cgroup
      // is the one to count it against.
      if (!pod->registered && pod->claimed_from.empty()) pod->claimed_from = proc.cgroup;
      pod->entries.set(pi);
      pod->pids.insert(pid);
      ++counts.processes;
    }
  }

  return counts;
}

// Slots and grants, from the previous control regions, for the processes re-adopted: a
// process's slot is the one whose owner word is its own (slot_owner.h), so no tenant can
// choose which slot, or whose grant, it inherits.
void Arbiter::carry_slots(std::map<uint32_t, ControlSnapshot>& old_controls, uint64_t now) {
  for (auto& [index, snap] : old_controls) {
    Gpu& gpu = *gpus_[index];
    const common::ControlRegion& old = *snap.get();
    common::ControlRegion& region = *gpu.region.get();
    const std::map<uint32_t, SlotId> by_owner = slots_by_owner(old);
    for (auto& [pid, proc] : processes_) {
      auto found_slot = by_owner.find(owner_of(proc, index));
      if (found_slot == by_owner.end() || proc.slots.count(index) != 0 ||
          gpu.slot_pids.count(found_slot->second) != 0)
        continue;
      const SlotId s = found_slot->second;
      Pod& pod = *pods_.find(proc.pod_index);
      if (pod.region.layout() != common::kLayoutVersion) continue;
      carry_slot(gpu, s, proc, pod, old.slots[s].turn.load(), now);
    }
    auto holder = gpu.sched->holder();
    region.header.holder.store(holder ? *holder : common::kNoSlot);
  }
}

// Layout-2 slots (pods of the previous release), from its control regions: there each slot
// names its process, as that release's arbiter found them.
void Arbiter::carry_layout2_slots(std::map<uint32_t, ControlSnapshot>& old_controls2,
                                  uint64_t now) {
  for (auto& [index, snap] : old_controls2) {
    Gpu& gpu = *gpus_[index];
    const common::layout2::ControlRegion& old = *snap.get2();
    for (SlotId s = 0; s < common::kMaxSlotsPerGpu; ++s) {
      const common::layout2::ControlSlot& was = old.slots[s];
      const pid_t pid = static_cast<pid_t>(was.pid.load());
      auto it = pid == 0 ? processes_.end() : processes_.find(pid);
      if (it == processes_.end() || it->second.pod_index != was.pod_index.load() ||
          it->second.proc_index != was.proc_index.load() || it->second.slots.count(index) != 0 ||
          gpu.slot_pids.count(s) != 0)
        continue;
      Process& proc = it->second;
      Pod& pod = *pods_.find(proc.pod_index);
      if (pod.region.layout() != common::layout2::kVersion) continue;
      try {
        open_region2(gpu);
      } catch (const RegionError& e) {
        spdlog::error(
            "no control region of shared-memory layout 2 on GPU {}: {}; its layout-2 "
            "processes attach afresh when they reconnect",
            index, e.what());
        break;
      }
      gpu.layout2_slots.set(s);
      carry_slot(gpu, s, proc, pod, was.turn.load(), now);
    }
    auto holder = gpu.sched->holder();
    gpu.each_header(
        [&](common::ControlHeader& h) { h.holder.store(holder ? *holder : common::kNoSlot); });
  }
}

void Arbiter::carry_slot(Gpu& gpu, SlotId slot, Process& proc, const Pod& pod, uint32_t turn,
                         uint64_t now) {
  proc.slots[gpu.index] = slot;
  gpu.slot_pids[slot] = proc.pid;
  index_channels(gpu);
  gpu.sched->set_pod_policy(pod.index, pod.policy);
  gpu.sched->add_tenant(slot, pod.index, now);
  gpu.accounting.add_tenant(slot, pod.key, now);
  // The tenant switches to the new region when it re-attaches: the same turn keeps its
  // place (odd: it held the grant when the last arbiter stopped).
  const SlotWords words = gpu.words(slot);
  words.turn.store(turn);
  fill_slot(gpu, slot, proc, pod);
  if ((turn & 1u) && !gpu.sched->adopt_holder(slot, now)) bump_turn(words);
}

void Arbiter::watch_process(Process& proc) {
  pid_t pid = proc.pid;
  loop_.add(proc.pidfd.get(), [this, pid](uint32_t) { on_death(pid); });
}

Admission Arbiter::admit(const PeerIdentity& peer, const std::string& cgroup,
                         const std::string& claimed_pod, uint32_t layout) {
  const pid_t pid = peer.pid;
  Admission out;
  auto refuse = [&](std::string reason, common::RefusedAction action) {
    out.admitted = false;
    out.reason = std::move(reason);
    out.action = action;
    return out;
  };
  auto existing = processes_.find(pid);
  if (existing != processes_.end()) {
    // The same pid as an admitted process: the same process only while that one lives.
    pollfd p{existing->second.pidfd.get(), POLLIN, 0};
    if (poll(&p, 1, 0) != 0) {
      on_death(pid);
      existing = processes_.end();
    }
  }
  const bool fresh_entry = existing == processes_.end();
  if (fresh_entry) {
    const PodChoice choice =
        choose_pod({pid, cgroup, claimed_pod, layout}, pods_, config_, previous_release_pods_);
    if (choice.refusal) return refuse(choice.refusal->reason, choice.refusal->action);
    const std::string& key = choice.key;
    UniqueFd pidfd(fcntl(peer.pidfd.get(), F_DUPFD_CLOEXEC, 3));
    if (!pidfd)
      return refuse("pid " + std::to_string(pid) + " could not be watched", choice.action);
    Pod* pod = nullptr;
    try {
      pod = &pods_.get_or_create(key, choice.registration != nullptr, cgroup, layout);
    } catch (const std::exception& e) {
      return refuse("no region for pod " + key + ": " + e.what(), choice.action);
    }
    if (auto refused = join_refusal(key, pod->region.layout(), pod->entries, layout)) {
      return refuse(std::move(*refused), choice.action);
    }
    const uint32_t proc_index = free_entry(pod->entries);
    for (uint32_t g = 0; g < common::kMaxGpus; ++g) {
      std::memset(static_cast<void*>(&pod->region.channel(proc_index, g)), 0,
                  sizeof(common::GateChannel));
      if (common::GateLimits* limits = pod->region.limits(proc_index, g)) {
        std::memset(static_cast<void*>(limits), 0, sizeof(common::GateLimits));
        limits->slot.store(common::kNoSlot, std::memory_order_relaxed);
      }
    }
    pod->region.pid(proc_index).store(static_cast<uint32_t>(pid), std::memory_order_release);
    pod->entries.set(proc_index);
    pod->pids.insert(pid);
    Process& p = processes_[pid];
    p.pid = pid;
    p.pidfd = std::move(pidfd);
    p.pod_index = pod->index;
    p.proc_index = proc_index;
    p.cgroup = cgroup;
    p.registered = choice.registration != nullptr;
    p.devices = devices_granted(choice.registration, pid, gpu_info_);
    watch_process(p);
    pods_.save_state();
    existing = processes_.find(pid);
    tenant_log_.log(spdlog::level::info, "admit", monotonic_ns(),
                    "admitted pid {} into pod {} (pod region {}, entry {})", pid,
                    hosted::printable(key), pod->index, proc_index);
  }
  Process& proc = existing->second;
  Pod& pod = *pods_.find(proc.pod_index);
  if (auto refused = hello_refusal(pid, pod.region.layout(), layout)) {
    return refuse(std::move(*refused),
                  unplaced_action(config_.enforce.unplaced, proc.registered, &pod.policy));
  }
  proc.connected = true;
  out.admitted = true;
  out.pod_index = proc.pod_index;
  out.proc_index = proc.proc_index;
  out.pod_key = pod.key;
  out.pod_fd = pod.region.tenant_fd();
  out.generation = generation_;
  // Enforcement binds registered containers; development processes keep their variables.
  out.flags = config_.enforce.enforce && proc.registered ? common::kWelcomeEnforced : 0;
  if (fresh_entry) out.flags |= common::kWelcomeFreshEntry;
  out.count_managed = config_.shim.count_managed ? 1 : 0;
  out.context_overhead = context_overhead_;
  return out;
}

Attachment Arbiter::attach(pid_t pid, const TenantMessage& request) {
  const std::string& uuid = request.uuid;
  Attachment out;
  auto it = processes_.find(pid);
  if (it == processes_.end()) {
    out.reason = "pid " + std::to_string(pid) + " is not admitted";
    return out;
  }
  Process& proc = it->second;
  Pod& pod = *pods_.find(proc.pod_index);
  const common::RefusedAction action =
      unplaced_action(config_.enforce.unplaced, proc.registered, &pod.policy);
  Gpu* gpu = gpu_by_uuid(uuid);
  if (gpu == nullptr) {
    out.reason = "GPU " + hosted::printable(uuid) + " is not managed by this arbiter; it manages " +
                 managed_list();
    out.action = action;
    return out;
  }
  if (auto refused = device_refusal(proc.devices, gpu->uuid)) {
    out.reason = std::move(*refused);
    out.action = action;
    tenant_log_.log(spdlog::level::warn, "attach-refused", monotonic_ns(),
                    "pid {} of pod {} asked for {}: {}", pid, hosted::printable(pod.key), gpu->uuid,
                    out.reason);
    return out;
  }
  if (request.observe) {  // memory views only: no slot, never a tenant of the scheduler
    out.attached = true;
    out.gpu_index = gpu->index;
    out.slot = common::kNoSlot;
    out.memory_cap = pod.policy.memory_limit;
    return out;
  }
  auto have = proc.slots.find(gpu->index);
  SlotId slot;
  if (have != proc.slots.end()) {
    slot = have->second;
  } else {
    slot = first_free_slot(gpu->slot_pids);
    if (slot == common::kNoSlot) {
      out.reason = "GPU " + gpu->uuid + " already has " + std::to_string(common::kMaxSlotsPerGpu) +
                   " tenants";
      out.action = action;
      return out;
    }
    if (pod.region.layout() == common::layout2::kVersion) {
      try {
        open_region2(*gpu);
      } catch (const RegionError& e) {
        out.reason =
            "no control region of shared-memory layout 2 on GPU " + gpu->uuid + ": " + e.what();
        out.action = action;
        return out;
      }
      gpu->layout2_slots.set(slot);
    }
    proc.slots[gpu->index] = slot;
    gpu->slot_pids[slot] = proc.pid;
    index_channels(*gpu);
    gpu->sched->set_pod_policy(pod.index, pod.policy);
    gpu->sched->add_tenant(slot, pod.index, monotonic_ns());
    gpu->accounting.add_tenant(slot, pod.key, monotonic_ns());
    fill_slot(*gpu, slot, proc, pod);
    gpu->dirty = true;
    tenant_log_.log(spdlog::level::info, "attach", monotonic_ns(),
                    "pid {} of pod {} attached to GPU {} as slot {}", proc.pid,
                    hosted::printable(pod.key), gpu->uuid, slot);
  }
  // Also on a re-attach (after an arbiter restart, or by a newer shim in the same slot).
  gpu->sched->set_reports_quiet(slot, request.reports_quiet);
  gpu->sched->set_reports_unused_grant(slot, request.reports_unused_grant);
  gpu->sched->set_ends_own_quantum(slot, request.ends_own_quantum);
  out.attached = true;
  out.gpu_index = gpu->index;
  out.slot = slot;
  if (gpu->layout2_slots.test(slot)) {
    out.control_fd = gpu->region2.tenant_fd();  // its slot names it: no owner word in layout 2
  } else {
    out.owner = owner_of(proc, gpu->index);
    out.control_fd = gpu->region.tenant_fd();
  }
  out.memory_cap = pod.policy.memory_limit;
  return out;
}

void Arbiter::refused(const std::string& reason) {
  if (observer_) observer_->refused(reason);
}

void Arbiter::rang(pid_t pid) {
  auto p = processes_.find(pid);
  if (p == processes_.end()) return;
  for (const auto& [gpu_index, slot] : p->second.slots) {
    gpus_[gpu_index]->dirty = true;
    ++gpus_[gpu_index]->doorbells;
  }
}

void Arbiter::heartbeat() {
  const uint64_t now = monotonic_ns();
  for (auto& gpu : gpus_) {
    gpu->each_header([&](common::ControlHeader& h) {
      h.lease_ns.store(config_.scheduler.lease_ns);
      h.idle_release_ns.store(config_.scheduler.idle_release_ns);
      h.heartbeat_ns.store(now);
    });
    gpu->dirty = true;  // also catches wants of re-adopted tenants that have no doorbell yet
  }
  // Files an operator's cleanup (or a root tenant that reaches the socket's folder) may
  // have removed: new processes must still find the arbiter, and a crash must still find
  // the pods' regions.
  if (tenants_) tenants_->keep_listening();
  if (admin_) admin_->keep_listening();
  // Containers that ended without their poststop hook lose their registrations (and the
  // promises they held), a few hundred looked at per beat.
  const std::set<std::string> reaped = pods_.reap_dead_registrations(kRegistrationsReapedPerBeat);
  for (const std::string& key : reaped) {
    if (Pod* pod = pods_.find_key(key)) apply_policy(*pod);
  }
  if (!reaped.empty()) {
    pods_.save_state();
  } else if (pods_.state_file_changed()) {
    spdlog::warn("the state file in {} was removed or changed by someone else: writing it again",
                 config_.state_dir);
    pods_.save_state();
  }
  heartbeat_timer_.arm_at(now + config_.scheduler.lease_ns / 4);
}

namespace {

// The tenant's last launch as the scheduler reads it. The shim stamps last_launch_ns at
// every launch only while it sees waiters published (otherwise once per coarse clock tick,
// to keep launches cheap), so launches before the publication count as made at it: a holder
// is idle only after idle_release without a launch since others were seen waiting.
uint64_t last_launch(const Gpu& gpu, const common::GateChannel& ch, uint64_t now) {
  const uint64_t stamped_from = gpu.waiters_visible_ns != 0 ? gpu.waiters_visible_ns : now;
  return std::max(ch.last_launch_ns.load(std::memory_order_relaxed), stamped_from);
}

// Whether the tenant in `slot` published the release of its current turn, or ended the odd
// turn it holds by releasing the next one ahead of the revoke (kAttachEndsOwnQuantum).
bool released_turn(const Gpu& gpu, SlotId slot, const common::GateChannel& ch) {
  const uint32_t released = ch.released_turn.load(std::memory_order_acquire);
  const uint32_t turn = gpu.words(slot).turn.load(std::memory_order_acquire);
  return released == turn || ((turn & 1u) != 0 && released == turn + 1);
}

// Whether the holder in `slot` ended its odd turn itself (released the next one ahead).
bool ended_ahead(const Gpu& gpu, SlotId slot, const common::GateChannel& ch) {
  const uint32_t turn = gpu.words(slot).turn.load(std::memory_order_acquire);
  return (turn & 1u) != 0 && ch.released_turn.load(std::memory_order_acquire) == turn + 1;
}

}  // namespace

// A quantum's end may be served up to its slack late, every other deadline exactly: with
// eight GPUs, quanta that end within each other's slack cost one wake-up instead of one
// each, and the GPUs that shared one stay close together after it.
uint64_t Arbiter::shared_wakeup() const {
  return arbiter::shared_wakeup(gpus_, [](const std::unique_ptr<Gpu>& gpu) {
    return DeadlineWindow{gpu->deadline, gpu->latest};
  });
}

void Arbiter::after_events() {
  const uint64_t now = monotonic_ns();
  for (auto& gpu : gpus_) {
    const bool due = gpu->deadline != 0 && gpu->deadline <= now;
    if (due) gpu->deadline = 0;
    if (gpu->dirty || (due && !look_at_holder(*gpu))) sync_and_decide(*gpu);
  }
}

// While others wait, the scheduler looks at the holder every idle_release to see whether it
// went idle; a busy holder launches all the while, so most of those looks find it busy. This
// reads only the holder's channel for them. Whatever else can change arrives as an event
// (a doorbell, a death, an admin request) or at a deadline the scheduler keeps apart, and
// makes a full pass.
bool Arbiter::look_at_holder(Gpu& gpu) {
  const auto holder = gpu.sched->holder();
  if (!holder) return false;
  const common::GateChannel* found = channel_of(gpu, *holder);
  if (found == nullptr) return false;
  const common::GateChannel& ch = *found;
  if (released_turn(gpu, *holder, ch)) return false;  // a decision is due
  const uint64_t now = monotonic_ns();
  if (!gpu.sched->postpone_idle_check(last_launch(gpu, ch, now),
                                      ch.inflight_ns.load(std::memory_order_relaxed), now))
    return false;
  ++gpu.holder_looks;
  gpu.deadline = gpu.sched->next_deadline();
  gpu.latest = gpu.sched->latest_deadline();
  return true;
}

const common::GateChannel* Arbiter::channel_of(const Gpu& gpu, SlotId slot) {
  const Gpu::SlotChannel* found = slot_channel(gpu, slot);
  return found == nullptr ? nullptr : found->channel;
}

const Gpu::SlotChannel* Arbiter::slot_channel(const Gpu& gpu, SlotId slot) {
  const auto found = std::lower_bound(
      gpu.channels.begin(), gpu.channels.end(), slot,
      [](const Gpu::SlotChannel& entry, SlotId wanted) { return entry.slot < wanted; });
  return found == gpu.channels.end() || found->slot != slot ? nullptr : &*found;
}

void Arbiter::index_channels(Gpu& gpu) {
  gpu.channels.clear();
  for (const auto& [slot, pid] : gpu.slot_pids) {
    const Process& proc = processes_.at(pid);
    Pod* pod = pods_.find(proc.pod_index);
    if (gpu.layout2_slots.test(slot)) {
      common::layout2::ControlSlot& cs = gpu.region2->slots[slot];
      gpu.channels.push_back(
          {slot, &channel(proc, gpu.index), &cs.quantum_ns, &cs.inflight_limit_ns});
    } else {
      common::GateLimits* limits = pod->region.limits(proc.proc_index, gpu.index);
      gpu.channels.push_back(
          {slot, &channel(proc, gpu.index), &limits->quantum_ns, &limits->inflight_limit_ns});
    }
  }
}

uint32_t Arbiter::owner_of(const Process& proc, uint32_t gpu_index) const {
  return slot_owner(slot_key_, proc.pid, proc.pod_index, proc.proc_index, gpu_index);
}

common::GateChannel& Arbiter::channel(const Process& proc, uint32_t gpu_index) {
  Pod* pod = pods_.find(proc.pod_index);
  return pod->region.channel(proc.proc_index, gpu_index);
}

void Arbiter::sync_and_decide(Gpu& gpu) {
  gpu.dirty = false;
  ++gpu.passes;
  const uint64_t now = monotonic_ns();
  Scheduler& sched = *gpu.sched;
  for (const auto& [slot, channel, quantum_ns, inflight_limit_ns] : gpu.channels) {
    common::GateChannel& ch = *channel;
    if (sched.set_want(slot, ch.want.load(std::memory_order_acquire) != 0, now)) {
      spdlog::debug("gpu {} slot {} wants the GPU", gpu.index, slot);
    }
    sched.set_activity(slot, last_launch(gpu, ch, now),
                       ch.inflight_ns.load(std::memory_order_relaxed), now);
    if (released_turn(gpu, slot, ch)) {
      TenantState st = sched.state(slot);
      if (st == TenantState::kHolding || st == TenantState::kRevoking ||
          st == TenantState::kPassedOver) {
        if (st == TenantState::kHolding && ended_ahead(gpu, slot, ch)) ++gpu.ended_by_holder;
        const uint64_t own_end = sched.self_end_ns();
        if (st == TenantState::kHolding && sched.holder() == slot && own_end != 0 && own_end < now)
          gpu.accounting.drained_own_quantum(slot, own_end);
        sched.released(slot, now);
        gpu.accounting.released(slot, now);
        DTRACE_PROBE3(quanta, released, gpu.index, slot, now);
      }
    }
  }
  apply(gpu, sched.decide(now));
  // One walk over the scheduler's tenants: a lookup per slot made each pass quadratic.
  sched.for_each_limit(now, [&](SlotId slot, uint64_t limit, uint64_t quantum) {
    const Gpu::SlotChannel* limits = slot_channel(gpu, slot);
    if (limits == nullptr) return;
    if (limits->inflight_limit_ns->load(std::memory_order_relaxed) != limit)
      limits->inflight_limit_ns->store(limit);
    if (limits->quantum_ns->load(std::memory_order_relaxed) != quantum)
      limits->quantum_ns->store(quantum);
  });
  auto holder = sched.holder();
  bool holding = holder && sched.state(*holder) == TenantState::kHolding;
  const uint32_t waiting = sched.waiting_count();
  gpu.each_header([&](common::ControlHeader& h) {
    h.holder.store(holding ? *holder : common::kNoSlot, std::memory_order_release);
    h.waiters.store(waiting, std::memory_order_relaxed);
  });
  if (waiting == 0) {
    gpu.waiters_visible_ns = 0;
  } else if (gpu.waiters_visible_ns == 0) {
    gpu.waiters_visible_ns = monotonic_ns();
  }
  publish_end(gpu);
  gpu.accounting.settle(sched, now);
  gpu.deadline = sched.next_deadline();
  gpu.latest = sched.latest_deadline();
}

// The holder's own end of its quantum (kAttachEndsOwnQuantum), in its control slot; any
// other slot's is cleared. Grants and revokes clear the slot's word before the turn moves.
void Arbiter::publish_end(Gpu& gpu) {
  const uint64_t end = gpu.sched->self_end_ns();
  const auto holder = gpu.sched->holder();
  const uint32_t slot = end != 0 && holder ? *holder : common::kNoSlot;
  if (gpu.end_published != common::kNoSlot && gpu.end_published != slot)
    gpu.words(gpu.end_published).end_at_ns.store(0, std::memory_order_relaxed);
  if (slot != common::kNoSlot && gpu.words(slot).end_at_ns.load(std::memory_order_relaxed) != end)
    gpu.words(slot).end_at_ns.store(end, std::memory_order_release);
  gpu.end_published = slot;
}

void Arbiter::apply(Gpu& gpu, const std::vector<Action>& actions) {
  for (const Action& a : actions) {
    const SlotWords slot = gpu.words(a.slot);
    switch (a.kind) {
      case Action::Kind::kGrant:
        spdlog::debug("gpu {} grant slot {} (quantum {} us)", gpu.index, a.slot,
                      gpu.sched->quantum_for(a.slot) / 1000);
        if ((slot.turn.load() & 1u) == 0) {
          const uint64_t quantum = gpu.sched->quantum_for(a.slot);
          if (const Gpu::SlotChannel* limits = slot_channel(gpu, a.slot))
            limits->quantum_ns->store(quantum, std::memory_order_relaxed);
          gpu.each_header(
              [&](common::ControlHeader& h) { h.holder.store(a.slot, std::memory_order_relaxed); });
          ++gpu.grants;
          if (gpu.last_granted != common::kNoSlot && gpu.last_granted != a.slot) ++gpu.switches;
          gpu.last_granted = a.slot;
          // Fired before the turn changes, so the grantee's wake-up always follows it;
          // quanta-trace pairs it with the shim's probes (docs/tracing.md).
          DTRACE_PROBE4(quanta, grant, gpu.index, a.slot, monotonic_ns(), quantum);
          bump_turn(slot);
          gpu.accounting.granted(a.slot, monotonic_ns());
        }
        break;
      case Action::Kind::kRevoke:
        spdlog::debug("gpu {} revoke slot {}", gpu.index, a.slot);
        if (slot.turn.load() & 1u) {
          const common::GateChannel* ch = channel_of(gpu, a.slot);
          DTRACE_PROBE3(quanta, revoke, gpu.index, a.slot, monotonic_ns());
          bump_turn(slot, ch == nullptr || !ended_ahead(gpu, a.slot, *ch));
        }
        gpu.accounting.revoked(a.slot, monotonic_ns());
        break;
      case Action::Kind::kPassOver: {
        DTRACE_PROBE2(quanta, pass_over, gpu.index, a.slot);
        gpu.accounting.passed_over(a.slot, monotonic_ns());
        pid_t pid = gpu.slot_pids.count(a.slot) ? gpu.slot_pids.at(a.slot) : 0;
        Pod* pod = pid != 0 ? pods_.find(processes_.at(pid).pod_index) : nullptr;
        tenant_log_.log(spdlog::level::warn, "pass-over", monotonic_ns(),
                        "pid {} of pod {} did not release GPU {} within {} ms of a revoke "
                        "(stopped or hung): passed over",
                        pid, pod != nullptr ? hosted::printable(pod->key) : "?", gpu.uuid,
                        config_.scheduler.revoke_timeout_ns / 1000000);
        break;
      }
    }
  }
}

void Arbiter::on_death(pid_t pid) {
  auto it = processes_.find(pid);
  if (it == processes_.end()) return;
  Process& proc = it->second;
  const uint64_t now = monotonic_ns();
  loop_.remove(proc.pidfd.get());
  for (const auto& [gpu_index, slot] : proc.slots) {
    Gpu& gpu = *gpus_[gpu_index];
    gpu.sched->remove_tenant(slot, now);
    gpu.accounting.remove_tenant(slot, now);
    free_slot(gpu, slot);
    gpu.dirty = true;
  }
  if (tenants_) tenants_->drop_process(pid);
  Pod* pod = pods_.find(proc.pod_index);
  uint64_t returned = 0;
  std::string key = "?";
  if (pod != nullptr) {
    key = pod->key;
    for (uint32_t g = 0; g < common::kMaxGpus; ++g) {
      returned += pod->region.channel(proc.proc_index, g).memory_used.load();
    }
    reclaim_memory(*pod, proc.proc_index);
    pod->entries.reset(proc.proc_index);
    pod->pids.erase(pid);
  }
  uint32_t pod_index = proc.pod_index;
  processes_.erase(it);
  if (pod != nullptr && pod->processes() != 0) {
    pods_.save_state();
  } else {
    pods_.release_if_unused(pod_index);
  }
  tenant_log_.log(spdlog::level::info, "exit", now,
                  "pid {} of pod {} exited: its grants are free and {} bytes returned to the pod "
                  "ledger",
                  pid, hosted::printable(key), returned);
  after_events();  // hand the GPU on now, not after the rest of this batch
}

void Arbiter::free_slot(Gpu& gpu, SlotId slot) {
  DTRACE_PROBE2(quanta, slot_freed, gpu.index, slot);  // its process exited
  const SlotWords words = gpu.words(slot);
  if (words.turn.load() & 1u) bump_turn(words);
  if (gpu.layout2_slots.test(slot)) {
    gpu.region2->slots[slot].pid.store(0, std::memory_order_release);
  } else {
    gpu.region->slots[slot].owner.store(0, std::memory_order_release);
    const pid_t pid = gpu.slot_pids.count(slot) != 0 ? gpu.slot_pids.at(slot) : 0;
    auto proc = processes_.find(pid);
    Pod* pod = proc != processes_.end() ? pods_.find(proc->second.pod_index) : nullptr;
    if (pod != nullptr) {
      if (common::GateLimits* limits = pod->region.limits(proc->second.proc_index, gpu.index))
        limits->slot.store(common::kNoSlot, std::memory_order_relaxed);
    }
  }
  gpu.layout2_slots.reset(slot);
  gpu.slot_pids.erase(slot);
  index_channels(gpu);
  gpu.each_header([&](common::ControlHeader& h) {
    if (h.holder.load() == slot) h.holder.store(common::kNoSlot);
  });
}

void Arbiter::open_region2(Gpu& gpu) {
  if (gpu.region2) return;
  gpu.region2 = ControlRegion2Map::create(control_region_name(config_.scope, gpu.index));
  const common::ControlHeader& from = gpu.region->header;
  common::ControlHeader& h = gpu.region2->header;
  h.gpu_index = from.gpu_index;
  std::memcpy(h.uuid, from.uuid, sizeof(h.uuid));
  h.arbiter_generation.store(from.arbiter_generation.load());
  h.lease_ns.store(from.lease_ns.load());
  h.idle_release_ns.store(from.idle_release_ns.load());
  h.holder.store(from.holder.load());
  h.waiters.store(from.waiters.load());
  h.heartbeat_ns.store(from.heartbeat_ns.load());
  spdlog::info(
      "GPU {} {} serves processes of shared-memory layout 2 (pods started under the "
      "previous release) from a control region of their own",
      gpu.index, gpu.uuid);
  record_node();
}

void Arbiter::reclaim_memory(Pod& pod, uint32_t proc_index) {
  for (uint32_t g = 0; g < common::kMaxGpus; ++g) {
    common::GateChannel& ch = pod.region.channel(proc_index, g);
    uint64_t used = ch.memory_used.exchange(0);
    if (used != 0) {
      std::atomic<uint64_t>& ledger = pod.region.memory_used(g);
      uint64_t cur = ledger.load();
      while (!ledger.compare_exchange_weak(cur, cur > used ? cur - used : 0)) {
      }
    }
    ch.want.store(0);
    ch.inflight_ns.store(0);
  }
  pod.region.pid(proc_index).store(0, std::memory_order_release);
}

void Arbiter::fill_slot(Gpu& gpu, SlotId slot, const Process& proc, const Pod& pod) {
  const uint64_t quantum = gpu.sched->quantum_for(slot);
  auto denied = pod.denied_caps.find(gpu.index);
  const uint64_t cap = denied != pod.denied_caps.end() ? denied->second : pod.policy.memory_limit;
  if (gpu.layout2_slots.test(slot)) {
    // Layout 2: the slot names its process and carries the pod's cap and limits.
    common::layout2::ControlSlot& cs = gpu.region2->slots[slot];
    cs.memory_cap.store(cap);
    cs.quantum_ns.store(quantum);
    cs.inflight_limit_ns.store(quantum);
    cs.priority.store(static_cast<uint32_t>(pod.policy.priority));
    cs.pod_index.store(proc.pod_index);
    cs.proc_index.store(proc.proc_index);
    cs.end_at_ns.store(0);
    cs.pid.store(static_cast<uint32_t>(proc.pid), std::memory_order_release);
    return;
  }
  common::ControlSlot& cs = gpu.region->slots[slot];
  common::GateLimits& limits = *pod.region.limits(proc.proc_index, gpu.index);
  pod.region.memory_cap(gpu.index)->store(cap);
  limits.quantum_ns.store(quantum);
  limits.inflight_limit_ns.store(quantum);
  limits.slot.store(slot);
  cs.end_at_ns.store(0);
  cs.owner.store(owner_of(proc, gpu.index), std::memory_order_release);
}

void Arbiter::apply_policy(Pod& pod) {
  pod.policy = pods_.resolve_policy(pod.key);
  for (auto& gpu : gpus_) {
    gpu->sched->set_pod_policy(pod.index, pod.policy);
    for (const auto& [slot, pid] : gpu->slot_pids) {
      const Process& proc = processes_.at(pid);
      if (proc.pod_index == pod.index) fill_slot(*gpu, slot, proc, pod);
    }
    gpu->dirty = true;
  }
}

Gpu* Arbiter::gpu_by_uuid(const std::string& uuid) {
  for (auto& g : gpus_) {
    if (g->uuid == uuid) return g.get();
  }
  return nullptr;
}

std::string Arbiter::managed_list() const {
  std::string list;
  for (const auto& g : gpus_) list += (list.empty() ? "" : ", ") + g->uuid;
  return list;
}

// What the shims charge per context and where the figure came from.
nlohmann::json Arbiter::context_overhead_json() const {
  nlohmann::json measured = nlohmann::json::object();
  for (const auto& [model, bytes] : context_overheads_.bytes_by_model) measured[model] = bytes;
  nlohmann::json out{{"bytes", context_overhead_},
                     {"source", config_.shim.measure_context_overhead ? "measured" : "config"}};
  if (config_.shim.measure_context_overhead) {
    out["measured"] = measured;
    if (!context_overheads_.errors.empty()) out["errors"] = context_overheads_.errors;
  }
  return out;
}

void Arbiter::policy_changed(const std::string& pod_key) {
  if (Pod* pod = pods_.find_key(pod_key)) {
    apply_policy(*pod);
    after_events();
  }
}

void Arbiter::set_draining(uint32_t gpu_index, bool on) {
  Gpu& gpu = *gpus_.at(gpu_index);
  gpu.sched->set_draining(on);
  gpu.dirty = true;
  after_events();
}

}  // namespace quanta::arbiter
