// Loading libnvidia-ml.so.1 and resolving its entry points, once per process.
#include "hosted/nvml.h"

#include <dlfcn.h>

#include <mutex>

namespace quanta::hosted {
namespace {

template <typename F>
void resolve(void* lib, F* out, const char* name, const char* fallback = nullptr) {
  void* p = dlsym(lib, name);
  if (p == nullptr && fallback != nullptr) p = dlsym(lib, fallback);
  *out = reinterpret_cast<F>(p);
}

}  // namespace

std::string Nvml::describe(nvmlReturn_t rc) const {
  std::string text = "code " + std::to_string(static_cast<int>(rc));
  if (error_string != nullptr) {
    if (const char* name = error_string(rc)) text += std::string(" (") + name + ")";
  }
  return text;
}

const Nvml& nvml() {
  static std::mutex mu;
  static Nvml n;
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded) return n;
  n = Nvml{};
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    n.load_error = why != nullptr ? why : "libnvidia-ml.so.1 cannot be loaded";
    return n;
  }
  resolve(lib, &n.init, "nvmlInit_v2", "nvmlInit");
  resolve(lib, &n.shutdown, "nvmlShutdown");
  resolve(lib, &n.error_string, "nvmlErrorString");
  resolve(lib, &n.count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
  resolve(lib, &n.handle_by_index, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
  resolve(lib, &n.handle_by_uuid, "nvmlDeviceGetHandleByUUID");
  resolve(lib, &n.uuid, "nvmlDeviceGetUUID");
  resolve(lib, &n.name, "nvmlDeviceGetName");
  resolve(lib, &n.minor, "nvmlDeviceGetMinorNumber");
  resolve(lib, &n.memory, "nvmlDeviceGetMemoryInfo");
  resolve(lib, &n.processes_v3, "nvmlDeviceGetComputeRunningProcesses_v3");
  resolve(lib, &n.processes_v2, "nvmlDeviceGetComputeRunningProcesses_v2");
  resolve(lib, &n.processes_v1, "nvmlDeviceGetComputeRunningProcesses");
  resolve(lib, &n.process_utilization, "nvmlDeviceGetProcessUtilization");
  resolve(lib, &n.is_mig, "nvmlDeviceIsMigDeviceHandle");
  resolve(lib, &n.gpu_instance_id, "nvmlDeviceGetGpuInstanceId");
  resolve(lib, &n.max_mig_count, "nvmlDeviceGetMaxMigDeviceCount");
  resolve(lib, &n.mig_handle, "nvmlDeviceGetMigDeviceHandleByIndex");
  loaded = true;
  return n;
}

}  // namespace quanta::hosted
