// The fake libnvidia-ml.so.1: NVML's device, memory, process and utilisation queries,
// answered from the same shared device model the fake libcuda.so.1 keeps.
#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../../common/nvml_api.h"
#include "config.h"
#include "engine.h"
#include "shared_state.h"

struct nvmlDevice_st {
  unsigned index;
};

namespace quanta::simgpu {
namespace {

struct NvmlState {
  std::mutex mu;
  int init_count = 0;
  SharedState* state = nullptr;
  unsigned device_count = 0;
  nvmlDevice_st handles[kMaxDevices];
};

NvmlState& nvml() {
  static NvmlState* s = new NvmlState();  // never destroyed: callers may outlive statics
  return *s;
}

nvmlReturn_t init() {
  NvmlState& n = nvml();
  std::lock_guard lock(n.mu);
  if (n.state == nullptr) {
    Config cfg;
    std::string error;
    if (!parse_config([](const char* v) -> const char* { return std::getenv(v); }, cfg, error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return NVML_ERROR_INVALID_ARGUMENT;
    }
    SharedState* state = attach_shared_state(cfg, error);
    if (state == nullptr) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    n.state = state;
    n.device_count = state->device_count;
    for (unsigned i = 0; i < kMaxDevices; ++i) n.handles[i].index = i;
  }
  n.init_count++;
  return NVML_SUCCESS;
}

// Resolves a handle to its device; nullptr when NVML is not initialised or the handle is
// not one of ours.
DeviceState* device_of(nvmlDevice_t device, nvmlReturn_t& rc) {
  NvmlState& n = nvml();
  if (n.init_count == 0 || n.state == nullptr) {
    rc = NVML_ERROR_UNINITIALIZED;
    return nullptr;
  }
  if (device < &n.handles[0] || device >= &n.handles[n.device_count]) {
    rc = NVML_ERROR_INVALID_ARGUMENT;
    return nullptr;
  }
  rc = NVML_SUCCESS;
  return &n.state->devices[device->index];
}

nvmlReturn_t copy_string(const char* text, char* out, unsigned length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (std::strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, text, std::strlen(text) + 1);
  return NVML_SUCCESS;
}

struct ProcessRow {
  unsigned pid;
  unsigned long long bytes;
};

template <typename Info>
nvmlReturn_t running_processes(nvmlDevice_t device, unsigned* infoCount, Info* infos,
                               bool with_instances) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (infoCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  std::vector<ProcessRow> rows;
  int mig = -1;
  {
    DeviceLock lock(*d);
    reap_dead_processes(*d);
    mig = d->mig_instance;
    for (const ProcessUsage& p : d->processes) {
      if (p.pid != 0 && (p.contexts > 0 || p.bytes > 0))
        rows.push_back({static_cast<unsigned>(p.pid), p.bytes});
    }
  }
  const unsigned capacity = *infoCount;
  *infoCount = static_cast<unsigned>(rows.size());
  if (rows.size() > capacity) return NVML_ERROR_INSUFFICIENT_SIZE;
  if (!rows.empty() && infos == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (size_t i = 0; i < rows.size(); ++i) {
    Info info{};
    info.pid = rows[i].pid;
    info.usedGpuMemory = rows[i].bytes;
    if constexpr (requires { info.gpuInstanceId; }) {
      info.gpuInstanceId = with_instances && mig >= 0 ? static_cast<unsigned>(mig) : 0xFFFFFFFFu;
      info.computeInstanceId = with_instances && mig >= 0 ? 0u : 0xFFFFFFFFu;
    }
    infos[i] = info;
  }
  return NVML_SUCCESS;
}

}  // namespace
}  // namespace quanta::simgpu

using namespace quanta::simgpu;

extern "C" {

nvmlReturn_t nvmlInit_v2(void) {
  return init();
}
nvmlReturn_t nvmlInit(void) {
  return init();
}
nvmlReturn_t nvmlInitWithFlags(unsigned int) {
  return init();
}

nvmlReturn_t nvmlShutdown(void) {
  NvmlState& n = nvml();
  std::lock_guard lock(n.mu);
  if (n.init_count == 0) return NVML_ERROR_UNINITIALIZED;
  n.init_count--;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED:
      return "Already Initialized";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_MEMORY:
      return "Insufficient Memory";
    case NVML_ERROR_NO_DATA:
      return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
      return "Argument version mismatch";
    default:
      return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  if (nvml().init_count == 0) return NVML_ERROR_UNINITIALIZED;
  return copy_string("580.65.06", version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* cudaDriverVersion) {
  if (cudaDriverVersion == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *cudaDriverVersion = 13000;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) {
  return nvmlSystemGetCudaDriverVersion(v);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  if (nvml().init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (deviceCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *deviceCount = nvml().device_count;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int* deviceCount) {
  return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  NvmlState& n = nvml();
  if (n.init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= n.device_count) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &n.handles[index];
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  NvmlState& n = nvml();
  if (n.init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < n.device_count; ++i) {
    if (strcasecmp(n.state->devices[i].uuid_text, uuid) == 0) {
      *device = &n.handles[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  nvmlReturn_t rc;
  if (device_of(device, rc) == nullptr) return rc;
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *index = device->index;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  return d ? copy_string(d->name, name, length) : rc;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  return d ? copy_string(d->uuid_text, uuid, length) : rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  DeviceLock lock(*d);
  reap_dead_processes(*d);
  memory->total = d->capacity;
  memory->used = std::min(d->used, d->capacity);
  memory->free = d->capacity - memory->used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  nvmlMemory_t m{};
  nvmlReturn_t rc = nvmlDeviceGetMemoryInfo(device, &m);
  if (rc != NVML_SUCCESS) return rc;
  memory->total = m.total;
  memory->reserved = 0;
  memory->free = m.free;
  memory->used = m.used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int* infoCount,
                                                  nvmlProcessInfo_v1_t* infos) {
  return running_processes(device, infoCount, infos, false);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int* infoCount,
                                                     nvmlProcessInfo_v2_t* infos) {
  return running_processes(device, infoCount, infos, true);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* infoCount,
                                                     nvmlProcessInfo_t* infos) {
  return running_processes(device, infoCount, infos, true);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (utilization == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  DeviceEngine engine(nvml().state, device->index);
  utilization->gpu = engine.utilization_percent();
  utilization->memory = 0;
  return NVML_SUCCESS;
}

}  // extern "C"
