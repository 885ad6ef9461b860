// NVML view wrappers: nvmlDeviceGetMemoryInfo(_v2) report, for a capped pod, the same
// numbers cuMemGetInfo does (total = cap, used = the pod's usage, free = min(room, real
// free)), so nvidia-smi in the pod agrees with the program and never underflows. The NVML
// handle is matched to the CUDA device by UUID, whatever CUDA_VISIBLE_DEVICES renumbered.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cstring>

#include "common/nvml_api.h"
#include "shim/interpose/devices.h"
#include "shim/interpose/real_driver.h"
#include "shim/interpose/views.h"
#include "shim/interposed.h"

using namespace quanta::shim;

namespace {

bool nvml_capped_view(nvmlDevice_t device, MemoryView* view) {
  auto get_uuid = QUANTA_REAL_NVML(nvmlDeviceGetUUID);
  char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  CUuuid uuid;
  CUdevice cuda_device;
  return get_uuid && get_uuid(device, text, sizeof text) == NVML_SUCCESS &&
         parse_uuid(text, &uuid) && device_with_uuid(uuid, &cuda_device) &&
         capped_view(cuda_device, view, ViewCaller::nvml);
}

void fill(const MemoryView& view, unsigned long long real_free, unsigned long long* total,
          unsigned long long* free, unsigned long long* used) {
  *total = view.total;
  *free = view.room < real_free ? view.room : real_free;
  *used = view.used;
}

}  // namespace

QUANTA_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  auto real = QUANTA_REAL_NVML(nvmlDeviceGetMemoryInfo);
  if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
  const nvmlReturn_t result = real(device, memory);
  MemoryView view;
  if (result == NVML_SUCCESS && memory && !shim_disabled() && nvml_capped_view(device, &view))
    fill(view, memory->free, &memory->total, &memory->free, &memory->used);
  return result;
}

QUANTA_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                      nvmlMemory_v2_t* memory) {
  auto real = QUANTA_REAL_NVML(nvmlDeviceGetMemoryInfo_v2);
  if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
  const nvmlReturn_t result = real(device, memory);
  MemoryView view;
  if (result == NVML_SUCCESS && memory && !shim_disabled() && nvml_capped_view(device, &view)) {
    fill(view, memory->free, &memory->total, &memory->free, &memory->used);
    memory->reserved = 0;  // the cap is all the pod has; nothing of it is held back
  }
  return result;
}

namespace {

#define QUANTA_TABLE_ENTRY(fn) {#fn, reinterpret_cast<void*>(&::fn)},
const Interposed kNvmlInterposed[] = {QUANTA_NVML_CALLS(QUANTA_TABLE_ENTRY)};

}  // namespace

namespace quanta::shim {

const Interposed* find_interposed_nvml(const char* name) noexcept {
  if (!name || strncmp(name, "nvml", 4)) return nullptr;
  for (const Interposed& entry : kNvmlInterposed)
    if (!strcmp(entry.name, name)) return &entry;
  return nullptr;
}

}  // namespace quanta::shim
