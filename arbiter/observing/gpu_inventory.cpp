// GPU discovery through NVML (hosted/nvml.h): every GPU and MIG instance with its name,
// UUID, minor number and model.
#include "arbiter/observing/gpu_inventory.h"

#include <strings.h>

#include <map>
#include <mutex>
#include <stdexcept>

#include "hosted/nvml.h"

namespace quanta::arbiter {
namespace {

// NVML loaded and initialised; the reason when it is not. A failed load or init is tried
// again at the next call: a node's driver may appear after the arbiter started
// (--wait-for-gpus). Once it works, it stays (NVML does not like being shut down and
// re-initialised).
std::string ready_nvml() {
  static std::mutex mu;
  static bool ready = false;
  std::lock_guard<std::mutex> lock(mu);
  if (ready) return "";
  const hosted::Nvml& n = hosted::nvml();
  if (!n.loaded()) {
    return "cannot load NVML (libnvidia-ml.so.1): " + n.load_error +
           ": install the NVIDIA driver, or for tests set LD_LIBRARY_PATH to simgpu's build/sim";
  }
  if (n.init == nullptr || n.count == nullptr || n.handle_by_index == nullptr || n.uuid == nullptr)
    return "libnvidia-ml.so.1 lacks nvmlInit/nvmlDeviceGetCount/GetHandleByIndex/GetUUID";
  if (nvmlReturn_t rc = n.init(); rc != NVML_SUCCESS) return "NVML nvmlInit failed with " + n.describe(rc);
  ready = true;
  return "";
}

std::string failure(const hosted::Nvml& n, const char* what, nvmlReturn_t rc) {
  return std::string("NVML ") + what + " failed with " + n.describe(rc);
}

std::string model_of(const hosted::Nvml& n, nvmlDevice_t dev) {
  char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
  if (n.name == nullptr || n.name(dev, name, sizeof(name)) != NVML_SUCCESS) return "";
  return name;
}

}  // namespace

std::vector<GpuInfo> discover_gpu_info(const std::vector<std::string>& wanted) {
  if (std::string why = ready_nvml(); !why.empty()) throw std::runtime_error(why);
  const hosted::Nvml& n = hosted::nvml();
  unsigned count = 0;
  if (nvmlReturn_t rc = n.count(&count); rc != NVML_SUCCESS)
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
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t rc = n.handle_by_index(i, &dev); rc != NVML_SUCCESS)
      throw std::runtime_error(failure(n, "nvmlDeviceGetHandleByIndex", rc));
    char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (nvmlReturn_t rc = n.uuid(dev, buf, sizeof(buf)); rc != NVML_SUCCESS)
      throw std::runtime_error(failure(n, "nvmlDeviceGetUUID", rc));
    GpuInfo gpu;
    gpu.uuid = buf;
    unsigned minor = 0;
    if (n.minor != nullptr && n.minor(dev, &minor) == NVML_SUCCESS) gpu.minor = static_cast<int>(minor);
    gpu.model = model_of(n, dev);
    const bool top_level_mig = strncasecmp(buf, "MIG-", 4) == 0;
    const int minor_or_index = gpu.minor >= 0 ? gpu.minor : static_cast<int>(i);
    gpu.name = top_level_mig ? std::to_string(minor_or_index) + ":" +
                                   std::to_string(top_level_instances[minor_or_index]++)
                             : std::to_string(i);
    add(gpu);
    if (top_level_mig) continue;
    unsigned migs = 0;
    if (n.max_mig_count == nullptr || n.mig_handle == nullptr ||
        n.max_mig_count(dev, &migs) != NVML_SUCCESS)
      continue;
    for (unsigned m = 0; m < migs; ++m) {
      nvmlDevice_t mig = nullptr;
      if (n.mig_handle(dev, m, &mig) != NVML_SUCCESS || mig == nullptr) continue;  // not made
      char mbuf[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
      if (n.uuid(mig, mbuf, sizeof(mbuf)) != NVML_SUCCESS) continue;
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
