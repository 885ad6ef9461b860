// Ledger wrappers: every allocation family reserves against the pod's cap before the
// driver call (over the cap: CUDA_ERROR_OUT_OF_MEMORY, the driver never called) and is
// returned on free, on failure, or when its context goes away. Frees of pointers the shim
// did not track still reach the driver and change no accounting.
//
// Graph memory nodes: a node's bytes are noted on its graph when added and charged when
// the graph is instantiated (that is when the driver commits the memory to the exec
// graph), once per exec; they return at cuGraphExecDestroy. Allocations made inside a
// stream capture are charged at the capture; frees captured are refunded once a launch of
// their graph has completed (held_memory.h).
//
// What the driver holds after a free: pool allocations go back to their pool, which keeps
// the charge until the driver's reserve shrinks (at a synchronisation, cuMemPoolTrimTo,
// destroy); a cuMemCreate handle released while mapped stays charged until its last
// cuMemUnmap.
#define __CUDA_API_VERSION_INTERNAL 1
#include <atomic>

#include "shim/base/log.h"
#include "shim/base/options.h"
#include "shim/interpose/charge.h"
#include "shim/interpose/devices.h"
#include "shim/interpose/held_memory.h"
#include "shim/interpose/pod_ledger.h"
#include "shim/interpose/real_driver.h"
#include "shim/interposed.h"

using namespace quanta::shim;

namespace {

inline uint64_t key_of(const void* handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

// The device and context an allocation made now belongs to (the current context's).
struct Target {
  CUdevice device = 0;
  CUcontext context = nullptr;
  bool known = false;
};
Target current_target() noexcept {
  Target target;
  target.known = current_device(&target.device);
  target.context = target.known ? current_context() : nullptr;
  return target;
}

// Reserve, call the driver, then commit or cancel. `call` makes the real call; `key`
// reads the new pointer or handle after it succeeded.
template <typename Call, typename Key>
CUresult counted_call(const Target& target, uint64_t bytes, Resource resource, Call&& call,
                      Key&& key) noexcept {
  if (!target.known) return call();  // no context: the driver will refuse, nothing to count
  Charge charge;
  if (!charge.reserve(target.device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult result = call();
  if (result != CUDA_SUCCESS) {
    charge.cancel();
    return result;
  }
  charge.commit(resource, key(), target.context);
  return result;
}

// cuMemAlloc-like: `bytes` on the current context's device, keyed by the returned pointer.
template <typename Real, typename Pointer, typename... Args>
CUresult device_alloc(const char* name, Real real, Pointer* dptr, uint64_t bytes,
                      Args... args) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled()) return real(dptr, args...);
  return counted_call(
      current_target(), bytes, Resource::device_memory, [&] { return real(dptr, args...); },
      [&] { return static_cast<uint64_t>(*dptr); });
}

// cuMemAllocPitch: the pitch is known only after the call, so reserve width × height,
// then the padding; if the padding does not fit, free again and refuse.
template <typename Real, typename Free, typename Pointer, typename Size>
CUresult pitch_alloc(const char* name, Real real, Free real_free, Pointer* dptr, Size* pitch,
                     Size width, Size height, unsigned int element_bytes) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled()) return real(dptr, pitch, width, height, element_bytes);
  const Target target = current_target();
  if (!target.known) return real(dptr, pitch, width, height, element_bytes);
  Charge charge;
  if (!charge.reserve(target.device, static_cast<uint64_t>(width) * height))
    return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult result = real(dptr, pitch, width, height, element_bytes);
  if (result != CUDA_SUCCESS) {
    charge.cancel();
    return result;
  }
  const uint64_t actual = static_cast<uint64_t>(*pitch) * height;
  if (actual > charge.bytes() && !charge.grow(actual - charge.bytes())) {
    if (real_free) real_free(*dptr);
    charge.cancel();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  charge.commit(Resource::device_memory, static_cast<uint64_t>(*dptr), target.context);
  return result;
}

template <typename Real>
CUresult device_free(const char* name, Real real, CUdeviceptr_v2 dptr) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled()) return real(dptr);
  return free_tracked(Resource::device_memory, dptr, [&] { return real(dptr); });
}

template <typename Real, typename Handle>
CUresult handle_free(const char* name, Real real, Resource resource, Handle handle) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled()) return real(handle);
  return free_tracked(resource, key_of(handle), [&] { return real(handle); });
}

}  // namespace

// ---- Linear device memory ---------------------------------------------------------------

QUANTA_EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  return device_alloc("cuMemAlloc", QUANTA_REAL(cuMemAlloc), dptr, bytesize, bytesize);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return device_alloc("cuMemAlloc_v2", QUANTA_REAL(cuMemAlloc_v2), dptr, bytesize, bytesize);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pPitch,
                                               unsigned int WidthInBytes, unsigned int Height,
                                               unsigned int ElementSizeBytes) {
  return pitch_alloc("cuMemAllocPitch", QUANTA_REAL(cuMemAllocPitch), QUANTA_REAL(cuMemFree), dptr,
                     pPitch, WidthInBytes, Height, ElementSizeBytes);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch,
                                                  size_t WidthInBytes, size_t Height,
                                                  unsigned int ElementSizeBytes) {
  return pitch_alloc("cuMemAllocPitch_v2", QUANTA_REAL(cuMemAllocPitch_v2),
                     QUANTA_REAL(cuMemFree_v2), dptr, pPitch, WidthInBytes, Height,
                     ElementSizeBytes);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize,
                                                 unsigned int flags) {
  auto real = QUANTA_REAL(cuMemAllocManaged);
  if (real && !shim_disabled() && !link_settings().count_managed) {
    if (link_refuses_cuda()) return CUDA_ERROR_OUT_OF_MEMORY;
    return real(dptr, bytesize, flags);
  }
  return device_alloc("cuMemAllocManaged", real, dptr, bytesize, bytesize, flags);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr) {
  auto real = QUANTA_REAL(cuMemFree);
  if (!real) return driver_entry_missing("cuMemFree");
  if (shim_disabled()) return real(dptr);
  return free_tracked(Resource::device_memory, dptr, [&] { return real(dptr); });
}

QUANTA_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return device_free("cuMemFree_v2", QUANTA_REAL(cuMemFree_v2), dptr);
}

// ---- Stream-ordered allocations and pools -----------------------------------------------

namespace {

// A stream-ordered allocation from `pool` (null: the device's current pool). A pool's
// memory lives where its properties say: pools recorded at cuMemPoolCreate with a host
// location are not counted; unknown pools (device default pools) are the current
// device's. Charged through the pool's slot, so what the pool reuses from its cache is
// not charged again. During a capture it is a graph allocation, charged like a plain one.
// Without an account yet (the process may still join) it is recorded like a plain one.
template <typename Call>
CUresult stream_ordered_alloc(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                              CUstream stream, Call&& call) noexcept {
  Target target = current_target();
  if (pool) {
    Allocation recorded;
    if (AllocationTable::instance().find(Resource::memory_pool, key_of(pool), &recorded)) {
      if (recorded.device == kHostDevice) return call();
      target.device = recorded.device;
      target.known = true;
    }
  }
  auto key = [&] { return static_cast<uint64_t>(*dptr); };
  if (!target.known || bytesize == 0 || stream_is_capturing(stream))
    return counted_call(target, bytesize, Resource::device_memory, call, key);
  if (link_refuses_cuda()) return CUDA_ERROR_OUT_OF_MEMORY;
  MemoryAccount account;
  auto current_pool = QUANTA_REAL(cuDeviceGetMemPool);
  if (!link_memory_account(target.device, &account) || !account.pod_used ||
      (!pool && (!current_pool || current_pool(&pool, target.device) != CUDA_SUCCESS)))
    return counted_call(target, bytesize, Resource::device_memory, call, key);
  uint32_t slot = kNoPoolSlot;
  if (!pool_reserve(pool, target.device, account, bytesize, &slot)) {
    QUANTA_LOG_INFO(
        "refusing %llu bytes from a pool on device %d: the pod's memory cap would be "
        "passed",
        static_cast<unsigned long long>(bytesize), target.device);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = call();
  if (result != CUDA_SUCCESS) {
    if (slot == kNoPoolSlot) {
      PodLedger::release(account, bytesize);
    } else {
      pool_return(slot, bytesize);
      pool_settle(pool);
    }
    return result;
  }
  const Allocation allocation{bytesize,
                              target.device,
                              target.context,
                              slot == kNoPoolSlot ? 0 : slot,
                              slot == kNoPoolSlot ? 0u : kPoolMember,
                              account.epoch};
  // A full table keeps the charge for good (over-counting is the safe side of a cap).
  if (AllocationTable::instance().insert(Resource::device_memory, key(), allocation) &&
      slot == kNoPoolSlot)
    charge_follows_account(Resource::device_memory, key(), target.device, account.epoch);
  return result;
}

template <typename Real>
CUresult alloc_async(const char* name, Real real, CUdeviceptr* dptr, size_t bytesize,
                     CUstream stream) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled()) return real(dptr, bytesize, stream);
  return stream_ordered_alloc(dptr, bytesize, nullptr, stream,
                              [&] { return real(dptr, bytesize, stream); });
}

template <typename Real>
CUresult pool_alloc(const char* name, Real real, CUdeviceptr* dptr, size_t bytesize,
                    CUmemoryPool pool, CUstream stream) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled() || !pool) return real(dptr, bytesize, pool, stream);
  return stream_ordered_alloc(dptr, bytesize, pool, stream,
                              [&] { return real(dptr, bytesize, pool, stream); });
}

// During a capture the free is a node of the graph: the record and its charge stay until a
// launch of that graph has run. Otherwise as any free (a pool allocation's bytes go back
// to its pool).
template <typename Real>
CUresult free_async(const char* name, Real real, CUdeviceptr dptr, CUstream stream) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled()) return real(dptr, stream);
  if (stream_is_capturing(stream)) {
    const CUresult result = real(dptr, stream);
    Allocation allocation;
    if (result == CUDA_SUCCESS &&
        AllocationTable::instance().find(Resource::device_memory, dptr, &allocation))
      note_captured_free(dptr, stream);
    return result;
  }
  return free_tracked(Resource::device_memory, dptr, [&] { return real(dptr, stream); });
}

}  // namespace

QUANTA_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize,
                                               CUstream hStream) {
  return alloc_async("cuMemAllocAsync", QUANTA_REAL(cuMemAllocAsync), dptr, bytesize, hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                    CUstream hStream) {
  return alloc_async("cuMemAllocAsync_ptsz", QUANTA_REAL(cuMemAllocAsync_ptsz), dptr, bytesize,
                     hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize,
                                                       CUmemoryPool pool, CUstream hStream) {
  return pool_alloc("cuMemAllocFromPoolAsync", QUANTA_REAL(cuMemAllocFromPoolAsync), dptr, bytesize,
                    pool, hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                                            CUmemoryPool pool, CUstream hStream) {
  return pool_alloc("cuMemAllocFromPoolAsync_ptsz", QUANTA_REAL(cuMemAllocFromPoolAsync_ptsz), dptr,
                    bytesize, pool, hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return free_async("cuMemFreeAsync", QUANTA_REAL(cuMemFreeAsync), dptr, hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return free_async("cuMemFreeAsync_ptsz", QUANTA_REAL(cuMemFreeAsync_ptsz), dptr, hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool,
                                               const CUmemPoolProps* poolProps) {
  auto real = QUANTA_REAL(cuMemPoolCreate);
  if (!real) return driver_entry_missing("cuMemPoolCreate");
  const CUresult result = real(pool, poolProps);
  if (result != CUDA_SUCCESS || shim_disabled() || !poolProps) return result;
  const bool device_memory =
      poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
      (poolProps->allocType != CU_MEM_ALLOCATION_TYPE_MANAGED || link_settings().count_managed);
  AllocationTable::instance().insert(
      Resource::memory_pool, key_of(*pool),
      Allocation{0, device_memory ? poolProps->location.id : kHostDevice, nullptr});
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  auto real = QUANTA_REAL(cuMemPoolDestroy);
  if (!real) return driver_entry_missing("cuMemPoolDestroy");
  if (shim_disabled()) return real(pool);
  const CUresult result =
      free_tracked(Resource::memory_pool, key_of(pool), [&] { return real(pool); });
  if (result == CUDA_SUCCESS) pool_destroyed(pool);
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  auto real = QUANTA_REAL(cuMemPoolTrimTo);
  if (!real) return driver_entry_missing("cuMemPoolTrimTo");
  const CUresult result = real(pool, minBytesToKeep);
  if (result == CUDA_SUCCESS && !shim_disabled()) pool_settle(pool);
  return result;
}

// ---- Synchronisations: where pools give memory back -------------------------------------

namespace {

template <typename Real, typename... Args>
CUresult synchronize(const char* name, Real real, Args... args) noexcept {
  if (!real) return driver_entry_missing(name);
  const CUresult result = real(args...);
  if (!shim_disabled()) settle_held_memory();
  return result;
}

}  // namespace

QUANTA_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  return synchronize("cuStreamSynchronize", QUANTA_REAL(cuStreamSynchronize), hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) {
  return synchronize("cuStreamSynchronize_ptsz", QUANTA_REAL(cuStreamSynchronize_ptsz), hStream);
}

QUANTA_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  return synchronize("cuEventSynchronize", QUANTA_REAL(cuEventSynchronize), hEvent);
}

QUANTA_EXPORT CUresult CUDAAPI cuCtxSynchronize() {
  return synchronize("cuCtxSynchronize", QUANTA_REAL(cuCtxSynchronize));
}

QUANTA_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  return synchronize("cuCtxSynchronize_v2", QUANTA_REAL(cuCtxSynchronize_v2), ctx);
}

// ---- Stream capture ---------------------------------------------------------------------

namespace {

template <typename Real>
CUresult end_capture(const char* name, Real real, CUstream stream, CUgraph* graph) noexcept {
  if (!real) return driver_entry_missing(name);
  const CUresult result = real(stream, graph);
  if (!shim_disabled())
    note_capture_ended(stream, result == CUDA_SUCCESS && graph ? *graph : nullptr);
  return result;
}

}  // namespace

QUANTA_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return end_capture("cuStreamEndCapture", QUANTA_REAL(cuStreamEndCapture), hStream, phGraph);
}

QUANTA_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return end_capture("cuStreamEndCapture_ptsz", QUANTA_REAL(cuStreamEndCapture_ptsz), hStream,
                     phGraph);
}

// ---- Virtual memory management ----------------------------------------------------------

// Only device locations are GPU memory; host and host-NUMA handles pass uncounted.
QUANTA_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                           const CUmemAllocationProp* prop,
                                           unsigned long long flags) {
  auto real = QUANTA_REAL(cuMemCreate);
  if (!real) return driver_entry_missing("cuMemCreate");
  if (shim_disabled() || !prop || !handle || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);
  Target target;
  target.device = prop->location.id;
  target.known = true;  // not bound to a context: handles outlive them
  return counted_call(
      target, size, Resource::generic_handle, [&] { return real(handle, size, prop, flags); },
      [&] { return static_cast<uint64_t>(*handle); });
}

// The handle goes, but its memory only with its last mapping: a handle still mapped is
// marked released and refunded at its last cuMemUnmap. The record's aux counts its live
// mappings; map, unmap and release edit it atomically (AllocationTable::modify).
QUANTA_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto real = QUANTA_REAL(cuMemRelease);
  if (!real) return driver_entry_missing("cuMemRelease");
  if (shim_disabled()) return real(handle);
  const CUresult result = real(handle);
  if (result != CUDA_SUCCESS && !free_failure_means_released(result)) return result;
  Allocation gone;
  bool removed = false;
  AllocationTable::instance().modify(
      Resource::generic_handle, handle,
      [&](Allocation& allocation) {
        if (result == CUDA_SUCCESS && allocation.aux > 0) {
          allocation.flags |= kReleased;
          return true;
        }
        removed = true;
        return false;
      },
      &gone);
  if (removed) refund(gone);
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                        CUmemGenericAllocationHandle handle,
                                        unsigned long long flags) {
  auto real = QUANTA_REAL(cuMemMap);
  if (!real) return driver_entry_missing("cuMemMap");
  if (shim_disabled()) return real(ptr, size, offset, handle, flags);
  AllocationTable& table = AllocationTable::instance();
  // Counted before the call, so a racing release never sees it unmapped while mapping.
  const bool tracked = table.modify(Resource::generic_handle, handle, [](Allocation& allocation) {
    ++allocation.aux;
    return true;
  });
  const CUresult result = real(ptr, size, offset, handle, flags);
  if (!tracked) return result;
  if (result == CUDA_SUCCESS &&
      table.insert(Resource::vmm_mapping, ptr, Allocation{size, 0, nullptr, handle, 0}))
    return result;
  // Failed, or the mapping cannot be recorded (full table): a failed map takes its count
  // back; an unrecorded one keeps it, so the handle stays charged (the safe side).
  if (result != CUDA_SUCCESS)
    table.modify(Resource::generic_handle, handle, [](Allocation& allocation) {
      --allocation.aux;
      return true;
    });
  return result;
}

namespace {

// One mapping of a tracked handle is gone: the handle's last, once released, refunds it.
void mapping_gone(CUmemGenericAllocationHandle handle) noexcept {
  Allocation gone;
  bool removed = false;
  AllocationTable::instance().modify(
      Resource::generic_handle, handle,
      [&](Allocation& allocation) {
        if (allocation.aux > 0) --allocation.aux;
        if (allocation.aux == 0 && (allocation.flags & kReleased)) {
          removed = true;
          return false;
        }
        return true;
      },
      &gone);
  if (removed) refund(gone);
}

}  // namespace

// The range may cover several adjacent mappings (it must cover each whole): each recorded
// one in it is taken out after the driver unmapped it.
QUANTA_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  auto real = QUANTA_REAL(cuMemUnmap);
  if (!real) return driver_entry_missing("cuMemUnmap");
  if (shim_disabled()) return real(ptr, size);
  const CUresult result = real(ptr, size);
  if (result != CUDA_SUCCESS) return result;
  AllocationTable& table = AllocationTable::instance();
  constexpr int kMaxMappingsPerUnmap = 4096;  // bounds the walk whatever the table holds
  CUdeviceptr at = ptr;
  for (int i = 0; i < kMaxMappingsPerUnmap && at < ptr + size; ++i) {
    Allocation mapping;
    if (!table.remove(Resource::vmm_mapping, at, &mapping) || mapping.bytes == 0) break;
    mapping_gone(static_cast<CUmemGenericAllocationHandle>(mapping.aux));
    at += mapping.bytes;
  }
  return result;
}

// ---- Arrays -----------------------------------------------------------------------------

namespace {

// Bytes per element of one channel; planar video formats count their luma plane plus
// chroma (rounded up), block-compressed ones one byte per texel (BC2/3/5/6/7) or half.
uint64_t format_bytes_x2(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
    case CU_AD_FORMAT_YUY2:
    case CU_AD_FORMAT_NV16:
      return 4;
    case CU_AD_FORMAT_NV12:
      return 3;
    case CU_AD_FORMAT_P010:
    case CU_AD_FORMAT_P016:
      return 6;
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
      return 1;
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB:
      return 2;
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
      return 8;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
      return 16;
    default:
      return 8;  // 32-bit formats and anything newer: 4 bytes
  }
}

// Block-compressed and multi-channel packed formats above already include their channels.
bool format_counts_channels(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_HALF:
    case CU_AD_FORMAT_FLOAT:
      return true;
    default:
      return false;
  }
}

uint64_t array_bytes(uint64_t width, uint64_t height, uint64_t depth, CUarray_format format,
                     unsigned channels) {
  const uint64_t texels = width * (height ? height : 1) * (depth ? depth : 1);
  const uint64_t per_texel_x2 =
      format_bytes_x2(format) * (format_counts_channels(format) && channels ? channels : 1);
  return (texels * per_texel_x2 + 1) / 2;
}

// All levels of a mipmapped array: each level halves every dimension (layers and cube
// faces excepted) down to 1.
uint64_t mipmapped_bytes(const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned levels) {
  const bool layered = desc.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP);
  uint64_t width = desc.Width, height = desc.Height, depth = desc.Depth, total = 0;
  for (unsigned level = 0; level < (levels ? levels : 1); ++level) {
    total += array_bytes(width, height, depth, desc.Format, desc.NumChannels);
    width = width > 1 ? width / 2 : 1;
    height = height > 1 ? height / 2 : height;
    if (!layered) depth = depth > 1 ? depth / 2 : depth;
  }
  return total;
}

// Bytes of one array from any of its descriptor layouts (2D ones have no Depth).
template <typename Descriptor>
uint64_t descriptor_bytes(const Descriptor& desc) {
  uint64_t depth = 1;
  if constexpr (requires { desc.Depth; }) depth = desc.Depth;
  return array_bytes(desc.Width, desc.Height, depth, desc.Format, desc.NumChannels);
}

template <typename Real, typename Descriptor>
CUresult array_create(const char* name, Real real, CUarray* handle,
                      const Descriptor* desc) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled() || !handle || !desc) return real(handle, desc);
  return counted_call(
      current_target(), descriptor_bytes(*desc), Resource::array,
      [&] { return real(handle, desc); }, [&] { return key_of(*handle); });
}

}  // namespace

QUANTA_EXPORT CUresult CUDAAPI cuArrayCreate(CUarray* pHandle,
                                             const CUDA_ARRAY_DESCRIPTOR_v1* pAllocateArray) {
  return array_create("cuArrayCreate", QUANTA_REAL(cuArrayCreate), pHandle, pAllocateArray);
}

QUANTA_EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray* pHandle,
                                                const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  return array_create("cuArrayCreate_v2", QUANTA_REAL(cuArrayCreate_v2), pHandle, pAllocateArray);
}

QUANTA_EXPORT CUresult CUDAAPI cuArray3DCreate(CUarray* pHandle,
                                               const CUDA_ARRAY3D_DESCRIPTOR_v1* pAllocateArray) {
  return array_create("cuArray3DCreate", QUANTA_REAL(cuArray3DCreate), pHandle, pAllocateArray);
}

QUANTA_EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray* pHandle,
                                                  const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  return array_create("cuArray3DCreate_v2", QUANTA_REAL(cuArray3DCreate_v2), pHandle,
                      pAllocateArray);
}

QUANTA_EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray hArray) {
  return handle_free("cuArrayDestroy", QUANTA_REAL(cuArrayDestroy), Resource::array, hArray);
}

QUANTA_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(
    CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pMipmappedArrayDesc,
    unsigned int numMipmapLevels) {
  auto real = QUANTA_REAL(cuMipmappedArrayCreate);
  if (!real) return driver_entry_missing("cuMipmappedArrayCreate");
  if (shim_disabled() || !pHandle || !pMipmappedArrayDesc)
    return real(pHandle, pMipmappedArrayDesc, numMipmapLevels);
  return counted_call(
      current_target(), mipmapped_bytes(*pMipmappedArrayDesc, numMipmapLevels),
      Resource::mipmapped_array,
      [&] { return real(pHandle, pMipmappedArrayDesc, numMipmapLevels); },
      [&] { return key_of(*pHandle); });
}

QUANTA_EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  return handle_free("cuMipmappedArrayDestroy", QUANTA_REAL(cuMipmappedArrayDestroy),
                     Resource::mipmapped_array, hMipmappedArray);
}

// ---- Graph memory nodes -----------------------------------------------------------------

namespace {

// Adds a memory-alloc node's bytes to its graph's pending total (graphs are not
// thread-safe objects in CUDA, so take-and-put-back is race-free per graph).
template <typename Params>
void note_graph_allocation(CUgraph graph, const Params& params) noexcept {
  if (params.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || params.bytesize == 0) return;
  AllocationTable& table = AllocationTable::instance();
  Allocation pending{0, params.poolProps.location.id, nullptr};
  table.remove(Resource::graph_pending, key_of(graph), &pending);
  pending.bytes += params.bytesize;
  table.insert(Resource::graph_pending, key_of(graph), pending);
}

template <typename Call>
CUresult instantiate(CUgraphExec* exec, CUgraph graph, Call&& call) noexcept {
  Allocation pending;
  if (shim_disabled() || !exec ||
      !AllocationTable::instance().find(Resource::graph_pending, key_of(graph), &pending))
    return call();
  Target target;
  target.device = pending.device;
  target.context = current_context();
  target.known = true;
  return counted_call(target, pending.bytes, Resource::graph_exec, call,
                      [&] { return key_of(*exec); });
}

// Every instantiation: frees captured into `graph` now belong to the exec.
template <typename Call>
CUresult instantiate_noting_frees(CUgraphExec* exec, CUgraph graph, Call&& call) noexcept {
  const CUresult result = instantiate(exec, graph, call);
  if (result == CUDA_SUCCESS && exec && !shim_disabled()) note_graph_instantiated(graph, *exec);
  return result;
}

}  // namespace

QUANTA_EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                      const CUgraphNode* dependencies,
                                                      size_t numDependencies,
                                                      CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  auto real = QUANTA_REAL(cuGraphAddMemAllocNode);
  if (!real) return driver_entry_missing("cuGraphAddMemAllocNode");
  const CUresult result = real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  if (result == CUDA_SUCCESS && nodeParams && !shim_disabled())
    note_graph_allocation(hGraph, *nodeParams);
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies,
                                              size_t numDependencies,
                                              CUgraphNodeParams* nodeParams) {
  auto real = QUANTA_REAL(cuGraphAddNode);
  if (!real) return driver_entry_missing("cuGraphAddNode");
  const CUresult result = real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  if (result == CUDA_SUCCESS && nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
      !shim_disabled())
    note_graph_allocation(hGraph, nodeParams->alloc);
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                 const CUgraphNode* dependencies,
                                                 const CUgraphEdgeData* dependencyData,
                                                 size_t numDependencies,
                                                 CUgraphNodeParams* nodeParams) {
  auto real = QUANTA_REAL(cuGraphAddNode_v2);
  if (!real) return driver_entry_missing("cuGraphAddNode_v2");
  const CUresult result =
      real(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
  if (result == CUDA_SUCCESS && nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
      !shim_disabled())
    note_graph_allocation(hGraph, nodeParams->alloc);
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  auto real = QUANTA_REAL(cuGraphDestroy);
  if (!real) return driver_entry_missing("cuGraphDestroy");
  const CUresult result = real(hGraph);
  if (result == CUDA_SUCCESS && !shim_disabled()) {
    AllocationTable::instance().remove(Resource::graph_pending, key_of(hGraph), nullptr);
    note_graph_destroyed(hGraph);
  }
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                  CUgraphNode* phErrorNode, char* logBuffer,
                                                  size_t bufferSize) {
  auto real = QUANTA_REAL(cuGraphInstantiate);
  if (!real) return driver_entry_missing("cuGraphInstantiate");
  return instantiate_noting_frees(phGraphExec, hGraph, [&] {
    return real(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
  });
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                     CUgraphNode* phErrorNode, char* logBuffer,
                                                     size_t bufferSize) {
  auto real = QUANTA_REAL(cuGraphInstantiate_v2);
  if (!real) return driver_entry_missing("cuGraphInstantiate_v2");
  return instantiate_noting_frees(phGraphExec, hGraph, [&] {
    return real(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
  });
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                           unsigned long long flags) {
  auto real = QUANTA_REAL(cuGraphInstantiateWithFlags);
  if (!real) return driver_entry_missing("cuGraphInstantiateWithFlags");
  return instantiate_noting_frees(phGraphExec, hGraph,
                                  [&] { return real(phGraphExec, hGraph, flags); });
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  auto real = QUANTA_REAL(cuGraphInstantiateWithParams);
  if (!real) return driver_entry_missing("cuGraphInstantiateWithParams");
  return instantiate_noting_frees(phGraphExec, hGraph,
                                  [&] { return real(phGraphExec, hGraph, instantiateParams); });
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec* phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  auto real = QUANTA_REAL(cuGraphInstantiateWithParams_ptsz);
  if (!real) return driver_entry_missing("cuGraphInstantiateWithParams_ptsz");
  return instantiate_noting_frees(phGraphExec, hGraph,
                                  [&] { return real(phGraphExec, hGraph, instantiateParams); });
}

QUANTA_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  const CUresult result = handle_free("cuGraphExecDestroy", QUANTA_REAL(cuGraphExecDestroy),
                                      Resource::graph_exec, hGraphExec);
  if (result == CUDA_SUCCESS && !shim_disabled()) note_graph_exec_destroyed(hGraphExec);
  return result;
}

// ---- Contexts: a fixed overhead each (link_settings().context_overhead) -----------------
// A process the link refuses CUDA to cannot create one: CUDA_ERROR_DEVICE_UNAVAILABLE, what
// a GPU in the prohibited compute mode answers, so frameworks report the device as busy or
// unavailable (not out of memory) and a later attempt succeeds once the process is placed.

namespace {

template <typename Call>
CUresult create_context(CUcontext* pctx, CUdevice device, Call&& call) noexcept {
  if (shim_disabled() || !pctx) return call();
  if (link_refuses_cuda()) return CUDA_ERROR_DEVICE_UNAVAILABLE;
  Charge charge;
  if (!charge.reserve(device, link_settings().context_overhead)) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult result = call();
  if (result != CUDA_SUCCESS) {
    charge.cancel();
    return result;
  }
  charge.commit(Resource::context, key_of(*pctx), *pctx);  // swept with the context itself
  return result;
}

// The link forgets a context before the driver destroys it (it may be draining work on
// it); the memory made in it is returned once the driver has really freed it.
template <typename Real>
CUresult destroy_context(const char* name, Real real, CUcontext context) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled()) return real(context);
  link_forget_context(context);
  const CUresult result = real(context);
  if (result == CUDA_SUCCESS) return_context_allocations(context);
  return result;
}

// Primary contexts are reference-counted by the driver: charged at the first retain,
// returned (with everything allocated in them) at the last release.
constexpr int kPrimaryDevices = 64;
std::atomic<int> g_primary_retains[kPrimaryDevices];
std::atomic<CUcontext> g_primary_context[kPrimaryDevices];

bool tracked_primary(CUdevice device) {
  return device >= 0 && device < kPrimaryDevices;
}

template <typename Real>
CUresult release_primary(const char* name, Real real, CUdevice device) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled() || !tracked_primary(device)) return real(device);
  const CUcontext context = g_primary_context[device].load(std::memory_order_acquire);
  if (g_primary_retains[device].load(std::memory_order_acquire) == 1) link_forget_context(context);
  const CUresult result = real(device);
  if (result != CUDA_SUCCESS) return result;
  const int before = g_primary_retains[device].fetch_sub(1, std::memory_order_acq_rel);
  if (before == 1) {
    return_context_allocations(context);
  } else if (before <= 0) {
    g_primary_retains[device].fetch_add(
        1, std::memory_order_acq_rel);  // a retain made before the shim saw it
  }
  return result;
}

// A reset frees everything in the primary context but keeps it retained: return the
// allocations, then charge the (re-created) context's overhead again.
template <typename Real>
CUresult reset_primary(const char* name, Real real, CUdevice device) noexcept {
  if (!real) return driver_entry_missing(name);
  if (shim_disabled() || !tracked_primary(device)) return real(device);
  const CUcontext context = g_primary_context[device].load(std::memory_order_acquire);
  if (context) link_forget_context(context);
  const CUresult result = real(device);
  if (result != CUDA_SUCCESS || !context) return result;
  return_context_allocations(context);
  if (g_primary_retains[device].load(std::memory_order_acquire) > 0) {
    Charge charge;
    if (charge.reserve(device, link_settings().context_overhead))
      charge.commit(Resource::context, key_of(context), context);
  }
  return result;
}

}  // namespace

QUANTA_EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  auto real = QUANTA_REAL(cuCtxCreate);
  if (!real) return driver_entry_missing("cuCtxCreate");
  return create_context(pctx, dev, [&] { return real(pctx, flags, dev); });
}

QUANTA_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  auto real = QUANTA_REAL(cuCtxCreate_v2);
  if (!real) return driver_entry_missing("cuCtxCreate_v2");
  return create_context(pctx, dev, [&] { return real(pctx, flags, dev); });
}

QUANTA_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray,
                                              int numParams, unsigned int flags, CUdevice dev) {
  auto real = QUANTA_REAL(cuCtxCreate_v3);
  if (!real) return driver_entry_missing("cuCtxCreate_v3");
  return create_context(pctx, dev, [&] { return real(pctx, paramsArray, numParams, flags, dev); });
}

QUANTA_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                              unsigned int flags, CUdevice dev) {
  auto real = QUANTA_REAL(cuCtxCreate_v4);
  if (!real) return driver_entry_missing("cuCtxCreate_v4");
  return create_context(pctx, dev, [&] { return real(pctx, ctxCreateParams, flags, dev); });
}

QUANTA_EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
  return destroy_context("cuCtxDestroy", QUANTA_REAL(cuCtxDestroy), ctx);
}

QUANTA_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  return destroy_context("cuCtxDestroy_v2", QUANTA_REAL(cuCtxDestroy_v2), ctx);
}

QUANTA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  auto real = QUANTA_REAL(cuDevicePrimaryCtxRetain);
  if (!real) return driver_entry_missing("cuDevicePrimaryCtxRetain");
  if (shim_disabled() || !pctx || !tracked_primary(dev)) return real(pctx, dev);
  if (link_refuses_cuda()) return CUDA_ERROR_DEVICE_UNAVAILABLE;
  const bool first = g_primary_retains[dev].fetch_add(1, std::memory_order_acq_rel) == 0;
  Charge charge;
  if (first && !charge.reserve(dev, link_settings().context_overhead)) {
    g_primary_retains[dev].fetch_sub(1, std::memory_order_acq_rel);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = real(pctx, dev);
  if (result != CUDA_SUCCESS) {
    g_primary_retains[dev].fetch_sub(1, std::memory_order_acq_rel);
    charge.cancel();
    return result;
  }
  if (first) {
    g_primary_context[dev].store(*pctx, std::memory_order_release);
    charge.commit(Resource::context, key_of(*pctx), *pctx);
  }
  return result;
}

QUANTA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  return release_primary("cuDevicePrimaryCtxRelease", QUANTA_REAL(cuDevicePrimaryCtxRelease), dev);
}

QUANTA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return release_primary("cuDevicePrimaryCtxRelease_v2", QUANTA_REAL(cuDevicePrimaryCtxRelease_v2),
                         dev);
}

QUANTA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
  return reset_primary("cuDevicePrimaryCtxReset", QUANTA_REAL(cuDevicePrimaryCtxReset), dev);
}

QUANTA_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return reset_primary("cuDevicePrimaryCtxReset_v2", QUANTA_REAL(cuDevicePrimaryCtxReset_v2), dev);
}
