// GPU discovery through NVML, loaded with dlopen("libnvidia-ml.so.1") so the arbiter runs
// (and fails clearly) on machines without the driver, and tests can point it at simgpu's.
// The per-process view is nvml_sampler.h's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace quanta::arbiter {

struct GpuInfo {
  std::string uuid;
  std::string parent;  // a MIG instance's GPU UUID; "" for a whole GPU
  int minor = -1;      // /dev/nvidia<minor> of the (parent) GPU; -1 when NVML does not say
  // The name a container runtime may use for it besides its UUID, as `nvidia-ctk cdi
  // generate` names devices: the NVML index ("0"), or "GPU:INSTANCE" ("0:1") for a MIG
  // instance (a driver listing instances at the top level gets "MINOR:K", K counting that
  // GPU's instances in order).
  std::string name;
  std::string model;  // nvmlDeviceGetName ("NVIDIA H200", a MIG profile's own name); "" unknown
};

// Every GPU and MIG instance NVML lists, in NVML order (a GPU's MIG instances follow it).
// When `wanted` is not empty, only those, in that order; a wanted UUID that NVML does not
// report is an error naming it and the ones it does. Throws std::runtime_error.
std::vector<GpuInfo> discover_gpu_info(const std::vector<std::string>& wanted);
// The same, UUIDs only.
std::vector<std::string> discover_gpus(const std::vector<std::string>& wanted);

}  // namespace quanta::arbiter
