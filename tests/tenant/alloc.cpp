// The allocation mode: one family of allocation calls repeated --count times (or until
// the first denial with --race), held or freed one by one, counting successes,
// CUDA_ERROR_OUT_OF_MEMORY denials (an expected result) and other errors by name.
#include <algorithm>
#include <cmath>
#include <map>

#include "tests/tenant/gpu.h"
#include "tests/tenant/modes.h"

namespace quanta::tenant {
namespace {

// What one successful allocation holds, whatever the family.
struct Allocation {
  CUdeviceptr pointer = 0;
  void* host = nullptr;
  CUmemGenericAllocationHandle handle = 0;
  CUarray array = nullptr;
  CUmipmappedArray mipmapped = nullptr;
  std::uint64_t bytes = 0;  // what the family asked of the driver
};

// 4-byte elements (four 8-bit channels) laid out within the 2D/3D dimension limits:
// 2D rows of 32768 texels (up to 4 GiB in 32768 rows), 3D layers of 1024 x 1024.
struct Extent {
  std::size_t width = 1, height = 1, depth = 0;
};
constexpr std::uint64_t kElementBytes = 4;

Extent extent_2d(std::uint64_t bytes) {
  const std::uint64_t elements = (bytes + kElementBytes - 1) / kElementBytes;
  Extent extent;
  extent.width = static_cast<std::size_t>(std::min<std::uint64_t>(elements, 32768));
  extent.height = static_cast<std::size_t>((elements + extent.width - 1) / extent.width);
  return extent;
}

Extent extent_3d(std::uint64_t bytes) {
  const std::uint64_t elements = (bytes + kElementBytes - 1) / kElementBytes;
  Extent extent;
  extent.width = static_cast<std::size_t>(std::min<std::uint64_t>(elements, 1024));
  extent.height = static_cast<std::size_t>(
      std::min<std::uint64_t>((elements + extent.width - 1) / extent.width, 1024));
  const std::uint64_t layer = static_cast<std::uint64_t>(extent.width) * extent.height;
  extent.depth = static_cast<std::size_t>((elements + layer - 1) / layer);
  return extent;
}

CUDA_ARRAY3D_DESCRIPTOR descriptor(const Extent& extent) {
  CUDA_ARRAY3D_DESCRIPTOR description{};
  description.Width = extent.width;
  description.Height = extent.height;
  description.Depth = extent.depth;
  description.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  description.NumChannels = 4;
  return description;
}

CUmemAllocationProp device_memory(CUdevice device) {
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  properties.location.id = device;
  return properties;
}

class Allocator {
 public:
  Allocator(Gpu& gpu, AllocFamily family) : gpu_(gpu), driver_(gpu.driver()), family_(family) {}
  ~Allocator() {
    if (pool_ != nullptr && driver_.MemPoolDestroy != nullptr) driver_.MemPoolDestroy(pool_);
  }

  // Resolves the family's entries up front so a missing one is one clear error.
  void prepare() {
    switch (family_) {
      case AllocFamily::alloc:
        need(driver_, driver_.MemAlloc, "cuMemAlloc");
        need(driver_, driver_.MemFree, "cuMemFree");
        break;
      case AllocFamily::pitch:
        need(driver_, driver_.MemAllocPitch, "cuMemAllocPitch");
        need(driver_, driver_.MemFree, "cuMemFree");
        break;
      case AllocFamily::managed:
        need(driver_, driver_.MemAllocManaged, "cuMemAllocManaged");
        need(driver_, driver_.MemFree, "cuMemFree");
        break;
      case AllocFamily::host:
        need(driver_, driver_.MemAllocHost, "cuMemAllocHost");
        need(driver_, driver_.MemFreeHost, "cuMemFreeHost");
        break;
      case AllocFamily::vmm: {
        need(driver_, driver_.MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
        need(driver_, driver_.MemCreate, "cuMemCreate");
        need(driver_, driver_.MemRelease, "cuMemRelease");
        need(driver_, driver_.MemAddressReserve, "cuMemAddressReserve");
        need(driver_, driver_.MemAddressFree, "cuMemAddressFree");
        need(driver_, driver_.MemMap, "cuMemMap");
        need(driver_, driver_.MemUnmap, "cuMemUnmap");
        need(driver_, driver_.MemSetAccess, "cuMemSetAccess");
        CUmemAllocationProp properties = device_memory(gpu_.device());
        check(driver_,
              driver_.MemGetAllocationGranularity(&granularity_, &properties,
                                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              "cuMemGetAllocationGranularity");
        break;
      }
      case AllocFamily::async:
        need(driver_, driver_.MemAllocAsync, "cuMemAllocAsync");
        need(driver_, driver_.MemFreeAsync, "cuMemFreeAsync");
        need(driver_, driver_.StreamSynchronize, "cuStreamSynchronize");
        break;
      case AllocFamily::pool: {
        need(driver_, driver_.MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
        need(driver_, driver_.MemFreeAsync, "cuMemFreeAsync");
        need(driver_, driver_.StreamSynchronize, "cuStreamSynchronize");
        CUmemPoolProps properties{};
        properties.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        properties.location.id = gpu_.device();
        check(driver_, need(driver_, driver_.MemPoolCreate, "cuMemPoolCreate")(&pool_, &properties),
              "cuMemPoolCreate");
        break;
      }
      case AllocFamily::array:
        need(driver_, driver_.ArrayCreate, "cuArrayCreate");
        need(driver_, driver_.ArrayDestroy, "cuArrayDestroy");
        break;
      case AllocFamily::array3d:
        need(driver_, driver_.Array3DCreate, "cuArray3DCreate");
        need(driver_, driver_.ArrayDestroy, "cuArrayDestroy");
        break;
      case AllocFamily::mipmapped:
        need(driver_, driver_.MipmappedArrayCreate, "cuMipmappedArrayCreate");
        need(driver_, driver_.MipmappedArrayDestroy, "cuMipmappedArrayDestroy");
        break;
      case AllocFamily::graph_node:
        need(driver_, driver_.GraphCreate, "cuGraphCreate");
        need(driver_, driver_.GraphAddMemAllocNode, "cuGraphAddMemAllocNode");
        need(driver_, driver_.GraphInstantiate, "cuGraphInstantiateWithFlags");
        need(driver_, driver_.GraphLaunch, "cuGraphLaunch");
        need(driver_, driver_.GraphExecDestroy, "cuGraphExecDestroy");
        need(driver_, driver_.GraphDestroy, "cuGraphDestroy");
        need(driver_, driver_.MemFreeAsync, "cuMemFreeAsync");
        need(driver_, driver_.StreamSynchronize, "cuStreamSynchronize");
        break;
    }
  }

  // Returns the driver's result; only CUDA_SUCCESS fills allocation. The call named in
  // last_call() is the one that produced the result.
  CUresult allocate(std::uint64_t bytes, Allocation& allocation) {
    allocation = Allocation{};
    allocation.bytes = bytes;
    const CUstream stream = gpu_.stream();
    switch (family_) {
      case AllocFamily::alloc:
        last_call_ = "cuMemAlloc";
        return driver_.MemAlloc(&allocation.pointer, bytes);
      case AllocFamily::pitch: {
        // Rows of at most 4 KiB: the driver pads each row to its pitch.
        const std::size_t width = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, 4096));
        const std::size_t height = static_cast<std::size_t>((bytes + width - 1) / width);
        std::size_t pitch = 0;
        last_call_ = "cuMemAllocPitch";
        const CUresult result =
            driver_.MemAllocPitch(&allocation.pointer, &pitch, width, height, 4);
        if (result == CUDA_SUCCESS) allocation.bytes = static_cast<std::uint64_t>(pitch) * height;
        return result;
      }
      case AllocFamily::managed:
        last_call_ = "cuMemAllocManaged";
        return driver_.MemAllocManaged(&allocation.pointer, bytes, CU_MEM_ATTACH_GLOBAL);
      case AllocFamily::host:
        last_call_ = "cuMemAllocHost";
        return driver_.MemAllocHost(&allocation.host, bytes);
      case AllocFamily::vmm:
        return allocate_vmm(bytes, allocation);
      case AllocFamily::async: {
        last_call_ = "cuMemAllocAsync";
        CUresult result = driver_.MemAllocAsync(&allocation.pointer, bytes, stream);
        if (result != CUDA_SUCCESS) return result;
        last_call_ = "cuStreamSynchronize";
        return driver_.StreamSynchronize(stream);
      }
      case AllocFamily::pool: {
        last_call_ = "cuMemAllocFromPoolAsync";
        CUresult result = driver_.MemAllocFromPoolAsync(&allocation.pointer, bytes, pool_, stream);
        if (result != CUDA_SUCCESS) return result;
        last_call_ = "cuStreamSynchronize";
        return driver_.StreamSynchronize(stream);
      }
      case AllocFamily::array: {
        const Extent extent = extent_2d(bytes);
        CUDA_ARRAY_DESCRIPTOR description{};
        description.Width = extent.width;
        description.Height = extent.height;
        description.Format = CU_AD_FORMAT_UNSIGNED_INT8;
        description.NumChannels = 4;
        allocation.bytes = static_cast<std::uint64_t>(extent.width) * extent.height * kElementBytes;
        last_call_ = "cuArrayCreate";
        return driver_.ArrayCreate(&allocation.array, &description);
      }
      case AllocFamily::array3d: {
        const Extent extent = extent_3d(bytes);
        const CUDA_ARRAY3D_DESCRIPTOR description = descriptor(extent);
        allocation.bytes =
            static_cast<std::uint64_t>(extent.width) * extent.height * extent.depth * kElementBytes;
        last_call_ = "cuArray3DCreate";
        return driver_.Array3DCreate(&allocation.array, &description);
      }
      case AllocFamily::mipmapped: {
        // A 2D base level and its full chain of halvings (about 4/3 of the base).
        Extent extent = extent_2d(bytes);
        const CUDA_ARRAY3D_DESCRIPTOR description = descriptor(extent);
        unsigned int levels = 0;
        std::uint64_t total = 0;
        for (std::size_t w = extent.width, h = extent.height;;
             w = std::max<std::size_t>(w / 2, 1), h = std::max<std::size_t>(h / 2, 1)) {
          total += static_cast<std::uint64_t>(w) * h * kElementBytes;
          ++levels;
          if (w == 1 && h == 1) break;
        }
        allocation.bytes = total;
        last_call_ = "cuMipmappedArrayCreate";
        return driver_.MipmappedArrayCreate(&allocation.mipmapped, &description, levels);
      }
      case AllocFamily::graph_node:
        return allocate_graph_node(bytes, allocation);
    }
    return CUDA_ERROR_INVALID_VALUE;
  }

  CUresult release(Allocation& allocation) {
    const CUstream stream = gpu_.stream();
    switch (family_) {
      case AllocFamily::alloc:
      case AllocFamily::pitch:
      case AllocFamily::managed:
        last_call_ = "cuMemFree";
        return driver_.MemFree(allocation.pointer);
      case AllocFamily::host:
        last_call_ = "cuMemFreeHost";
        return driver_.MemFreeHost(allocation.host);
      case AllocFamily::vmm: {
        last_call_ = "cuMemUnmap";
        CUresult result = driver_.MemUnmap(allocation.pointer, allocation.bytes);
        if (result != CUDA_SUCCESS) return result;
        last_call_ = "cuMemRelease";
        if ((result = driver_.MemRelease(allocation.handle)) != CUDA_SUCCESS) return result;
        last_call_ = "cuMemAddressFree";
        return driver_.MemAddressFree(allocation.pointer, allocation.bytes);
      }
      case AllocFamily::async:
      case AllocFamily::pool:
      case AllocFamily::graph_node: {
        last_call_ = "cuMemFreeAsync";
        CUresult result = driver_.MemFreeAsync(allocation.pointer, stream);
        if (result != CUDA_SUCCESS) return result;
        last_call_ = "cuStreamSynchronize";
        return driver_.StreamSynchronize(stream);
      }
      case AllocFamily::array:
      case AllocFamily::array3d:
        last_call_ = "cuArrayDestroy";
        return driver_.ArrayDestroy(allocation.array);
      case AllocFamily::mipmapped:
        last_call_ = "cuMipmappedArrayDestroy";
        return driver_.MipmappedArrayDestroy(allocation.mipmapped);
    }
    return CUDA_ERROR_INVALID_VALUE;
  }

  const char* last_call() const { return last_call_; }

 private:
  CUresult allocate_vmm(std::uint64_t bytes, Allocation& allocation) {
    // Physical memory in granularity steps, reserved, mapped and made accessible, as
    // PyTorch's expandable segments do.
    const std::uint64_t size = (bytes + granularity_ - 1) / granularity_ * granularity_;
    allocation.bytes = size;
    CUmemAllocationProp properties = device_memory(gpu_.device());
    last_call_ = "cuMemCreate";
    CUresult result = driver_.MemCreate(&allocation.handle, size, &properties, 0);
    if (result != CUDA_SUCCESS) return result;
    last_call_ = "cuMemAddressReserve";
    if ((result = driver_.MemAddressReserve(&allocation.pointer, size, 0, 0, 0)) != CUDA_SUCCESS) {
      driver_.MemRelease(allocation.handle);
      return result;
    }
    last_call_ = "cuMemMap";
    if ((result = driver_.MemMap(allocation.pointer, size, 0, allocation.handle, 0)) !=
        CUDA_SUCCESS) {
      driver_.MemAddressFree(allocation.pointer, size);
      driver_.MemRelease(allocation.handle);
      return result;
    }
    CUmemAccessDesc access{};
    access.location = properties.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    last_call_ = "cuMemSetAccess";
    if ((result = driver_.MemSetAccess(allocation.pointer, size, &access, 1)) != CUDA_SUCCESS) {
      driver_.MemUnmap(allocation.pointer, size);
      driver_.MemAddressFree(allocation.pointer, size);
      driver_.MemRelease(allocation.handle);
    }
    return result;
  }

  CUresult allocate_graph_node(std::uint64_t bytes, Allocation& allocation) {
    // A one-node graph whose allocation outlives it: freed later with cuMemFreeAsync.
    CUgraph graph = nullptr;
    last_call_ = "cuGraphCreate";
    CUresult result = driver_.GraphCreate(&graph, 0);
    if (result != CUDA_SUCCESS) return result;
    CUDA_MEM_ALLOC_NODE_PARAMS parameters{};
    parameters.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    parameters.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    parameters.poolProps.location.id = gpu_.device();
    parameters.bytesize = bytes;
    CUgraphNode node = nullptr;
    CUgraphExec executable = nullptr;
    last_call_ = "cuGraphAddMemAllocNode";
    result = driver_.GraphAddMemAllocNode(&node, graph, nullptr, 0, &parameters);
    if (result == CUDA_SUCCESS) {
      last_call_ = "cuGraphInstantiate";
      result = driver_.GraphInstantiate(&executable, graph, 0);
    }
    if (result == CUDA_SUCCESS) {
      last_call_ = "cuGraphLaunch";
      result = driver_.GraphLaunch(executable, gpu_.stream());
      if (result == CUDA_SUCCESS) {
        last_call_ = "cuStreamSynchronize";
        result = driver_.StreamSynchronize(gpu_.stream());
      }
    }
    if (executable != nullptr) driver_.GraphExecDestroy(executable);
    driver_.GraphDestroy(graph);
    if (result == CUDA_SUCCESS) allocation.pointer = parameters.dptr;
    return result;
  }

  Gpu& gpu_;
  const Driver& driver_;
  AllocFamily family_;
  std::size_t granularity_ = 1;
  CUmemoryPool pool_ = nullptr;
  const char* last_call_ = "";
};

double mean(const std::vector<double>& samples) {
  double sum = 0;
  for (double sample : samples) sum += sample;
  return samples.empty() ? 0.0 : sum / static_cast<double>(samples.size());
}

double nanoseconds_since(Clock::time_point start) {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

}  // namespace

bool run_alloc(const Driver& driver, const Options& options, nlohmann::json& report) {
  Gpu gpu(driver, options);
  Allocator allocator(gpu, options.family);
  allocator.prepare();
  const std::uint64_t count = options.count.value_or(options.race ? UINT64_MAX : 1);
  const auto hold = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(options.hold_ms));

  std::vector<Allocation> held;
  std::uint64_t successes = 0, denials = 0, held_bytes = 0, peak_bytes = 0;
  std::map<std::string, std::uint64_t> errors;
  nlohmann::json first_error;
  std::vector<double> alloc_ns, free_ns;
  auto count_error = [&](CUresult result, const char* call) {
    const std::string name = error_name(driver, result);
    if (errors[name]++ == 0 && first_error.is_null())
      first_error = {{"call", call}, {"name", name}};
  };
  auto release = [&](Allocation& allocation) {
    const auto before = Clock::now();
    const CUresult result = allocator.release(allocation);
    free_ns.push_back(nanoseconds_since(before));
    if (result != CUDA_SUCCESS) count_error(result, allocator.last_call());
    held_bytes -= allocation.bytes;
  };

  wait_for_start(options, report);
  const auto start = Clock::now();
  Clock::duration holding{};
  for (std::uint64_t i = 0; i < count; ++i) {
    Allocation allocation;
    const auto before = Clock::now();
    const CUresult result = allocator.allocate(options.bytes, allocation);
    alloc_ns.push_back(nanoseconds_since(before));
    if (result == CUDA_ERROR_OUT_OF_MEMORY) {
      ++denials;
      if (options.race) break;
      continue;
    }
    if (result != CUDA_SUCCESS) {
      count_error(result, allocator.last_call());
      if (options.race) break;
      continue;
    }
    ++successes;
    held_bytes += allocation.bytes;
    peak_bytes = std::max(peak_bytes, held_bytes);
    if (options.free_each) {
      if (hold.count() > 0) {
        const auto hold_start = Clock::now();
        sleep_until(hold_start + hold);
        holding += Clock::now() - hold_start;
      }
      release(allocation);
    } else {
      held.push_back(allocation);
    }
  }
  const double alloc_seconds =
      std::chrono::duration<double>(Clock::now() - start - holding).count();
  if (!options.free_each && hold.count() > 0) sleep_until(Clock::now() + hold);
  for (auto& allocation : held) release(allocation);

  report["family"] = family_name(options.family);
  report["bytes"] = options.bytes;
  report["count"] = options.count ? nlohmann::json(*options.count) : nlohmann::json(nullptr);
  report["race"] = options.race;
  report["free_each"] = options.free_each;
  report["hold_ms"] = options.hold_ms;
  report["attempts"] = alloc_ns.size();
  report["successes"] = successes;
  report["oom"] = denials;
  report["errors"] = errors;
  report["error_count"] = [&] {
    std::uint64_t total = 0;
    for (const auto& [name, n] : errors) total += n;
    return total;
  }();
  if (!first_error.is_null()) report["first_error"] = first_error;
  report["peak_bytes_held"] = peak_bytes;
  report["alloc_seconds"] = alloc_seconds;
  report["allocs_per_s"] = alloc_seconds > 0 ? static_cast<double>(successes) / alloc_seconds : 0.0;
  report["alloc_ns_mean"] = mean(alloc_ns);
  report["free_ns_mean"] = mean(free_ns);
  report["alloc_free_ns"] = mean(alloc_ns) + mean(free_ns);
  return errors.empty();
}

}  // namespace quanta::tenant
