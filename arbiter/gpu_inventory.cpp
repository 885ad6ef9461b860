// NVML through dlopen: only the handful of entry points discovery needs, declared here with
// NVML's C ABI (opaque device handles, int return codes, 0 = success).
#include "arbiter/gpu_inventory.h"

#include <dlfcn.h>
#include <strings.h>

#include <map>
#include <mutex>
#include <stdexcept>

namespace quanta::arbiter {
namespace {

using Device = struct NvmlDeviceOpaque*;
using InitFn = int (*)();
using CountFn = int (*)(unsigned*);
using HandleFn = int (*)(unsigned, Device*);
using HandleByUuidFn = int (*)(const char*, Device*);
using UuidFn = int (*)(Device, char*, unsigned);
using MigCountFn = int (*)(Device, unsigned*);
using MigHandleFn = int (*)(Device, unsigned, Device*);
using MinorFn = int (*)(Device, unsigned*);
using NameFn = int (*)(Device, char*, unsigned);
using ErrorStringFn = const char* (*)(int);

template <typename F>
F symbol(void* lib, const char* name, const char* fallback = nullptr) {
  void* p = dlsym(lib, name);
  if (p == nullptr && fallback != nullptr) p = dlsym(lib, fallback);
  return reinterpret_cast<F>(p);
}

struct Nvml {
  void* lib = nullptr;
  InitFn init = nullptr;
  CountFn count = nullptr;
  HandleFn handle = nullptr;
  HandleByUuidFn by_uuid = nullptr;
  UuidFn uuid = nullptr;
  MigCountFn mig_count = nullptr;
  MigHandleFn mig_handle = nullptr;
  MinorFn minor = nullptr;
  NameFn model = nullptr;
  ErrorStringFn error_string = nullptr;
  std::string load_error;
};

// Loaded and initialised once it works; the library stays loaded (NVML does not like being
// shut down and re-initialised). A failed load or init is tried again at the next call: a
// node's driver may appear after the arbiter started (--wait-for-gpus).
const Nvml& nvml() {
  static std::mutex mu;
  static Nvml n;
  static bool ready = false;
  std::lock_guard<std::mutex> lock(mu);
  if (ready) return n;
  [] {
    n = Nvml{};
    n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (n.lib == nullptr) {
      const char* why = dlerror();
      n.load_error = std::string("cannot load NVML (libnvidia-ml.so.1): ") +
                     (why ? why : "unknown error") +
                     ": install the NVIDIA driver, or for tests set LD_LIBRARY_PATH to simgpu's "
                     "build/sim";
      return;
    }
    n.init = symbol<InitFn>(n.lib, "nvmlInit_v2", "nvmlInit");
    n.count = symbol<CountFn>(n.lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    n.handle =
        symbol<HandleFn>(n.lib, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    n.by_uuid = symbol<HandleByUuidFn>(n.lib, "nvmlDeviceGetHandleByUUID");
    n.uuid = symbol<UuidFn>(n.lib, "nvmlDeviceGetUUID");
    n.mig_count = symbol<MigCountFn>(n.lib, "nvmlDeviceGetMaxMigDeviceCount");
    n.mig_handle = symbol<MigHandleFn>(n.lib, "nvmlDeviceGetMigDeviceHandleByIndex");
    n.minor = symbol<MinorFn>(n.lib, "nvmlDeviceGetMinorNumber");
    n.model = symbol<NameFn>(n.lib, "nvmlDeviceGetName");
    n.error_string = symbol<ErrorStringFn>(n.lib, "nvmlErrorString");
    if (n.init == nullptr || n.count == nullptr || n.handle == nullptr || n.uuid == nullptr) {
      n.load_error = "libnvidia-ml.so.1 lacks nvmlInit/nvmlDeviceGetCount/GetHandleByIndex/GetUUID";
      return;
    }
    if (int rc = n.init(); rc != 0) {
      n.load_error = "NVML nvmlInit failed with code " + std::to_string(rc);
      if (n.error_string != nullptr) n.load_error += std::string(" (") + n.error_string(rc) + ")";
    }
  }();
  ready = n.load_error.empty();
  return n;
}

std::string failure(const Nvml& n, const char* what, int rc) {
  std::string text = std::string("NVML ") + what + " failed with code " + std::to_string(rc);
  if (n.error_string != nullptr) text += std::string(" (") + n.error_string(rc) + ")";
  return text;
}

std::string model_of(const Nvml& n, Device dev) {
  char name[96] = {};
  if (n.model == nullptr || n.model(dev, name, sizeof(name)) != 0) return "";
  return name;
}

}  // namespace

std::vector<GpuInfo> discover_gpu_info(const std::vector<std::string>& wanted) {
  const Nvml& n = nvml();
  if (!n.load_error.empty()) throw std::runtime_error(n.load_error);
  unsigned count = 0;
  if (int rc = n.count(&count); rc != 0)
    throw std::runtime_error(failure(n, "nvmlDeviceGetCount", rc));

  std::vector<GpuInfo> all;
  std::map<int, int> top_level_instances;  // minor -> MIG instances listed at the top level
  auto add = [&all](const GpuInfo& info) {
    for (const GpuInfo& a : all) {
      if (a.uuid == info.uuid) return;  // a driver listing MIG instances both ways
    }
    all.push_back(info);
  };
  for (unsigned i = 0; i < count; ++i) {
    Device dev = nullptr;
    if (int rc = n.handle(i, &dev); rc != 0)
      throw std::runtime_error(failure(n, "nvmlDeviceGetHandleByIndex", rc));
    char buf[96] = {};
    if (int rc = n.uuid(dev, buf, sizeof(buf)); rc != 0)
      throw std::runtime_error(failure(n, "nvmlDeviceGetUUID", rc));
    GpuInfo gpu;
    gpu.uuid = buf;
    unsigned minor = 0;
    if (n.minor != nullptr && n.minor(dev, &minor) == 0) gpu.minor = static_cast<int>(minor);
    gpu.model = model_of(n, dev);
    const bool top_level_mig = strncasecmp(buf, "MIG-", 4) == 0;
    const int minor_or_index = gpu.minor >= 0 ? gpu.minor : static_cast<int>(i);
    gpu.name = top_level_mig ? std::to_string(minor_or_index) + ":" +
                                   std::to_string(top_level_instances[minor_or_index]++)
                             : std::to_string(i);
    add(gpu);
    if (top_level_mig) continue;
    unsigned migs = 0;
    if (n.mig_count == nullptr || n.mig_handle == nullptr || n.mig_count(dev, &migs) != 0) continue;
    for (unsigned m = 0; m < migs; ++m) {
      Device mig = nullptr;
      if (n.mig_handle(dev, m, &mig) != 0 || mig == nullptr) continue;  // slot not populated
      char mbuf[96] = {};
      if (n.uuid(mig, mbuf, sizeof(mbuf)) != 0) continue;
      GpuInfo instance;
      instance.name = std::to_string(i) + ":" + std::to_string(m);
      instance.uuid = mbuf;
      instance.parent = gpu.uuid;
      instance.minor = gpu.minor;
      instance.model = model_of(n, mig);
      add(instance);
    }
  }

  if (wanted.empty()) return all;
  std::vector<GpuInfo> out;
  for (const std::string& w : wanted) {
    const GpuInfo* found = nullptr;
    for (const GpuInfo& a : all) found = a.uuid == w ? &a : found;
    if (found == nullptr) {
      std::string list;
      for (const GpuInfo& a : all) list += (list.empty() ? "" : ", ") + a.uuid;
      throw std::runtime_error("[node] gpus names " + w +
                               ", which NVML does not report; it reports: " +
                               (list.empty() ? std::string("no devices") : list));
    }
    out.push_back(*found);
  }
  return out;
}

std::vector<std::string> discover_gpus(const std::vector<std::string>& wanted) {
  std::vector<std::string> out;
  for (const GpuInfo& g : discover_gpu_info(wanted)) out.push_back(g.uuid);
  return out;
}

}  // namespace quanta::arbiter
