// A node's live state built by a test, in the shape the arbiter's core leaves it (node_state.h):
// managed GPUs with a control region and a scheduler each, the pod registry, the admitted
// processes, NVML's sampler (identities only, no sampling thread), and an event loop. The
// Observer and the AdminService tests construct those services over it, as the core does
// over its own state.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/loop/event_loop.h"
#include "arbiter/node_state.h"
#include "arbiter/observing/gpu_inventory.h"
#include "arbiter/observing/nvml_sampler.h"
#include "arbiter/observing/observer.h"
#include "arbiter/state/pod_registry.h"
#include "arbiter/state/regions.h"
#include "common/clock.h"
#include "common/policy.h"
#include "config/node_config.h"
#include "tests/support/temp_dir.h"

namespace quanta::arbiter::test_node {

inline std::string gpu_uuid(uint32_t index) {
  return "GPU-0b5e7ee0-0000-4000-8000-00000000000" + std::to_string(index);
}

class BuiltNode {
 public:
  // `gpu_count` managed GPUs; `extra` is appended to the node config (a [metrics] or [pod]
  // table, say).
  explicit BuiltNode(uint32_t gpu_count, const std::string& extra = "") {
    static int counter = 0;
    scope = "qbn" + std::to_string(getpid()) + "x" + std::to_string(counter++);
    config = config::parse_config("[node]\nscope = \"" + scope + "\"\nstate_dir = \"" +
                                      dir.file("state") + "\"\nnvml_interval = 0\n" + extra,
                                  "built_node.toml");
    std::filesystem::create_directories(config.state_dir);  // as the core makes it at start
    pods = std::make_unique<PodRegistry>(config);
    std::vector<std::string> uuids;
    for (uint32_t i = 0; i < gpu_count; ++i) {
      auto gpu = std::make_unique<Gpu>();
      gpu->index = i;
      gpu->uuid = gpu_uuid(i);
      gpu->info.uuid = gpu->uuid;
      gpu->info.name = std::to_string(i);
      gpu->info.model = "Simulated GPU";
      gpu->info.minor = static_cast<int>(i);
      gpu->region = ControlRegionMap::create(control_region_name(scope, i));
      gpu->region->header.holder.store(common::kNoSlot);
      gpu->sched = std::make_unique<Scheduler>(SchedulerOptions{});
      node_gpus.push_back(gpu->info);
      uuids.push_back(gpu->uuid);
      gpus.push_back(std::move(gpu));
    }
    nvml = std::make_unique<NvmlSampler>(uuids, 0);
  }

  // What the core hands its Observer.
  ObservedNode observed() {
    return ObservedNode{config,  gpus, processes, *pods, *nvml, kGeneration, started_ns,
                        nullptr, [this] { return connections; }};
  }

  // This process admitted into pod `key` as a tenant of GPU 0 on `slot`, with `memory_used`
  // counted by its shim, as admission and attach leave the state.
  Pod& admit(const std::string& key, const common::Policy& policy, SlotId slot,
             uint64_t memory_used) {
    Pod& pod = pods->get_or_create(key, false, "/built-node-test");
    pod.policy = policy;
    pod.entries.set(0);
    pod.pids.insert(getpid());
    pod.region.channel(0, 0).memory_used.store(memory_used);
    Process& proc = processes[getpid()];
    proc.pid = getpid();
    proc.pod_index = pod.index;
    proc.proc_index = 0;
    proc.slots[0] = slot;
    Gpu& gpu = *gpus[0];
    gpu.slot_pids[slot] = getpid();
    const uint64_t now = common::monotonic_ns();
    gpu.sched->set_pod_policy(pod.index, policy, now);
    gpu.sched->add_tenant(slot, pod.index, now);
    gpu.accounting.add_tenant(slot, key, now);
    return pod;
  }

  // The process gone and its pod released, as death handling leaves the state.
  void depart() {
    const uint32_t index = processes.at(getpid()).pod_index;
    Pod& pod = *pods->find(index);
    pod.entries.reset();
    pod.pids.clear();
    Gpu& gpu = *gpus[0];
    const uint64_t now = common::monotonic_ns();
    for (const auto& [slot, pid] : gpu.slot_pids) {
      gpu.sched->remove_tenant(slot, now);
      gpu.accounting.remove_tenant(slot, now);
    }
    gpu.slot_pids.clear();
    processes.clear();
    pods->release_if_unused(index);
  }

  static constexpr uint64_t kGeneration = 7;
  test_support::TempDir dir{"quanta-node"};
  std::string scope;
  config::NodeConfig config;
  EventLoop loop;
  std::unique_ptr<PodRegistry> pods;
  std::vector<std::unique_ptr<Gpu>> gpus;
  std::vector<GpuInfo> node_gpus;  // every GPU "NVML" lists: the managed ones
  std::map<pid_t, Process> processes;
  std::unique_ptr<NvmlSampler> nvml;
  size_t connections = 2;
  uint64_t started_ns = common::monotonic_ns();
};

}  // namespace quanta::arbiter::test_node
