// What a CUDA context costs in device memory on this node's GPUs, measured when the arbiter
// starts. The shim charges each context it sees this much in the pod ledger, and the
// arbiter compares NVML's per-process count with the pod's cap, so a charge below the real
// cost would put honest pods over their caps ([enforce] over_cap) and one above it would
// refuse memory they are owed. The cost depends on the GPU model and the driver (518 MiB on
// an H200 with driver 580), so it is measured, never assumed.
//
// The measurement runs in a child process (quanta-arbiter --measure-context-overhead UUID,
// with CUDA_VISIBLE_DEVICES set to that GPU), so no CUDA state ever lives in the arbiter: it
// creates the device's primary context and reads its own usedGpuMemory from NVML. One
// child per GPU model: the driver is one per node.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "arbiter/observing/gpu_inventory.h"

namespace quanta::arbiter {

// Charged when no measurement worked (a GPU already full, a driver without per-process
// counts): a little above the costliest context measured on the GPUs Quanta is tested on.
constexpr uint64_t kFallbackContextOverhead = 600ull << 20;

struct ContextOverheads {
  std::map<std::string, uint64_t> bytes_by_model;  // per GPU model (nvmlDeviceGetName)
  std::vector<std::string> errors;                 // one line per model that failed
  // The charge for every context on the node: the largest measured (fallback when none
  // was), so that no GPU's contexts are charged below their cost.
  uint64_t charge = kFallbackContextOverhead;
};

// In the arbiter: one child per model among `gpus`, each given `timeout_ms`.
ContextOverheads measure_context_overheads(const std::vector<GpuInfo>& gpus, int timeout_ms);

// In the child: measures the context of the one visible device, whose NVML UUID is `uuid`;
// prints its bytes on stdout and returns 0, or prints why not on stderr and returns 1.
int measure_context_overhead_here(const std::string& uuid);

}  // namespace quanta::arbiter
