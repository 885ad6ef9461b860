// Driver entry points for every allocation family (linear, pitch, managed, host, async
// and pools, VMM, arrays) and for copies, sets and pointer queries. Device memory is
// process-local memory charged against the device's global capacity.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "tests/simgpu/runtime.h"

using namespace quanta::simgpu;

struct CUarray_st {
  CUdeviceptr ptr = 0;
  size_t size = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
};

struct CUmipmappedArray_st {
  CUdeviceptr ptr = 0;
  size_t size = 0;
};

namespace {

constexpr size_t kVmmGranularity = 2u << 20;

// Physical memory made by cuMemCreate. cuMemRelease drops the handle, but the memory
// stays allocated (and charged) until its last mapping is unmapped, as the driver does.
struct MemHandle {
  int device = 0;
  size_t size = 0;
  int fd = -1;
  int mappings = 0;
  bool released = false;
};

// Frees a handle's physical memory once it is released and no longer mapped. Called with
// the runtime lock held.
void free_if_unreferenced(MemHandle* h) {
  if (!h->released || h->mappings > 0) return;
  release_device_memory(device_state(h->device), runtime().pid, h->size);
  close(h->fd);
  delete h;
}

size_t format_bytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    default:
      return 4;
  }
}

CUresult alloc_current(size_t bytes, AllocKind kind, CUdeviceptr* dptr) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  return allocate_device_memory(ctx, bytes, kind, dptr);
}

// Stream-ordered allocation is immediate here (no kernel ever reads device memory, so
// only the capacity accounting is observable). During a capture it is a graph
// allocation: an alloc node in the capture's graph, its memory made (and charged) now and
// not from the pool.
CUresult alloc_on_stream(size_t bytes, CUstream h, CUmemoryPool pool, CUdeviceptr* dptr) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  if (s != nullptr && s->capture != nullptr) {
    if (CUresult r = allocate_device_memory(ctx, bytes, AllocKind::Device, dptr); r != CUDA_SUCCESS)
      return r;
    auto node = std::make_unique<CUgraphNode_st>();
    node->type = GraphNodeType::MemAlloc;
    node->dptr = *dptr;
    add_graph_node(s->capture, std::move(node));
    return CUDA_SUCCESS;
  }
  return allocate_from_pool(ctx, pool ? pool : current_pool(ctx->device), bytes, dptr);
}

bool is_pool(CUmemoryPool pool) {
  if (pool == nullptr) return false;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  for (int d = 0; d < rt.device_count; ++d)
    if (pool == &rt.default_pool[d]) return true;
  return has_handle(pool, HandleKind::Pool);
}

bool is_device_range(CUdeviceptr p, size_t bytes) {
  Allocation a;
  return find_allocation(static_cast<uintptr_t>(p), bytes, &a) && a.device >= 0;
}

// Performs a copy or set now (the data is visible at once) and charges its duration to
// the stream; synchronous variants then wait for it like the driver does.
CUresult transfer(CUstream h, size_t bytes, bool synchronous) {
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  Ticket t = enqueue_work(ctx, s, transfer_duration_ns(bytes));
  if (synchronous) engine_for(ctx->device).wait(t);
  return CUDA_SUCCESS;
}

enum class CopyKind { HtoD, DtoH, DtoD, Any };

CUresult copy(CopyKind kind, void* dst, const void* src, size_t bytes, CUstream h,
              bool synchronous) {
  SIMGPU_REQUIRE_INIT();
  const auto dst_dev = reinterpret_cast<CUdeviceptr>(dst);
  const auto src_dev = reinterpret_cast<CUdeviceptr>(src);
  if ((kind == CopyKind::HtoD || kind == CopyKind::DtoD) && !is_device_range(dst_dev, bytes))
    return CUDA_ERROR_INVALID_VALUE;
  if ((kind == CopyKind::DtoH || kind == CopyKind::DtoD) && !is_device_range(src_dev, bytes))
    return CUDA_ERROR_INVALID_VALUE;
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > 0) std::memmove(dst, src, bytes);
  return transfer(h, bytes, synchronous);
}

template <typename T>
CUresult set(CUdeviceptr dst, T value, size_t count, CUstream h, bool synchronous) {
  SIMGPU_REQUIRE_INIT();
  if (!is_device_range(dst, count * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  T* p = reinterpret_cast<T*>(dst);
  std::fill(p, p + count, value);
  return transfer(h, count * sizeof(T), synchronous);
}

CUresult create_array(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR& desc) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (pHandle == nullptr || desc.Width == 0 || desc.NumChannels == 0)
    return CUDA_ERROR_INVALID_VALUE;
  const size_t bytes = desc.Width * std::max<size_t>(desc.Height, 1) *
                       std::max<size_t>(desc.Depth, 1) * desc.NumChannels *
                       format_bytes(desc.Format);
  auto* a = new CUarray_st();
  a->size = bytes;
  a->desc = desc;
  if (CUresult r = allocate_device_memory(ctx, bytes, AllocKind::Array, &a->ptr);
      r != CUDA_SUCCESS) {
    delete a;
    return r;
  }
  add_handle(a, HandleKind::Array);
  *pHandle = a;
  return CUDA_SUCCESS;
}

// 2D sets: Height rows of Width elements, rows dstPitch bytes apart.
template <typename T>
CUresult set_2d(CUdeviceptr dst, size_t pitch, T value, size_t width, size_t height, CUstream h,
                bool synchronous) {
  SIMGPU_REQUIRE_INIT();
  if (height == 0 || width == 0) return CUDA_SUCCESS;
  if (pitch < width * sizeof(T) || !is_device_range(dst, pitch * (height - 1) + width * sizeof(T)))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t row = 0; row < height; ++row) {
    T* p = reinterpret_cast<T*>(dst + row * pitch);
    std::fill(p, p + width, value);
  }
  return transfer(h, width * height * sizeof(T), synchronous);
}

}  // namespace

extern "C" {

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return alloc_current(bytesize, AllocKind::Device, dptr);
}
CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  // The 32-bit legacy entry point can only return addresses below 4 GiB, which a
  // process-local mapping does not give; it is reported as unsupported.
  (void)dptr;
  (void)bytesize;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
  if (pPitch == nullptr || WidthInBytes == 0 || Height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
    return CUDA_ERROR_INVALID_VALUE;
  const size_t pitch = (WidthInBytes + 511) / 512 * 512;
  CUresult r = alloc_current(pitch * Height, AllocKind::Pitch, dptr);
  if (r == CUDA_SUCCESS) *pPitch = pitch;
  return r;
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int) {
  return alloc_current(bytesize, AllocKind::Managed, dptr);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  SIMGPU_REQUIRE_INIT();
  if (dptr == 0) return CUDA_SUCCESS;
  Allocation a;
  if (!find_allocation(dptr, 1, &a) || a.kind == AllocKind::Host) return CUDA_ERROR_INVALID_VALUE;
  return free_device_memory(dptr);
}
CUresult cuMemFree(CUdeviceptr_v1) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  DeviceState& d = device_state(ctx->device);
  DeviceLock lock(d);
  *total = d.capacity;
  *free = d.capacity - std::min(d.capacity, d.used);
  return CUDA_SUCCESS;
}
CUresult cuMemGetInfo(unsigned int* free, unsigned int* total) {
  size_t f = 0, t = 0;
  CUresult r = cuMemGetInfo_v2(&f, &t);
  if (r != CUDA_SUCCESS) return r;
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *free = static_cast<unsigned>(std::min<size_t>(f, 0xffffffffu));
  *total = static_cast<unsigned>(std::min<size_t>(t, 0xffffffffu));
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  SIMGPU_REQUIRE_INIT();
  Allocation a;
  uintptr_t base = 0;
  if (!find_allocation(dptr, 1, &a, &base)) return CUDA_ERROR_NOT_FOUND;
  if (pbase) *pbase = base;
  if (psize) *psize = a.size;
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  if (pp == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p = 0;
  CUresult r = alloc_current(bytesize, AllocKind::Host, &p);
  if (r == CUDA_SUCCESS) *pp = reinterpret_cast<void*>(p);
  return r;
}
CUresult cuMemAllocHost(void** pp, unsigned int bytesize) {
  return cuMemAllocHost_v2(pp, bytesize);
}
CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int) {
  return cuMemAllocHost_v2(pp, bytesize);
}

CUresult cuMemFreeHost(void* p) {
  SIMGPU_REQUIRE_INIT();
  Allocation a;
  if (!find_allocation(reinterpret_cast<uintptr_t>(p), 1, &a) || a.kind != AllocKind::Host)
    return CUDA_ERROR_INVALID_VALUE;
  return free_device_memory(reinterpret_cast<CUdeviceptr>(p));
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int) {
  SIMGPU_REQUIRE_INIT();
  if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing: the same address
  return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void*, size_t, unsigned int) {
  SIMGPU_REQUIRE_INIT();
  return CUDA_SUCCESS;
}
CUresult cuMemHostUnregister(void*) {
  SIMGPU_REQUIRE_INIT();
  return CUDA_SUCCESS;
}

// Stream-ordered allocation and pools.
CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return alloc_on_stream(bytesize, hStream, nullptr, dptr);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return alloc_on_stream(bytesize, hStream, nullptr, dptr);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream) {
  SIMGPU_REQUIRE_INIT();
  if (!is_pool(pool)) return CUDA_ERROR_INVALID_VALUE;
  return alloc_on_stream(bytesize, hStream, pool, dptr);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
  return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}
// A pool allocation goes back to its pool (which keeps it cached up to its release
// threshold). During a capture the free is a free node of the capture's graph and frees
// nothing until the graph is launched.
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  SIMGPU_REQUIRE_INIT();
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(hStream, ctx, s); r != CUDA_SUCCESS) return r;
  if (s != nullptr && s->capture != nullptr) {
    Allocation a;
    if (!find_allocation(dptr, 1, &a) || a.kind == AllocKind::Host || a.kind == AllocKind::Vmm)
      return CUDA_ERROR_INVALID_VALUE;
    auto node = std::make_unique<CUgraphNode_st>();
    node->type = GraphNodeType::MemFree;
    node->dptr = dptr;
    add_graph_node(s->capture, std::move(node));
    return CUDA_SUCCESS;
  }
  return cuMemFree_v2(dptr);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return cuMemFreeAsync(dptr, hStream);
}

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  SIMGPU_REQUIRE_INIT();
  if (pool == nullptr || poolProps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int dev = poolProps->location.id;
  if (dev < 0 || dev >= runtime().device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto* p = new CUmemPoolHandle_st();
  p->device = dev;
  Runtime& rt = runtime();
  {
    std::lock_guard lock(rt.mu);
    rt.pools.push_back(p);
  }
  add_handle(p, HandleKind::Pool);
  *pool = p;
  return CUDA_SUCCESS;
}
// As the driver: with allocations outstanding the pool goes once the last is freed; its
// cached memory is given back now.
CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(pool, HandleKind::Pool)) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  for (int d = 0; d < rt.device_count; ++d)
    if (rt.current_pool[d] == pool) rt.current_pool[d] = nullptr;
  remove_handle(pool);
  pool->destroyed = true;
  trim_pool(pool, 0);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  SIMGPU_REQUIRE_INIT();
  if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= runtime().device_count) return CUDA_ERROR_INVALID_DEVICE;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  rt.default_pool[dev].device = dev;
  rt.default_pool[dev].is_default = true;
  *pool_out = &rt.default_pool[dev];
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  SIMGPU_REQUIRE_INIT();
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= runtime().device_count) return CUDA_ERROR_INVALID_DEVICE;
  *pool = current_pool(dev);
  return CUDA_SUCCESS;
}
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  SIMGPU_REQUIRE_INIT();
  if (dev < 0 || dev >= runtime().device_count) return CUDA_ERROR_INVALID_DEVICE;
  if (!is_pool(pool) || pool->device != dev) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  rt.current_pool[dev] = pool;
  return CUDA_SUCCESS;
}
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  SIMGPU_REQUIRE_INIT();
  if (!is_pool(pool) || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      return CUDA_SUCCESS;  // reuse policy: every free is reusable at once here
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      pool->threshold = *static_cast<cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->reserved_high = pool->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
      pool->used_high = pool->used;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  SIMGPU_REQUIRE_INIT();
  if (!is_pool(pool) || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = 1;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *out = pool->threshold;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *out = pool->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *out = pool->reserved_high;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *out = pool->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *out = pool->used_high;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}
// Gives back cached memory until the pool holds at most max(minBytesToKeep, used).
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  SIMGPU_REQUIRE_INIT();
  if (!is_pool(pool)) return CUDA_ERROR_INVALID_VALUE;
  trim_pool(pool, minBytesToKeep);
  return CUDA_SUCCESS;
}

// Virtual memory management: a handle is physical memory (a memfd charged to the
// device), a reservation is PROT_NONE address space, and a mapping puts one in the other.
CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags) {
  SIMGPU_REQUIRE_INIT();
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *granularity = kVmmGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long) {
  SIMGPU_REQUIRE_INIT();
  if (handle == nullptr || prop == nullptr || size == 0 || size % kVmmGranularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  const int dev = prop->location.id;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || dev < 0 || dev >= rt.device_count)
    return CUDA_ERROR_INVALID_DEVICE;
  const int fd = memfd_create("simgpu-vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (!reserve_device_memory(device_state(dev), rt.pid, size)) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto* h = new MemHandle{dev, size, fd};
  add_handle(h, HandleKind::MemHandle);
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(h);
  return CUDA_SUCCESS;
}

// The handle is gone at once; its memory only with its last mapping (cuMemUnmap).
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIMGPU_REQUIRE_INIT();
  auto* h = reinterpret_cast<MemHandle*>(handle);
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  if (!has_handle(h, HandleKind::MemHandle)) return CUDA_ERROR_INVALID_VALUE;
  remove_handle(h);
  h->released = true;
  free_if_unreferenced(h);
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr,
                             unsigned long long) {
  SIMGPU_REQUIRE_INIT();
  if (ptr == nullptr || size == 0 || size % kVmmGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t align = std::max(alignment, kVmmGranularity);
  void* raw =
      mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t base = (reinterpret_cast<uintptr_t>(raw) + align - 1) / align * align;
  // Trim the slack so the reservation is exactly [base, base + size).
  if (base > reinterpret_cast<uintptr_t>(raw)) munmap(raw, base - reinterpret_cast<uintptr_t>(raw));
  const uintptr_t end = reinterpret_cast<uintptr_t>(raw) + size + align;
  if (end > base + size) munmap(reinterpret_cast<void*>(base + size), end - (base + size));
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  SIMGPU_REQUIRE_INIT();
  if (ptr == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(ptr), size);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long) {
  SIMGPU_REQUIRE_INIT();
  auto* h = reinterpret_cast<MemHandle*>(handle);
  if (!has_handle(h, HandleKind::MemHandle) || ptr == 0 || size == 0 || offset + size > h->size)
    return CUDA_ERROR_INVALID_VALUE;
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 h->fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  Allocation a{size, h->device, current_context(), AllocKind::Vmm, false};
  a.vmm_handle = h;
  rt.allocations[ptr] = a;
  ++h->mappings;
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  SIMGPU_REQUIRE_INIT();
  if (ptr == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto it = rt.allocations.lower_bound(ptr);
  while (it != rt.allocations.end() && it->first < ptr + size) {
    if (it->second.kind != AllocKind::Vmm) {
      ++it;
      continue;
    }
    auto* h = static_cast<MemHandle*>(it->second.vmm_handle);
    it = rt.allocations.erase(it);
    // The last mapping of a released handle frees its physical memory.
    if (h != nullptr && --h->mappings == 0) free_if_unreferenced(h);
  }
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  SIMGPU_REQUIRE_INIT();
  if (ptr == 0 || size == 0 || (count > 0 && desc == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                CUmemGenericAllocationHandle handle) {
  SIMGPU_REQUIRE_INIT();
  auto* h = reinterpret_cast<MemHandle*>(handle);
  if (prop == nullptr || !has_handle(h, HandleKind::MemHandle)) return CUDA_ERROR_INVALID_VALUE;
  std::memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = h->device;
  return CUDA_SUCCESS;
}

// Arrays: linear memory of the described size, charged like any allocation.
CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* pAllocateArray) {
  if (pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = pAllocateArray->Width;
  d.Height = pAllocateArray->Height;
  d.Format = pAllocateArray->Format;
  d.NumChannels = pAllocateArray->NumChannels;
  return create_array(pHandle, d);
}
CUresult cuArrayCreate(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = p->Width;
  d.Height = p->Height;
  d.Format = p->Format;
  d.NumChannels = p->NumChannels;
  return create_array(pHandle, d);
}
CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* pAllocateArray) {
  if (pAllocateArray == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return create_array(pHandle, *pAllocateArray);
}
CUresult cuArray3DCreate(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = p->Width;
  d.Height = p->Height;
  d.Depth = p->Depth;
  d.Format = p->Format;
  d.NumChannels = p->NumChannels;
  d.Flags = p->Flags;
  return create_array(pHandle, d);
}
CUresult cuArrayDestroy(CUarray hArray) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hArray, HandleKind::Array)) return CUDA_ERROR_INVALID_HANDLE;
  remove_handle(hArray);
  free_device_memory(hArray->ptr);
  delete hArray;
  return CUDA_SUCCESS;
}
CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* desc, CUarray hArray) {
  SIMGPU_REQUIRE_INIT();
  if (desc == nullptr || !has_handle(hArray, HandleKind::Array)) return CUDA_ERROR_INVALID_HANDLE;
  *desc = hArray->desc;
  return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                unsigned int numLevels) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (pHandle == nullptr || desc == nullptr || numLevels == 0 || desc->Width == 0)
    return CUDA_ERROR_INVALID_VALUE;
  size_t total = 0;
  size_t w = desc->Width, h = std::max<size_t>(desc->Height, 1),
         d = std::max<size_t>(desc->Depth, 1);
  for (unsigned level = 0; level < numLevels; ++level) {
    total += w * h * d * desc->NumChannels * format_bytes(desc->Format);
    w = std::max<size_t>(w / 2, 1);
    h = std::max<size_t>(h / 2, 1);
    d = std::max<size_t>(d / 2, 1);
  }
  auto* m = new CUmipmappedArray_st();
  m->size = total;
  if (CUresult r = allocate_device_memory(ctx, total, AllocKind::Array, &m->ptr);
      r != CUDA_SUCCESS) {
    delete m;
    return r;
  }
  add_handle(m, HandleKind::MipmappedArray);
  *pHandle = m;
  return CUDA_SUCCESS;
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray h) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(h, HandleKind::MipmappedArray)) return CUDA_ERROR_INVALID_HANDLE;
  remove_handle(h);
  free_device_memory(h->ptr);
  delete h;
  return CUDA_SUCCESS;
}

// Copies. Unified addressing makes every pointer a plain address; the typed variants
// check that their device side is device memory.
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(CopyKind::Any, reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n, nullptr,
              true);
}
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(CopyKind::Any, reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n,
              CU_STREAM_PER_THREAD, true);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(CopyKind::Any, reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n, s,
              false);
}
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return cuMemcpyAsync(dst, src, n, s);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return copy(CopyKind::HtoD, reinterpret_cast<void*>(dst), src, n, nullptr, true);
}
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  return copy(CopyKind::HtoD, reinterpret_cast<void*>(dst), src, n, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return copy(CopyKind::DtoH, dst, reinterpret_cast<void*>(src), n, nullptr, true);
}
CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  return copy(CopyKind::DtoH, dst, reinterpret_cast<void*>(src), n, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(CopyKind::DtoD, reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n,
              nullptr, true);
}
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy(CopyKind::DtoD, reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n,
              CU_STREAM_PER_THREAD, true);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return copy(CopyKind::HtoD, reinterpret_cast<void*>(dst), src, n, s, false);
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return cuMemcpyHtoDAsync_v2(dst, src, n, s);
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(CopyKind::DtoH, dst, reinterpret_cast<void*>(src), n, s, false);
}
CUresult cuMemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  return cuMemcpyDtoHAsync_v2(dst, src, n, s);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(CopyKind::DtoD, reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), n, s,
              false);
}
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return cuMemcpyDtoDAsync_v2(dst, src, n, s);
}

// Sets. The plain forms wait for completion, like the legacy default stream.
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  return set<uint8_t>(d, v, n, nullptr, true);
}
CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) {
  return set<uint8_t>(d, v, n, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) {
  return set<uint16_t>(d, v, n, nullptr, true);
}
CUresult cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) {
  return set<uint16_t>(d, v, n, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) {
  return set<uint32_t>(d, v, n, nullptr, true);
}
CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) {
  return set<uint32_t>(d, v, n, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return set<uint8_t>(d, v, n, s, false);
}
CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return set<uint8_t>(d, v, n, s, false);
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  return set<uint16_t>(d, v, n, s, false);
}
CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  return set<uint16_t>(d, v, n, s, false);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  return set<uint32_t>(d, v, n, s, false);
}
CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  return set<uint32_t>(d, v, n, s, false);
}

CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) {
  return set_2d<uint8_t>(d, pitch, v, w, h, nullptr, true);
}
CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) {
  return set_2d<uint8_t>(d, pitch, v, w, h, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) {
  return set_2d<uint16_t>(d, pitch, v, w, h, nullptr, true);
}
CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) {
  return set_2d<uint16_t>(d, pitch, v, w, h, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) {
  return set_2d<uint32_t>(d, pitch, v, w, h, nullptr, true);
}
CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) {
  return set_2d<uint32_t>(d, pitch, v, w, h, CU_STREAM_PER_THREAD, true);
}
CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h,
                           CUstream s) {
  return set_2d<uint8_t>(d, pitch, v, w, h, s, false);
}
CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h,
                                CUstream s) {
  return set_2d<uint8_t>(d, pitch, v, w, h, s, false);
}
CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h,
                            CUstream s) {
  return set_2d<uint16_t>(d, pitch, v, w, h, s, false);
}
CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h,
                                 CUstream s) {
  return set_2d<uint16_t>(d, pitch, v, w, h, s, false);
}
CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h,
                            CUstream s) {
  return set_2d<uint32_t>(d, pitch, v, w, h, s, false);
}
CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h,
                                 CUstream s) {
  return set_2d<uint32_t>(d, pitch, v, w, h, s, false);
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  SIMGPU_REQUIRE_INIT();
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  uintptr_t base = 0;
  if (!find_allocation(ptr, 1, &a, &base)) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = a.ctx;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = a.device < 0 ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<unsigned*>(data) = a.kind == AllocKind::Managed;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a.device < 0 ? 0 : a.device;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = base;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = a.size;
      break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<unsigned*>(data) = 1;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<unsigned*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = nullptr;
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = base;
      break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      *static_cast<unsigned*>(data) = 1;
      break;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
                                void** data, CUdeviceptr ptr) {
  SIMGPU_REQUIRE_INIT();
  if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < numAttributes; ++i) {
    CUresult r = cuPointerGetAttribute(data[i], attributes[i], ptr);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_SUPPORTED) return r;
  }
  return CUDA_SUCCESS;
}

}  // extern "C"
