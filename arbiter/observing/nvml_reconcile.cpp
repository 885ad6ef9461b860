// NVML's per-process view reconciled with the registry: every process NVML lists on a
// managed GPU is either an admitted tenant, a process of a registered container that
// bypassed the shim (attributed to its pod by cgroup), or unmanaged. A pod whose usage by
// NVML's count passes its cap (by more than over_cap_slack) is reported, denied (its cap on
// that GPU drops to one byte, so every further allocation through the shim fails) or
// killed, as [enforce] over_cap says. NVML's count decides, never the pod's ledger words,
// which the pod's own processes write.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "arbiter/arbiter.h"
#include "arbiter/loop/death_watch.h"
#include "common/clock.h"
#include "hosted/names.h"

namespace quanta::arbiter {
namespace {

// What NVML may show above a cap before the pod counts as over it: allocations the driver
// rounds up to its page size, and the code and stacks of the modules a context loads,
// which no ledger charge sees.
uint64_t over_cap_slack(uint64_t cap) {
  return std::max<uint64_t>(32ull << 20, cap / 32);
}

std::string command_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

}  // namespace

void Arbiter::reconcile(const std::vector<GpuReading>& readings) {
  const uint64_t now = common::monotonic_ns();
  for (auto& gpu_ptr : gpus_) {
    Gpu& gpu = *gpu_ptr;
    if (gpu.index >= readings.size()) continue;
    const GpuReading& reading = readings[gpu.index];
    if (!reading.ok) {
      if (gpu.nvml_error != reading.error) {
        spdlog::warn("NVML cannot list the processes on GPU {}: {} (no reconciliation there)",
                     gpu.uuid, reading.error);
      }
      gpu.nvml_error = reading.error;
      continue;
    }
    gpu.nvml_error.clear();
    std::map<std::string, std::vector<pid_t>> pids_by_pod =
        attribute_processes(gpu, reading.processes);
    std::set<std::string> over;
    for (const auto& [key, bytes] : gpu.pod_nvml_bytes) {
      const common::Policy policy = pods_.resolve_policy(key);
      if (policy.memory_limit != 0 &&
          bytes > policy.memory_limit + over_cap_slack(policy.memory_limit))
        over.insert(key);
    }
    for (const std::string& key : over) act_over_cap(gpu, key, pids_by_pod[key], now);
    restore_caps(gpu, over);
    gpu.over_cap = std::move(over);
  }
}

std::map<std::string, std::vector<pid_t>> Arbiter::attribute_processes(
    Gpu& gpu, const std::vector<NvmlProcess>& listed) {
  gpu.unmanaged.clear();
  gpu.nvml_bytes.clear();
  gpu.pod_nvml_bytes.clear();
  std::map<std::string, std::vector<pid_t>> pids_by_pod;
  for (const NvmlProcess& p : listed) {
    auto admitted = processes_.find(p.pid);
    if (admitted != processes_.end()) {
      const Pod* pod = pods_.find(admitted->second.pod_index);
      gpu.nvml_bytes[p.pid] = p.used_bytes;
      if (pod != nullptr) {
        gpu.pod_nvml_bytes[pod->key] += p.used_bytes;
        pids_by_pod[pod->key].push_back(p.pid);
      }
      continue;
    }
    UnmanagedProcess u;
    u.pid = p.pid;
    u.used_bytes = p.used_bytes;
    u.command = command_of(p.pid);
    if (const Registration* reg = pods_.match_cgroup(cgroup_of(p.pid))) {
      u.pod = reg->pod_key();
      gpu.pod_nvml_bytes[u.pod] += p.used_bytes;
      pids_by_pod[u.pod].push_back(p.pid);
    }
    gpu.unmanaged.push_back(std::move(u));
  }
  return pids_by_pod;
}

void Arbiter::act_over_cap(Gpu& gpu, const std::string& key, const std::vector<pid_t>& pids,
                           uint64_t now) {
  const uint64_t cap = pods_.resolve_policy(key).memory_limit;
  const uint64_t bytes = gpu.pod_nvml_bytes[key];
  switch (config_.enforce.over_cap) {
    case config::OverCapAction::kReport:
      if (gpu.over_cap.count(key) == 0) {  // a new finding
        tenant_log_.log(spdlog::level::warn, "over-cap", now,
                        "pod {} uses {} bytes of GPU {} by NVML's count, over its cap of {} "
                        "(over_cap = report)",
                        hosted::printable(key), bytes, gpu.uuid, cap);
      }
      return;
    case config::OverCapAction::kDeny: {
      Pod* pod = pods_.find_key(key);
      if (pod == nullptr || pod->denied_caps.count(gpu.index) != 0) return;
      pod->denied_caps[gpu.index] = 1;
      for (const auto& [slot, pid] : gpu.slot_pids) {
        const Process& proc = processes_.at(pid);
        if (proc.pod_index == pod->index) fill_slot(gpu, slot, proc, *pod);
      }
      tenant_log_.log(spdlog::level::warn, "over-cap", now,
                      "pod {} uses {} bytes of GPU {} by NVML's count, over its cap of {}: its "
                      "further allocations there are refused (over_cap = deny)",
                      hosted::printable(key), bytes, gpu.uuid, cap);
      return;
    }
    case config::OverCapAction::kKill:
      for (pid_t pid : pids) {
        auto admitted = processes_.find(pid);
        bool sent = false;
        if (admitted != processes_.end()) {
          sent = signal_pidfd(admitted->second.pidfd.get(), SIGKILL);
        } else if (UniqueFd pidfd = open_pidfd(pid)) {
          // Still the process NVML listed only while its cgroup is still the pod's.
          const Registration* reg = pods_.match_cgroup(cgroup_of(pid));
          if (reg != nullptr && reg->pod_key() == key) sent = signal_pidfd(pidfd.get(), SIGKILL);
        }
        if (sent) {
          tenant_log_.log(spdlog::level::warn, "over-cap", now,
                          "killed pid {} of pod {}: the pod uses {} bytes of GPU {} by NVML's "
                          "count, over its cap of {} (over_cap = kill)",
                          pid, hosted::printable(key), bytes, gpu.uuid, cap);
        }
      }
      return;
  }
}

void Arbiter::restore_caps(Gpu& gpu, const std::set<std::string>& over) {
  for (auto& [index, pod] : pods_.pods()) {
    if (over.count(pod.key) != 0 || pod.denied_caps.erase(gpu.index) == 0) continue;
    for (const auto& [slot, pid] : gpu.slot_pids) {
      const Process& proc = processes_.at(pid);
      if (proc.pod_index == pod.index) fill_slot(gpu, slot, proc, pod);
    }
    spdlog::info("pod {} is back under its cap on GPU {} by NVML's count: allocations allowed",
                 hosted::printable(pod.key), gpu.uuid);
  }
}

}  // namespace quanta::arbiter
