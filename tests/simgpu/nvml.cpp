// The fake libnvidia-ml.so.1: NVML's device, memory, process and utilisation queries,
// answered from the same shared device model the fake libcuda.so.1 keeps.
#include <strings.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "../../common/nvml_api.h"
#include "tests/simgpu/config.h"
#include "tests/simgpu/engine.h"
#include "tests/simgpu/shared_state.h"

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

// The device node a runtime gives a container for this GPU is /dev/nvidia<physical index>;
// every MIG-like instance of one GPU shares it, as on the real driver.
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minorNumber) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (minorNumber == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *minorNumber = static_cast<unsigned>(d->physical_index);
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

// NVML reports no utilisation for MIG instances (the real library answers NOT_SUPPORTED).
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (utilization == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (d->mig_instance >= 0) return NVML_ERROR_NOT_SUPPORTED;
  DeviceEngine engine(nvml().state, device->index);
  utilization->gpu = engine.utilization_percent();
  utilization->memory = 0;  // copies are not told apart from kernels on the engine
  return NVML_SUCCESS;
}

// One sample per process that had a context on the device or ran on it since
// lastSeenTimeStamp (at most the last 0.9 s): its share of that period in smUtil, stamped
// now. No such process: NOT_FOUND. As the real library does, a NULL buffer or one too
// small gets INSUFFICIENT_SIZE with the count needed.
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t* utilization,
                                             unsigned int* processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (processSamplesCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (d->mig_instance >= 0) return NVML_ERROR_NOT_SUPPORTED;
  timespec real{};
  clock_gettime(CLOCK_REALTIME, &real);
  const unsigned long long now_us = static_cast<unsigned long long>(real.tv_sec) * 1'000'000ULL +
                                    static_cast<unsigned long long>(real.tv_nsec) / 1000;
  const uint64_t now = monotonic_ns();
  uint64_t since = 0;
  if (lastSeenTimeStamp != 0) {
    const unsigned long long ago_us = lastSeenTimeStamp >= now_us ? 0 : now_us - lastSeenTimeStamp;
    since = ago_us * 1000 >= now ? 0 : now - ago_us * 1000;
  }
  ProcessBusy rows[kMaxProcesses];
  DeviceEngine engine(nvml().state, device->index);
  const size_t n = engine.process_utilization(since, now, rows, kMaxProcesses);
  const unsigned capacity = *processSamplesCount;
  *processSamplesCount = static_cast<unsigned>(n);
  if (n == 0) return NVML_ERROR_NOT_FOUND;
  if (utilization == nullptr || n > capacity) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (size_t i = 0; i < n; ++i) {
    nvmlProcessUtilizationSample_t sample{};
    sample.pid = static_cast<unsigned>(rows[i].pid);
    sample.timeStamp = now_us;
    const uint64_t window = rows[i].window_ns;
    sample.smUtil = window == 0 ? 0
                                : static_cast<unsigned>(std::min<uint64_t>(
                                      100, (rows[i].busy_ns * 100 + window / 2) / window));
    utilization[i] = sample;
  }
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int* isMigDevice) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (isMigDevice == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *isMigDevice = d->mig_instance >= 0 ? 1 : 0;
  return NVML_SUCCESS;
}

// The GPU instance of a MIG device; a whole GPU has none (NOT_SUPPORTED, as NVML answers).
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int* id) {
  nvmlReturn_t rc;
  DeviceState* d = device_of(device, rc);
  if (d == nullptr) return rc;
  if (id == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (d->mig_instance < 0) return NVML_ERROR_NOT_SUPPORTED;
  *id = static_cast<unsigned>(d->mig_instance);
  return NVML_SUCCESS;
}

}  // extern "C"
