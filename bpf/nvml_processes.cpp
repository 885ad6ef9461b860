// NVML's per-device process lists (hosted/nvml.h loads the library): _v3 of the list where
// the driver has it (its layout differs from the unversioned export's).
#include "bpf/nvml_processes.h"

#include <vector>

#include "common/nvml_api.h"
#include "hosted/nvml.h"

namespace quanta::bpf {

NvmlProcesses::NvmlProcesses() {
  const hosted::Nvml& nvml = hosted::nvml();
  if (!nvml.loaded()) {
    note_ = "libnvidia-ml.so.1 not found: GPUs of unmanaged processes are not known";
    return;
  }
  if (nvml.init == nullptr || nvml.init() != NVML_SUCCESS) {
    note_ = "nvmlInit failed: GPUs of unmanaged processes are not known";
    return;
  }
  initialised_ = true;
}

NvmlProcesses::~NvmlProcesses() {
  const hosted::Nvml& nvml = hosted::nvml();
  if (initialised_ && nvml.shutdown != nullptr) nvml.shutdown();
}

void NvmlProcesses::refresh() {
  if (!initialised_) return;
  const hosted::Nvml& nvml = hosted::nvml();
  const auto v3 = nvml.processes_v3;
  const auto v1 = nvml.processes_v1;
  unsigned int count = 0;
  if (nvml.count == nullptr || nvml.handle_by_index == nullptr || nvml.uuid == nullptr || (!v3 && !v1) ||
      nvml.count(&count) != NVML_SUCCESS)
    return;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (nvml.handle_by_index(i, &device) != NVML_SUCCESS ||
        nvml.uuid(device, uuid, sizeof uuid) != NVML_SUCCESS)
      continue;
    unsigned int n = 256;
    if (v3) {
      std::vector<nvmlProcessInfo_t> infos(n);
      if (v3(device, &n, infos.data()) != NVML_SUCCESS) continue;
      for (unsigned int k = 0; k < n && k < infos.size(); ++k)
        gpus_[static_cast<pid_t>(infos[k].pid)].insert(uuid);
    } else {
      std::vector<nvmlProcessInfo_v1_t> infos(n);
      if (v1(device, &n, infos.data()) != NVML_SUCCESS) continue;
      for (unsigned int k = 0; k < n && k < infos.size(); ++k)
        gpus_[static_cast<pid_t>(infos[k].pid)].insert(uuid);
    }
  }
}

}  // namespace quanta::bpf
