// The arbiter's core: start-up (GPU discovery, regions, re-adoption after a restart),
// the heartbeat, turning scheduler actions into turns in the control regions, and death
// handling (grant taken back, slot freed, memory returned to the pod ledger).
#include "arbiter/arbiter.h"

#include <fcntl.h>
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
#include <nlohmann/json.hpp>

#include "arbiter/death_watch.h"
#include "arbiter/gpu_inventory.h"
#include "arbiter/unix_socket.h"
#include "common/clock.h"
#include "common/futex.h"

namespace quanta::arbiter {

using common::monotonic_ns;

namespace {

SchedulerOptions scheduler_options(const SchedulerConfig& c) {
  SchedulerOptions o;
  o.quantum_ns = c.quantum_ns;
  o.quantum_min_ns = c.quantum_min_ns;
  o.quantum_max_ns = c.quantum_max_ns;
  o.revoke_timeout_ns = c.revoke_timeout_ns;
  o.idle_release_ns = c.idle_release_ns;
  o.drain_overlap = c.drain_overlap;
  return o;
}

void bump_turn(common::ControlSlot& slot) {
  slot.turn.fetch_add(1, std::memory_order_acq_rel);
  common::futex_wake(&slot.turn, INT_MAX);
}

}  // namespace

Arbiter::Arbiter(NodeConfig config) : config_(std::move(config)), pods_(config_) {
  started_ns_ = monotonic_ns();
  std::error_code ec;
  std::filesystem::create_directories(config_.state_dir, ec);
  std::string lock_path = config_.state_dir + "/" + config_.scope + ".lock";
  lock_fd_.reset(::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
  if (!lock_fd_) throw_errno("cannot open " + lock_path);
  if (flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    throw std::runtime_error("another quanta-arbiter with scope \"" + config_.scope +
                             "\" is running (it holds " + lock_path + ")");
  }
  pods_.load_state();

  std::vector<std::string> uuids = discover_gpus(config_.gpus);
  if (uuids.empty()) throw std::runtime_error("NVML reports no GPU to manage");
  if (uuids.size() > common::kMaxGpus) {
    throw std::runtime_error("NVML reports " + std::to_string(uuids.size()) + " devices; at most " +
                             std::to_string(common::kMaxGpus) +
                             " can be managed: list them in [node] gpus");
  }
  const uint64_t now = monotonic_ns();
  const std::set<std::string> drained = load_drained(config_);
  for (uint32_t i = 0; i < uuids.size(); ++i) {
    auto gpu = std::make_unique<Gpu>();
    gpu->index = i;
    gpu->uuid = uuids[i];
    std::string name = control_region_name(config_.scope, i);
    gpu->region = ControlRegionMap(name, common::kControlMagic);
    if (gpu->region.reopened() &&
        std::strncmp(gpu->region->header.uuid, uuids[i].c_str(), common::kUuidLen) != 0) {
      spdlog::warn("{} belonged to {}, now GPU {} is {}: starting it afresh", name,
                   gpu->region->header.uuid, i, uuids[i]);
      gpu->region.unlink();
      gpu->region = ControlRegionMap();
      gpu->region = ControlRegionMap(name, common::kControlMagic);
    }
    common::ControlHeader& h = gpu->region->header;
    if (!gpu->region.reopened()) {
      h.gpu_index = i;
      std::strncpy(h.uuid, uuids[i].c_str(), common::kUuidLen - 1);
      h.holder.store(common::kNoSlot);
    }
    generation_ = std::max(generation_, h.arbiter_generation.fetch_add(1) + 1);
    h.lease_ns.store(config_.scheduler.lease_ns);
    h.heartbeat_ns.store(now);
    gpu->sched = std::make_unique<Scheduler>(scheduler_options(config_.scheduler));
    if (drained.count(uuids[i]) != 0) {
      gpu->sched->set_draining(true);
      spdlog::warn("GPU {} {} stays drained (quantactl undrain {} resumes grants)", i, uuids[i], i);
    }
    gpus_.push_back(std::move(gpu));
  }
  adopt_previous_state();

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

  tenant_listener_ = listen_unix(config_.tenant_socket, SOCK_SEQPACKET, 0666);
  loop_.add(tenant_listener_.get(), [this](uint32_t) { on_tenant_accept(); });
  admin_listener_ = listen_unix(config_.admin_socket, SOCK_STREAM, 0600);
  loop_.add(admin_listener_.get(), [this](uint32_t) { on_admin_accept(); });

  for (auto& gpu : gpus_) {
    Gpu* g = gpu.get();
    loop_.add(g->timer.fd(), [g](uint32_t) {
      g->timer.acknowledge();
      g->dirty = true;
    });
  }
  loop_.add(heartbeat_timer_.fd(), [this](uint32_t) {
    heartbeat_timer_.acknowledge();
    heartbeat();
  });
  loop_.set_after_events([this] { after_events(); });
  heartbeat();

  std::string list;
  for (auto& g : gpus_) list += (list.empty() ? "" : ", ") + g->uuid;
  spdlog::info("quanta-arbiter generation {} serving {} GPU(s) [{}] on {} (admin {}), scope \"{}\"",
               generation_, gpus_.size(), list, config_.tenant_socket, config_.admin_socket,
               config_.scope);
}

Arbiter::~Arbiter() {
  // A clean stop lets tenants lapse to ungated launches now rather than after the lease:
  // zero the heartbeat and wake every launcher blocked at a gate so it notices. A restart
  // brings gating back with the next heartbeat; grants (odd turns) stay for re-adoption.
  for (auto& gpu : gpus_) {
    common::ControlRegion& region = *gpu->region.get();
    region.header.heartbeat_ns.store(0, std::memory_order_release);
    for (const auto& [slot, pid] : gpu->slot_pids)
      common::futex_wake(&region.slots[slot].turn, INT_MAX);
  }
  ::unlink(config_.tenant_socket.c_str());
  ::unlink(config_.admin_socket.c_str());
}

void Arbiter::run() {
  after_events();
  loop_.run();
}

void Arbiter::adopt_previous_state() {
  const uint64_t now = monotonic_ns();
  size_t adopted = 0;
  size_t reclaimed = 0;
  for (uint32_t index : existing_pod_regions(config_.scope)) {
    // A pod region is tenant-writable, so a bad header there is that pod's doing (or an
    // old layout its tenants still map): it must not keep the arbiter from starting. Its
    // processes are admitted afresh when they reconnect. (A control region, which only
    // the arbiter writes, with another layout version does refuse the start.)
    Pod* adopted = nullptr;
    try {
      adopted = &pods_.adopt(index);
    } catch (const RegionError& e) {
      spdlog::error("not re-adopting pod region {}: {}; its processes will be admitted afresh",
                    index, e.what());
      boost::interprocess::shared_memory_object::remove(
          pod_region_name(config_.scope, index).c_str());
      continue;
    }
    Pod& pod = *adopted;
    for (uint32_t pi = 0; pi < common::kMaxProcsPerPod; ++pi) {
      pid_t pid = static_cast<pid_t>(pod.region->procs[pi].pid.load());
      if (pid == 0) continue;
      UniqueFd pidfd = open_pidfd(pid);
      // The entry is tenant-writable: adopt only a live process that maps this very
      // region. Anything else is dead or forged; reclaiming it touches only this pod.
      std::string region_name = pod.region.name().substr(1);
      if (!pidfd || processes_.count(pid) != 0 || !maps_shm(pid, region_name)) {
        if (pidfd && processes_.count(pid) == 0) {
          spdlog::warn("pod region {} lists live pid {} that does not map it: entry cleared", index,
                       pid);
        }
        reclaim_memory(pod, pi);
        ++reclaimed;
        continue;
      }
      Process& proc = processes_[pid];
      proc.pid = pid;
      proc.pidfd = std::move(pidfd);
      proc.pod_index = index;
      proc.proc_index = pi;
      ++pod.processes;
      ++adopted;
    }
  }
  for (auto& gpu : gpus_) {
    if (!gpu->region.reopened()) continue;
    common::ControlRegion& region = *gpu->region.get();
    for (SlotId s = 0; s < common::kMaxSlotsPerGpu; ++s) {
      common::ControlSlot& slot = region.slots[s];
      pid_t pid = static_cast<pid_t>(slot.pid.load());
      auto it = pid == 0 ? processes_.end() : processes_.find(pid);
      bool valid = it != processes_.end() && it->second.pod_index == slot.pod_index.load() &&
                   it->second.proc_index == slot.proc_index.load() &&
                   it->second.slots.count(gpu->index) == 0;
      if (!valid) {
        if (slot.turn.load() & 1u) bump_turn(slot);
        slot.pid.store(0);
        continue;
      }
      Process& proc = it->second;
      Pod& pod = *pods_.find(proc.pod_index);
      proc.slots[gpu->index] = s;
      gpu->slot_pids[s] = pid;
      gpu->sched->set_pod_policy(pod.index, pod.policy);
      gpu->sched->add_tenant(s, pod.index, now);
      fill_slot(*gpu, s, proc, pod);
      // An odd turn means this slot held the grant when the last arbiter stopped.
      if ((slot.turn.load() & 1u) && !gpu->sched->adopt_holder(s, now)) bump_turn(slot);
    }
    auto holder = gpu->sched->holder();
    region.header.holder.store(holder ? *holder : common::kNoSlot);
  }
  for (auto& [pid, proc] : processes_) watch_process(proc);
  std::vector<uint32_t> unused;
  for (auto& [index, pod] : pods_.pods()) {
    if (pod.processes == 0) unused.push_back(index);
  }
  for (uint32_t index : unused) pods_.release_if_unused(index);
  if (adopted != 0 || reclaimed != 0) {
    spdlog::info("re-adopted {} live process(es); reclaimed the memory of {} that exited meanwhile",
                 adopted, reclaimed);
  }
}

void Arbiter::watch_process(Process& proc) {
  pid_t pid = proc.pid;
  loop_.add(proc.pidfd.get(), [this, pid](uint32_t) { on_death(pid); });
}

void Arbiter::heartbeat() {
  const uint64_t now = monotonic_ns();
  for (auto& gpu : gpus_) {
    gpu->region->header.lease_ns.store(config_.scheduler.lease_ns);
    gpu->region->header.heartbeat_ns.store(now);
    gpu->dirty = true;  // also catches wants of re-adopted tenants that have no doorbell yet
  }
  heartbeat_timer_.arm_at(now + config_.scheduler.lease_ns / 4);
}

void Arbiter::after_events() {
  for (auto& [index, pod] : pods_.pods()) {
    if (!pod.truncated_reported && pod.region.faulted()) {
      pod.truncated_reported = true;
      spdlog::error(
          "pod {} truncated its shared region: the arbiter no longer sees its requests or ledger; "
          "its holders are passed over after revoke_timeout",
          pod.key);
    }
  }
  for (auto& gpu : gpus_) {
    if (gpu->dirty) sync_and_decide(*gpu);
  }
}

common::GateChannel& Arbiter::channel(const Process& proc, uint32_t gpu_index) {
  Pod* pod = pods_.find(proc.pod_index);
  return pod->region->procs[proc.proc_index].gpus[gpu_index];
}

void Arbiter::sync_and_decide(Gpu& gpu) {
  gpu.dirty = false;
  const uint64_t now = monotonic_ns();
  common::ControlRegion& region = *gpu.region.get();
  Scheduler& sched = *gpu.sched;
  for (const auto& [slot, pid] : gpu.slot_pids) {
    const Process& proc = processes_.at(pid);
    common::GateChannel& ch = channel(proc, gpu.index);
    if (sched.set_want(slot, ch.want.load(std::memory_order_acquire) != 0, now)) {
      spdlog::debug("gpu {} slot {} wants the GPU", gpu.index, slot);
    }
    // The shim stamps last_launch_ns at every launch only while it sees waiters published
    // here (otherwise once per coarse clock tick, to keep launches cheap), so launches
    // before the publication count as made at it: a holder is idle only after
    // idle_release without a launch since others were seen waiting.
    const uint64_t stamped_from = gpu.waiters_visible_ns != 0 ? gpu.waiters_visible_ns : now;
    sched.set_activity(slot, std::max(ch.last_launch_ns.load(std::memory_order_relaxed), stamped_from),
                       ch.inflight_ns.load(std::memory_order_relaxed), now);
    if (ch.released_turn.load(std::memory_order_acquire) ==
        region.slots[slot].turn.load(std::memory_order_acquire)) {
      TenantState st = sched.state(slot);
      if (st == TenantState::kHolding || st == TenantState::kRevoking ||
          st == TenantState::kPassedOver) {
        sched.released(slot, now);
      }
    }
  }
  apply(gpu, sched.decide(now));
  // One walk over the scheduler's tenants: a lookup per slot made each pass quadratic.
  sched.for_each_limit(now, [&](SlotId slot, uint64_t limit, uint64_t quantum) {
    common::ControlSlot& cs = region.slots[slot];
    if (cs.inflight_limit_ns.load(std::memory_order_relaxed) != limit)
      cs.inflight_limit_ns.store(limit);
    if (cs.quantum_ns.load(std::memory_order_relaxed) != quantum) cs.quantum_ns.store(quantum);
  });
  auto holder = sched.holder();
  bool holding = holder && sched.state(*holder) == TenantState::kHolding;
  region.header.holder.store(holding ? *holder : common::kNoSlot, std::memory_order_release);
  const uint32_t waiting = sched.waiting_count();
  region.header.waiters.store(waiting, std::memory_order_relaxed);
  if (waiting == 0) {
    gpu.waiters_visible_ns = 0;
  } else if (gpu.waiters_visible_ns == 0) {
    gpu.waiters_visible_ns = monotonic_ns();
  }
  gpu.timer.arm_at(sched.next_deadline());
}

void Arbiter::apply(Gpu& gpu, const std::vector<Action>& actions) {
  common::ControlRegion& region = *gpu.region.get();
  for (const Action& a : actions) {
    common::ControlSlot& slot = region.slots[a.slot];
    switch (a.kind) {
      case Action::Kind::kGrant:
        spdlog::debug("gpu {} grant slot {} (quantum {} us)", gpu.index, a.slot,
                      gpu.sched->quantum_for(a.slot) / 1000);
        if ((slot.turn.load() & 1u) == 0) {
          slot.quantum_ns.store(gpu.sched->quantum_for(a.slot), std::memory_order_relaxed);
          region.header.holder.store(a.slot, std::memory_order_relaxed);
          bump_turn(slot);
          // quanta-trace handoff pairs this with the shim's release and gate probes.
          DTRACE_PROBE2(quanta, grant, gpu.index, a.slot);
        }
        break;
      case Action::Kind::kRevoke:
        spdlog::debug("gpu {} revoke slot {}", gpu.index, a.slot);
        if (slot.turn.load() & 1u) bump_turn(slot);
        break;
      case Action::Kind::kPassOver: {
        pid_t pid = gpu.slot_pids.count(a.slot) ? gpu.slot_pids.at(a.slot) : 0;
        Pod* pod = pid != 0 ? pods_.find(processes_.at(pid).pod_index) : nullptr;
        spdlog::warn(
            "pid {} of pod {} did not release GPU {} within {} ms of a revoke (stopped or hung): "
            "passed over",
            pid, pod != nullptr ? pod->key : "?", gpu.uuid,
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
    free_slot(gpu, slot);
    gpu.dirty = true;
  }
  if (proc.connection >= 0) close_connection(proc.connection, "");
  Pod* pod = pods_.find(proc.pod_index);
  uint64_t returned = 0;
  std::string key = "?";
  if (pod != nullptr) {
    key = pod->key;
    for (uint32_t g = 0; g < common::kMaxGpus; ++g) {
      returned += pod->region->procs[proc.proc_index].gpus[g].memory_used.load();
    }
    reclaim_memory(*pod, proc.proc_index);
    if (pod->processes > 0) --pod->processes;
  }
  uint32_t pod_index = proc.pod_index;
  processes_.erase(it);
  pods_.release_if_unused(pod_index);
  spdlog::info(
      "pid {} of pod {} exited: its grants are free and {} bytes returned to the pod ledger", pid,
      key, returned);
  after_events();  // hand the GPU on now, not after the rest of this batch
}

void Arbiter::free_slot(Gpu& gpu, SlotId slot) {
  common::ControlSlot& cs = gpu.region->slots[slot];
  if (cs.turn.load() & 1u) bump_turn(cs);
  cs.pid.store(0, std::memory_order_release);
  gpu.slot_pids.erase(slot);
  if (gpu.region->header.holder.load() == slot) gpu.region->header.holder.store(common::kNoSlot);
}

void Arbiter::reclaim_memory(Pod& pod, uint32_t proc_index) {
  common::PodRegion& region = *pod.region.get();
  common::ProcEntry& entry = region.procs[proc_index];
  for (uint32_t g = 0; g < common::kMaxGpus; ++g) {
    common::GateChannel& ch = entry.gpus[g];
    uint64_t used = ch.memory_used.exchange(0);
    if (used != 0) {
      uint64_t cur = region.memory_used[g].load();
      while (!region.memory_used[g].compare_exchange_weak(cur, cur > used ? cur - used : 0)) {
      }
    }
    ch.want.store(0);
    ch.inflight_ns.store(0);
  }
  entry.pid.store(0, std::memory_order_release);
}

void Arbiter::fill_slot(Gpu& gpu, SlotId slot, const Process& proc, const Pod& pod) {
  common::ControlSlot& cs = gpu.region->slots[slot];
  uint64_t quantum = gpu.sched->quantum_for(slot);
  cs.pod_index.store(proc.pod_index);
  cs.proc_index.store(proc.proc_index);
  cs.memory_cap.store(pod.policy.memory_limit);
  cs.quantum_ns.store(quantum);
  cs.inflight_limit_ns.store(quantum);
  cs.priority.store(static_cast<uint32_t>(pod.policy.priority));
  cs.pid.store(static_cast<uint32_t>(proc.pid), std::memory_order_release);
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

}  // namespace quanta::arbiter
