// GPU discovery through NVML, loaded with dlopen("libnvidia-ml.so.1") so the arbiter runs
// (and fails clearly) on machines without the driver, and tests can point it at simgpu's.
#pragma once

#include <string>
#include <vector>

namespace quanta::arbiter {

// UUIDs of every GPU and MIG instance NVML lists, in NVML order (a GPU's MIG instances
// follow it). When `wanted` is not empty, only those, in that order; a wanted UUID that
// NVML does not report is an error naming it and the ones it does. Throws
// std::runtime_error.
std::vector<std::string> discover_gpus(const std::vector<std::string>& wanted);

}  // namespace quanta::arbiter
