// NVML as every host program loads it: libnvidia-ml.so.1 opened once per process with
// dlopen (so the programs run, and say why, on a node without the driver), each entry point
// Quanta calls resolved once by its versioned export with the legacy name as fallback, and
// typed by common/nvml_api.h (NVIDIA's ABI). The library is never closed: a driver library
// is not safe to unload. Callers call `init` themselves (nvmlInit counts references).
#pragma once

#include <string>

#include "common/nvml_api.h"

namespace quanta::hosted {

struct Nvml {
  decltype(&nvmlInit_v2) init = nullptr;  // nvmlInit_v2, or nvmlInit
  decltype(&nvmlShutdown) shutdown = nullptr;
  decltype(&nvmlErrorString) error_string = nullptr;
  decltype(&nvmlDeviceGetCount_v2) count = nullptr;  // _v2, or the legacy export
  decltype(&nvmlDeviceGetHandleByIndex_v2) handle_by_index = nullptr;  // _v2, or legacy
  decltype(&nvmlDeviceGetHandleByUUID) handle_by_uuid = nullptr;
  decltype(&nvmlDeviceGetUUID) uuid = nullptr;
  decltype(&nvmlDeviceGetName) name = nullptr;
  decltype(&nvmlDeviceGetMinorNumber) minor = nullptr;
  decltype(&nvmlDeviceGetMemoryInfo) memory = nullptr;
  decltype(&nvmlDeviceGetComputeRunningProcesses_v3) processes_v3 = nullptr;
  decltype(&nvmlDeviceGetComputeRunningProcesses_v2) processes_v2 = nullptr;
  decltype(&nvmlDeviceGetComputeRunningProcesses) processes_v1 = nullptr;
  decltype(&nvmlDeviceGetProcessUtilization) process_utilization = nullptr;
  decltype(&nvmlDeviceIsMigDeviceHandle) is_mig = nullptr;
  decltype(&nvmlDeviceGetGpuInstanceId) gpu_instance_id = nullptr;
  decltype(&nvmlDeviceGetMaxMigDeviceCount) max_mig_count = nullptr;
  decltype(&nvmlDeviceGetMigDeviceHandleByIndex) mig_handle = nullptr;

  // "" once the library is loaded; otherwise dlopen's reason ("libnvidia-ml.so.1: cannot
  // open shared object file: ...") and every pointer above is null.
  std::string load_error;
  bool loaded() const { return load_error.empty(); }
  // "code 9 (Driver Not Loaded)": a return code as NVML names it.
  std::string describe(nvmlReturn_t rc) const;
};

// The process's NVML. A load that failed is tried again at the next call: a node's driver
// may appear after the program started. Thread-safe.
const Nvml& nvml();

}  // namespace quanta::hosted
