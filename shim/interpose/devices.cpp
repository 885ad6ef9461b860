// Device and context queries through the real driver, with a small per-ordinal UUID cache.
#define __CUDA_API_VERSION_INTERNAL 1
#include "shim/interpose/devices.h"

#include <atomic>
#include <cstdio>
#include <cstring>

#include "shim/interpose/real_driver.h"

namespace quanta::shim {

namespace {

constexpr int kCachedDevices = 64;
struct CachedUuid {
  std::atomic<bool> known{false};
  CUuuid uuid{};
};
CachedUuid g_uuids[kCachedDevices];

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

CUcontext current_context() noexcept {
  CUcontext context = nullptr;
  auto real = QUANTA_REAL(cuCtxGetCurrent);
  if (!real || real(&context) != CUDA_SUCCESS) return nullptr;
  return context;
}

bool current_device(CUdevice* device) noexcept {
  auto real = QUANTA_REAL(cuCtxGetDevice);
  return real && real(device) == CUDA_SUCCESS;
}

bool device_uuid(CUdevice device, CUuuid* uuid) noexcept {
  const bool cacheable = device >= 0 && device < kCachedDevices;
  if (cacheable && g_uuids[device].known.load(std::memory_order_acquire)) {
    *uuid = g_uuids[device].uuid;
    return true;
  }
  auto real = QUANTA_REAL(cuDeviceGetUuid_v2);
  if (!real || real(uuid, device) != CUDA_SUCCESS) return false;
  if (cacheable) {
    g_uuids[device].uuid = *uuid;  // identical bytes if two threads race here
    g_uuids[device].known.store(true, std::memory_order_release);
  }
  return true;
}

bool device_uuid_name(CUdevice device, char* out, size_t capacity) noexcept {
  CUuuid uuid;
  if (!device_uuid(device, &uuid)) return false;
  const char* prefix = "GPU-";
  auto get_v1 = QUANTA_REAL(cuDeviceGetUuid);
  CUuuid parent{};
  if (get_v1 && get_v1(&parent, device) == CUDA_SUCCESS &&
      memcmp(parent.bytes, uuid.bytes, 16) != 0)
    prefix = "MIG-";
  format_uuid(uuid, prefix, out, capacity);
  return true;
}

bool context_device(CUcontext context, CUdevice* device) noexcept {
  using GetDeviceV2 = CUresult (*)(CUdevice*, CUcontext);
  static std::atomic<void*> v2_cache{nullptr};
  if (auto get_v2 = cached_real<GetDeviceV2>(v2_cache, "cuCtxGetDevice_v2", &real_driver_symbol)) {
    if (get_v2(device, context) == CUDA_SUCCESS) return true;
  }
  auto get_current = QUANTA_REAL(cuCtxGetCurrent);
  auto get_device = QUANTA_REAL(cuCtxGetDevice);
  auto push = QUANTA_REAL(cuCtxPushCurrent_v2);
  auto pop = QUANTA_REAL(cuCtxPopCurrent_v2);
  if (!get_current || !get_device || !push || !pop) return false;
  CUcontext current = nullptr;
  if (get_current(&current) != CUDA_SUCCESS) return false;
  if (current == context) return get_device(device) == CUDA_SUCCESS;
  if (push(context) != CUDA_SUCCESS) return false;
  const bool ok = get_device(device) == CUDA_SUCCESS;
  CUcontext popped = nullptr;
  pop(&popped);
  return ok;
}

bool device_with_uuid(const CUuuid& uuid, CUdevice* device) noexcept {
  auto init = QUANTA_REAL(cuInit);
  auto count = QUANTA_REAL(cuDeviceGetCount);
  auto get = QUANTA_REAL(cuDeviceGet);
  if (!init || !count || !get || init(0) != CUDA_SUCCESS) return false;
  int devices = 0;
  if (count(&devices) != CUDA_SUCCESS) return false;
  for (int ordinal = 0; ordinal < devices; ++ordinal) {
    CUdevice candidate = 0;
    CUuuid candidate_uuid;
    if (get(&candidate, ordinal) != CUDA_SUCCESS || !device_uuid(candidate, &candidate_uuid))
      continue;
    if (!memcmp(candidate_uuid.bytes, uuid.bytes, sizeof uuid.bytes)) {
      *device = candidate;
      return true;
    }
  }
  return false;
}

bool parse_uuid(const char* text, CUuuid* uuid) noexcept {
  const char* dash = strchr(text, '-');
  if (!dash) return false;
  const char* p = dash + 1;
  for (int byte = 0; byte < 16; ++byte) {
    while (*p == '-') ++p;
    const int high = hex_value(p[0]);
    const int low = high < 0 ? -1 : hex_value(p[1]);
    if (high < 0 || low < 0) return false;
    uuid->bytes[byte] = static_cast<char>(high << 4 | low);
    p += 2;
  }
  return *p == '\0' || *p == '/';
}

void format_uuid(const CUuuid& uuid, const char* prefix, char* out, size_t capacity) noexcept {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  snprintf(out, capacity, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           prefix, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
           b[13], b[14], b[15]);
}

}  // namespace quanta::shim
