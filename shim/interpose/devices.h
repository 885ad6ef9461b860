// Which device and context a call is about, asked of the real driver: the current
// context and its device, and each device's UUID (ledger accounts are kept per physical
// GPU, so CUDA_VISIBLE_DEVICES renumbering never moves usage to another GPU).
#pragma once

#include <cuda.h>

#include <cstddef>

namespace quanta::shim {

// The calling thread's current context, or nullptr.
CUcontext current_context() noexcept;

// The current context's device. False when there is no current context.
bool current_device(CUdevice* device) noexcept;

// The UUID of `device` (cuDeviceGetUuid_v2: a MIG instance has its own), cached per ordinal.
bool device_uuid(CUdevice device, CUuuid* uuid) noexcept;

// The UUID of `device` as the arbiter names it, "GPU-…" or "MIG-…" (a MIG instance is told
// apart from its GPU the way the driver allows: the legacy cuDeviceGetUuid answers with the
// parent GPU's UUID, the _v2 entry with the instance's own). `out` holds kUuidLen bytes.
bool device_uuid_name(CUdevice device, char* out, size_t capacity) noexcept;

// The device a context belongs to, without disturbing the caller's current context for
// longer than the lookup.
bool context_device(CUcontext context, CUdevice* device) noexcept;

// The ordinal, in this process's numbering, of the device with this UUID. Initialises the
// driver (cuInit) if the process has not: used by NVML callers, which may never have.
bool device_with_uuid(const CUuuid& uuid, CUdevice* device) noexcept;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (NVML's form, prefix chosen by the caller)
// into 16 bytes, and back. parse accepts any prefix ending in '-' ("GPU-", "MIG-").
bool parse_uuid(const char* text, CUuuid* uuid) noexcept;
void format_uuid(const CUuuid& uuid, const char* prefix, char* out, size_t capacity) noexcept;

}  // namespace quanta::shim
