// The info mode: what the tenant can see of its devices through CUDA (name, UUID, total
// memory, free/total after creating a context) and through NVML, loaded with dlopen so a
// machine without libnvidia-ml.so.1 still gets the CUDA half.
#include <dlfcn.h>

#include <cstdio>

#include "common/nvml_api.h"
#include "tests/tenant/gpu.h"
#include "tests/tenant/modes.h"

namespace quanta::tenant {
namespace {

// NVML entries, resolved with dlsym so the tenant never needs NVML to start.
struct Nvml {
  decltype(&nvmlInit_v2) Init = nullptr;
  decltype(&nvmlShutdown) Shutdown = nullptr;
  decltype(&nvmlErrorString) ErrorString = nullptr;
  decltype(&nvmlDeviceGetCount_v2) DeviceGetCount = nullptr;
  decltype(&nvmlDeviceGetHandleByIndex_v2) DeviceGetHandleByIndex = nullptr;
  decltype(&nvmlDeviceGetName) DeviceGetName = nullptr;
  decltype(&nvmlDeviceGetUUID) DeviceGetUUID = nullptr;
  decltype(&nvmlDeviceGetMemoryInfo) DeviceGetMemoryInfo = nullptr;
};

std::string uuid_text(const CUuuid& uuid) {
  std::string text = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    text += hex;
  }
  return text;
}

nlohmann::json nvml_view() {
  nlohmann::json view = {{"available", false}};
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    view["note"] = "libnvidia-ml.so.1 not found: NVML view skipped";
    return view;
  }
  Nvml nvml;
  auto load = [&](auto& entry, const char* name) {
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
    return entry != nullptr;
  };
  if (!load(nvml.Init, "nvmlInit_v2") || !load(nvml.Shutdown, "nvmlShutdown") ||
      !load(nvml.DeviceGetCount, "nvmlDeviceGetCount_v2") ||
      !load(nvml.DeviceGetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2") ||
      !load(nvml.DeviceGetName, "nvmlDeviceGetName") ||
      !load(nvml.DeviceGetUUID, "nvmlDeviceGetUUID") ||
      !load(nvml.DeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo")) {
    view["note"] = std::string("libnvidia-ml.so.1 lacks ") + dlerror();
    return view;
  }
  load(nvml.ErrorString, "nvmlErrorString");
  auto fail = [&](const char* call, nvmlReturn_t result) {
    view["error"] = {
        {"call", call},
        {"name", nvml.ErrorString != nullptr ? nvml.ErrorString(result)
                                             : std::to_string(static_cast<int>(result))}};
  };
  if (nvmlReturn_t result = nvml.Init(); result != NVML_SUCCESS) {
    fail("nvmlInit_v2", result);
    return view;
  }
  unsigned int count = 0;
  if (nvmlReturn_t result = nvml.DeviceGetCount(&count); result != NVML_SUCCESS) {
    fail("nvmlDeviceGetCount_v2", result);
    nvml.Shutdown();
    return view;
  }
  view["available"] = true;
  view["device_count"] = count;
  view["devices"] = nlohmann::json::array();
  for (unsigned int index = 0; index < count; ++index) {
    nlohmann::json entry = {{"index", index}};
    nvmlDevice_t device = nullptr;
    if (nvmlReturn_t result = nvml.DeviceGetHandleByIndex(index, &device); result != NVML_SUCCESS) {
      fail("nvmlDeviceGetHandleByIndex_v2", result);
      break;
    }
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (nvml.DeviceGetName(device, text, sizeof text) == NVML_SUCCESS) entry["name"] = text;
    if (nvml.DeviceGetUUID(device, text, sizeof text) == NVML_SUCCESS) entry["uuid"] = text;
    nvmlMemory_t memory{};
    if (nvmlReturn_t result = nvml.DeviceGetMemoryInfo(device, &memory); result == NVML_SUCCESS) {
      entry["memory_total"] = memory.total;
      entry["memory_free"] = memory.free;
      entry["memory_used"] = memory.used;
    } else {
      fail("nvmlDeviceGetMemoryInfo", result);
    }
    view["devices"].push_back(entry);
  }
  nvml.Shutdown();
  return view;
}

}  // namespace

bool run_info(const Driver& driver, const Options& options, nlohmann::json& report) {
  init_driver(driver);
  int count = 0;
  check(driver, need(driver, driver.DeviceGetCount, "cuDeviceGetCount")(&count),
        "cuDeviceGetCount");
  report["device_count"] = count;
  report["devices"] = nlohmann::json::array();
  for (int index = 0; index < count; ++index) {
    CUdevice device = 0;
    check(driver, need(driver, driver.DeviceGet, "cuDeviceGet")(&device, index), "cuDeviceGet");
    char name[256] = {};
    check(driver, need(driver, driver.DeviceGetName, "cuDeviceGetName")(name, sizeof name, device),
          "cuDeviceGetName");
    CUuuid uuid{};
    check(driver, need(driver, driver.DeviceGetUuid, "cuDeviceGetUuid")(&uuid, device),
          "cuDeviceGetUuid");
    size_t total_mem = 0;
    check(driver, need(driver, driver.DeviceTotalMem, "cuDeviceTotalMem")(&total_mem, device),
          "cuDeviceTotalMem");
    CUcontext context = open_context(driver, options.context, device);
    size_t free_bytes = 0, total_bytes = 0;
    const CUresult result =
        need(driver, driver.MemGetInfo, "cuMemGetInfo")(&free_bytes, &total_bytes);
    close_context(driver, options.context, device, context);
    check(driver, result, "cuMemGetInfo");
    report["devices"].push_back({{"index", index},
                                 {"name", name},
                                 {"uuid", uuid_text(uuid)},
                                 {"total_mem", total_mem},
                                 {"mem_free", free_bytes},
                                 {"mem_total", total_bytes}});
  }
  report["nvml"] = nvml_view();
  return true;
}

}  // namespace quanta::tenant
