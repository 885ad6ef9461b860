// The node's GPUs as NVML lists them, with every name a container runtime may use for one:
// its NVML index ("0"), its UUID, and for a MIG instance "GPU:INSTANCE" ("0:1") and its
// MIG- UUID, the naming `nvidia-ctk cdi generate` uses. Loaded from NVML (dlopen) or built
// by tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace quanta::hooks {

struct GpuEntry {
  std::string name;  // "0" for a GPU, "0:1" for MIG instance 1 of GPU 0
  std::string uuid;  // "GPU-…" or "MIG-…"
  int minor = -1;    // /dev/nvidia<minor> of the GPU (its parent's for a MIG instance)
  bool mig = false;
};

struct DeviceTable {
  std::vector<GpuEntry> entries;  // NVML order; a GPU's instances follow it

  // The entry a runtime's device name means: an index or "N:M" name, or a UUID (any case).
  const GpuEntry* find(const std::string& name) const;
};

// The arbiter's table (its `devices` admin request): what the hook stages use, so the
// host-root hook never loads a driver library while a container is being created. Throws
// ArbiterUnreachable when the arbiter does not answer, HookError when it refuses.
DeviceTable arbiter_device_table(const std::string& admin_socket, uint64_t timeout_ns);

// Lists the devices through libnvidia-ml.so.1 (`cdi generate`, run by the installer). A driver that lists MIG instances at the top
// level (simgpu does) gets "MINOR:K" names, K counting that GPU's instances in order.
// Throws HookError when NVML cannot be loaded or answers with an error.
DeviceTable load_nvml_devices();

}  // namespace quanta::hooks
