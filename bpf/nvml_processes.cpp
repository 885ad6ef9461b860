// NVML through dlopen with the entry points resolved by name: _v3 of the process list
// where the driver has it (its layout differs from the unversioned export's).
#include "nvml_processes.h"

#include <dlfcn.h>

#include <vector>

#include "common/nvml_api.h"

namespace quanta::bpf {
namespace {

using InitFn = nvmlReturn_t (*)();
using CountFn = nvmlReturn_t (*)(unsigned int*);
using HandleFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using UuidFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using ProcessesFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*);
using ProcessesV1Fn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_v1_t*);

template <typename F>
F entry(void* handle, const char* name) {
  return reinterpret_cast<F>(::dlsym(handle, name));
}

}  // namespace

NvmlProcesses::NvmlProcesses() {
  void* handle = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    note_ = "libnvidia-ml.so.1 not found: GPUs of unmanaged processes are not known";
    return;
  }
  auto init = entry<InitFn>(handle, "nvmlInit_v2");
  if (!init) init = entry<InitFn>(handle, "nvmlInit");
  if (!init || init() != NVML_SUCCESS) {
    note_ = "nvmlInit failed: GPUs of unmanaged processes are not known";
    ::dlclose(handle);
    return;
  }
  handle_ = handle;
}

NvmlProcesses::~NvmlProcesses() {
  if (!handle_) return;
  if (auto shutdown = entry<InitFn>(handle_, "nvmlShutdown")) shutdown();
  // Not dlclose'd: a driver library is not always safe to unload.
}

void NvmlProcesses::refresh() {
  if (!handle_) return;
  auto count_fn = entry<CountFn>(handle_, "nvmlDeviceGetCount_v2");
  if (!count_fn) count_fn = entry<CountFn>(handle_, "nvmlDeviceGetCount");
  auto handle_fn = entry<HandleFn>(handle_, "nvmlDeviceGetHandleByIndex_v2");
  if (!handle_fn) handle_fn = entry<HandleFn>(handle_, "nvmlDeviceGetHandleByIndex");
  auto uuid_fn = entry<UuidFn>(handle_, "nvmlDeviceGetUUID");
  auto v3 = entry<ProcessesFn>(handle_, "nvmlDeviceGetComputeRunningProcesses_v3");
  auto v1 = entry<ProcessesV1Fn>(handle_, "nvmlDeviceGetComputeRunningProcesses");
  unsigned int count = 0;
  if (!count_fn || !handle_fn || !uuid_fn || (!v3 && !v1) || count_fn(&count) != NVML_SUCCESS)
    return;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (handle_fn(i, &device) != NVML_SUCCESS || uuid_fn(device, uuid, sizeof uuid) != NVML_SUCCESS)
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
