// simgpu's single-process tests: configuration parsing and its errors, every
// cuGetProcAddress lookup path, kernel timing, copies, events, graphs and libraries.
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "tests/simgpu/config.h"
#include "tests/simgpu/tests/child_process.h"
#include "tests/simgpu/tests/spin.h"

using namespace quanta::simgpu;
using namespace quanta::simgpu::test;

namespace {

std::map<std::string, std::string> g_fake_env;
const char* fake_env(const char* name) {
  auto it = g_fake_env.find(name);
  return it == g_fake_env.end() ? nullptr : it->second.c_str();
}

bool parse(std::map<std::string, std::string> env, Config& cfg, std::string& error) {
  g_fake_env = std::move(env);
  return parse_config(fake_env, cfg, error);
}

std::string symbol_name(void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_sname == nullptr) return "";
  return info.dli_sname;
}

struct Lookup {
  CUresult rc;
  CUdriverProcAddressQueryResult status;
  std::string symbol;
};

Lookup lookup(const char* name, int version, cuuint64_t flags) {
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult rc = cuGetProcAddress_v2(name, &fn, version, flags, &status);
  return {rc, status, symbol_name(fn)};
}

}  // namespace

TEST(SimgpuConfig, DefaultsDescribeOneH100Of80GiB) {
  Config cfg;
  std::string error;
  ASSERT_TRUE(parse({}, cfg, error)) << error;
  ASSERT_EQ(cfg.devices.size(), 1u);
  EXPECT_EQ(cfg.devices[0].memory_bytes, 80ULL << 30);
  EXPECT_EQ(cfg.devices[0].name, "simgpu H100");
  EXPECT_EQ(cfg.devices[0].uuid_text.rfind("GPU-", 0), 0u);
  EXPECT_EQ(cfg.timeslice_ns, 1'000'000u);
  EXPECT_EQ(cfg.switch_ns, 50'000u);
  EXPECT_EQ(cfg.context_bytes, 0u);
  EXPECT_EQ(cfg.state_name, "simgpu-" + std::to_string(getuid()));
}

TEST(SimgpuConfig, MigSplitsADeviceIntoInstancesWithTheirOwnUuidAndMemoryShare) {
  Config cfg;
  std::string error;
  ASSERT_TRUE(
      parse({{"SIMGPU_DEVICES", "2"}, {"SIMGPU_MEMORY", "3Gi"}, {"SIMGPU_MIG", "0:3"}}, cfg, error))
      << error;
  ASSERT_EQ(cfg.devices.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cfg.devices[i].uuid_text.rfind("MIG-", 0), 0u);
    EXPECT_EQ(cfg.devices[i].memory_bytes, 1ULL << 30);
    EXPECT_EQ(cfg.devices[i].mig_instance, i);
  }
  EXPECT_NE(cfg.devices[0].uuid_text, cfg.devices[1].uuid_text);
  EXPECT_EQ(cfg.devices[3].uuid_text.rfind("GPU-", 0), 0u);
  EXPECT_EQ(cfg.devices[3].memory_bytes, 3ULL << 30);
}

TEST(SimgpuConfig, ContextMemoryIsWhatTheDriverTakesPerContext) {
  Config cfg;
  std::string error;
  ASSERT_TRUE(parse({{"SIMGPU_CONTEXT_MEMORY", "518Mi"}}, cfg, error)) << error;
  EXPECT_EQ(cfg.context_bytes, 518ull << 20);
  ASSERT_TRUE(parse({{"SIMGPU_CONTEXT_MEMORY", "0"}}, cfg, error)) << error;
  EXPECT_EQ(cfg.context_bytes, 0u);
}

TEST(SimgpuConfig, ByteSizesAcceptDecimalAndBinarySuffixes) {
  uint64_t b = 0;
  EXPECT_TRUE(parse_byte_size("1048576", b));
  EXPECT_EQ(b, 1048576u);
  EXPECT_TRUE(parse_byte_size("2K", b));
  EXPECT_EQ(b, 2000u);
  EXPECT_TRUE(parse_byte_size("3Mi", b));
  EXPECT_EQ(b, 3u << 20);
  EXPECT_TRUE(parse_byte_size("80Gi", b));
  EXPECT_EQ(b, 80ULL << 30);
  EXPECT_FALSE(parse_byte_size("12X", b));
  EXPECT_FALSE(parse_byte_size("Gi", b));
  EXPECT_FALSE(parse_byte_size("-1", b));
}

TEST(SimgpuConfig, UuidsFromTheEnvironmentAreUsedVerbatim) {
  Config cfg;
  std::string error;
  const std::string uuid = "GPU-12345678-9abc-def0-1234-56789abcdef0";
  ASSERT_TRUE(parse({{"SIMGPU_UUIDS", uuid}}, cfg, error)) << error;
  EXPECT_EQ(cfg.devices[0].uuid_text, uuid);
  EXPECT_EQ(cfg.devices[0].uuid[0], 0x12);
}

TEST(SimgpuConfig, EveryBadValueIsRejectedWithTheVariableTheValueAndWhatIsAllowed) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"SIMGPU_DEVICES", "0"},        {"SIMGPU_DEVICES", "two"},  {"SIMGPU_MEMORY", "12X"},
      {"SIMGPU_MEMORY", "1K"},        {"SIMGPU_NAME", ""},        {"SIMGPU_UUIDS", "GPU-123"},
      {"SIMGPU_MIG", "1:2"},          {"SIMGPU_MIG", "0:9"},      {"SIMGPU_TIMESLICE_US", "0"},
      {"SIMGPU_TIMESLICE_US", "1ms"}, {"SIMGPU_SWITCH_US", "-5"}, {"SIMGPU_STATE", "a/b"},
      {"SIMGPU_CONTEXT_MEMORY", "518X"}, {"SIMGPU_CONTEXT_MEMORY", "65Gi"},
  };
  for (const auto& [var, value] : bad) {
    Config cfg;
    std::string error;
    EXPECT_FALSE(parse({{var, value}}, cfg, error)) << var << "=" << value;
    EXPECT_NE(error.find(var + "='" + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find("expected"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

TEST(SimgpuConfig, BadEnvironmentMakesCuInitFailWithOneClearLine) {
  UniqueState state("badenv");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "12X"}}, [] {
    CHILD_CHECK(cuInit(0) == CUDA_ERROR_INVALID_VALUE);
    int count = -1;
    CHILD_CHECK(cuDeviceGetCount(&count) == CUDA_ERROR_NOT_INITIALIZED);
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("SIMGPU_MEMORY='12X' is invalid: expected"), std::string::npos)
      << r.stderr_text;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
}

TEST(SimgpuProcAddress, NameMapsToTheVersionedExportByCudaVersion) {
  EXPECT_EQ(lookup("cuMemAlloc", 2000, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuMemAlloc");
  EXPECT_EQ(lookup("cuMemAlloc", 3020, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuMemAlloc_v2");
  EXPECT_EQ(lookup("cuMemAlloc", 13000, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuMemAlloc_v2");
  EXPECT_EQ(lookup("cuCtxCreate", 2000, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuCtxCreate");
  EXPECT_EQ(lookup("cuCtxCreate", 3020, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuCtxCreate_v2");
  EXPECT_EQ(lookup("cuCtxCreate", 11040, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuCtxCreate_v3");
  EXPECT_EQ(lookup("cuCtxCreate", 12050, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuCtxCreate_v4");
  EXPECT_EQ(lookup("cuCtxCreate", 13000, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuCtxCreate_v4");
  EXPECT_EQ(lookup("cuGetProcAddress", 11030, CU_GET_PROC_ADDRESS_DEFAULT).symbol,
            "cuGetProcAddress");
  EXPECT_EQ(lookup("cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_DEFAULT).symbol,
            "cuGetProcAddress_v2");
  EXPECT_EQ(lookup("cuGraphInstantiate", 12000, CU_GET_PROC_ADDRESS_DEFAULT).symbol,
            "cuGraphInstantiateWithFlags");
}

TEST(SimgpuProcAddress, PerThreadFlagSelectsThePtszOrPtdsVariantWhenOneExists) {
  const auto pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  const auto legacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  EXPECT_EQ(lookup("cuLaunchKernel", 12000, pt).symbol, "cuLaunchKernel_ptsz");
  EXPECT_EQ(lookup("cuLaunchKernel", 12000, legacy).symbol, "cuLaunchKernel");
  EXPECT_EQ(lookup("cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_DEFAULT).symbol, "cuLaunchKernel");
  EXPECT_EQ(lookup("cuMemcpyHtoD", 12000, pt).symbol, "cuMemcpyHtoD_v2_ptds");
  EXPECT_EQ(lookup("cuMemcpyHtoD", 12000, legacy).symbol, "cuMemcpyHtoD_v2");
  EXPECT_EQ(lookup("cuMemcpyHtoD", 3020, pt).symbol, "cuMemcpyHtoD_v2");  // per-thread came in 7.0
  EXPECT_EQ(lookup("cuStreamSynchronize", 12000, pt).symbol, "cuStreamSynchronize_ptsz");
  EXPECT_EQ(lookup("cuMemAlloc", 12000, pt).symbol, "cuMemAlloc_v2");  // no stream: no variant
}

TEST(SimgpuProcAddress, UnknownNameAndTooOldVersionReportTheirStatus) {
  Lookup missing = lookup("cuNoSuchFunction", 13000, CU_GET_PROC_ADDRESS_DEFAULT);
  EXPECT_EQ(missing.rc, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(missing.status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(missing.symbol, "");
  Lookup old = lookup("cuMemAllocAsync", 11000, CU_GET_PROC_ADDRESS_DEFAULT);
  EXPECT_EQ(old.rc, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(old.status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  Lookup ok = lookup("cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_DEFAULT);
  EXPECT_EQ(ok.rc, CUDA_SUCCESS);
  EXPECT_EQ(ok.status, CU_GET_PROC_ADDRESS_SUCCESS);
  void* fn = nullptr;
  EXPECT_EQ(cuGetProcAddress_v2("cuInit", &fn, 13000, 4, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST(SimgpuProcAddress, LegacyEntryPointAndReturnedPointersAreTheExportsThemselves) {
  using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  void* v1 = dlsym(RTLD_DEFAULT, "cuGetProcAddress");
  ASSERT_NE(v1, nullptr);
  void* fn = nullptr;
  ASSERT_EQ(reinterpret_cast<GetProcAddressV1>(v1)("cuDriverGetVersion", &fn, 12000, 0),
            CUDA_SUCCESS);
  EXPECT_EQ(fn, dlsym(RTLD_DEFAULT, "cuDriverGetVersion"));
  int version = 0;
  ASSERT_EQ(reinterpret_cast<CUresult (*)(int*)>(fn)(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
  ASSERT_EQ(cuGetProcAddress_v2("cuMemcpyDtoHAsync", &fn, 12000,
                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(fn, dlsym(RTLD_DEFAULT, "cuMemcpyDtoHAsync_v2_ptsz"));
}

TEST(SimgpuProcAddress, EveryTableEntryIsTheExportItNames) {
  struct Row {
    const char* name;
    int version;
    const char* symbol;
    bool per_thread;
  };
#define SIMGPU_PROC(name, version, symbol, kind) \
  {#name, version, #symbol, std::string(#kind) == "PER_THREAD"},
  const Row rows[] = {
#include "tests/simgpu/proc_table.def"
  };
#undef SIMGPU_PROC
  ASSERT_GT(std::size(rows), 600u);
  for (const Row& row : rows) {
    void* exported = dlsym(RTLD_DEFAULT, row.symbol);
    ASSERT_NE(exported, nullptr) << row.symbol;
    EXPECT_EQ(symbol_name(exported), row.symbol);
    // Asking for exactly the version that introduced the row gives that row back.
    void* fn = nullptr;
    const cuuint64_t flags = row.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                            : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    ASSERT_EQ(cuGetProcAddress_v2(row.name, &fn, row.version, flags, nullptr), CUDA_SUCCESS)
        << row.name;
    if (fn != exported) {
      // Only a row superseded at the same version (a per-thread twin of a newer plain
      // export) may differ; then the lookup must still name a variant of `name`.
      EXPECT_EQ(symbol_name(fn).rfind(row.name, 0), 0u) << row.name << " @" << row.version;
    }
  }
}

TEST(SimgpuUnsupported, CallsSimgpuDoesNotModelReturnNotSupported) {
  // Exported (the real driver has it) but not modelled: a clean error, never a crash.
  auto fn = reinterpret_cast<CUresult (*)(CUgraphicsResource)>(
      dlsym(RTLD_DEFAULT, "cuGraphicsUnregisterResource"));
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn(nullptr), CUDA_ERROR_NOT_SUPPORTED);
  const void* table = reinterpret_cast<const void*>(1);
  CUuuid id{};
  EXPECT_EQ(cuGetExportTable(&table, &id), CUDA_ERROR_NOT_SUPPORTED);
}

TEST(SimgpuTiming, SpinKernelsOf1msOrMoreTakeTheirDurationWithin5Percent) {
  // Device time (events around the kernel) is exact whatever the host does; the wall clock
  // from launch to sync return may only run late on a loaded machine (a late wake-up delays
  // the completion notice), never early. Both are checked; the wall-clock overrun is only
  // reported, with a bound that catches a hung wait.
  UniqueState state("timing");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}}, [] {
    CUdevice dev;
    CUcontext ctx;
    CUfunction spin;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuDeviceGet(&dev, 0));
    CHILD_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHILD_CU(cuCtxSetCurrent(ctx));
    CHILD_CU(load_spin(&spin));
    CUstream stream;
    CHILD_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent start, stop;
    CHILD_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHILD_CU(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    for (unsigned long long ms : {1ULL, 2ULL, 5ULL, 10ULL, 1ULL, 3ULL}) {
      const unsigned long long ns = ms * 1'000'000ULL;
      // A lead kernel ahead of the start event: the measured one then starts on the device
      // where the lead ended, however late the host submits it within those 20 ms.
      constexpr unsigned long long kLeadNs = 20'000'000;
      const uint64_t t0 = now_ns();
      CHILD_CU(launch_spin(spin, kLeadNs, stream));
      CHILD_CU(cuEventRecord(start, stream));
      CHILD_CU(launch_spin(spin, ns, stream));
      CHILD_CU(cuEventRecord(stop, stream));
      CHILD_CU(cuStreamSynchronize(stream));
      const uint64_t took = now_ns() - t0;
      float device_ms = 0;
      CHILD_CU(cuEventElapsedTime(&device_ms, start, stop));
      const double device_error = std::fabs(device_ms * 1e6 - static_cast<double>(ns)) / ns;
      std::fprintf(
          stderr,
          "kernel %llu ms: device %.3f ms (error %.2f%%), lead + kernel launch to sync %.3f ms\n",
          ms, device_ms, device_error * 100, took / 1e6);
      CHILD_CHECK(device_error <= 0.05);
      CHILD_CHECK(took >= (kLeadNs + ns) * 95 / 100);  // never done before its time
      CHILD_CHECK(took < ns + 2'000'000'000);          // a wait that overran by seconds is hung
    }
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  std::printf("%s", r.stderr_text.c_str());  // the measured durations, for the record
}

TEST(SimgpuMemory, CopiesSetsAndMappingsRoundTripDataAndAreAccounted) {
  UniqueState state("memory");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}}, [] {
    CUcontext ctx;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
    size_t free0 = 0, total = 0;
    CHILD_CU(cuMemGetInfo(&free0, &total));
    CHILD_CHECK(total == (1ULL << 30) && free0 == total);

    CUdeviceptr a, b;
    CHILD_CU(cuMemAlloc(&a, 1 << 20));
    CHILD_CU(cuMemAlloc(&b, 1 << 20));
    std::vector<uint32_t> host(1 << 18), back(1 << 18);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint32_t>(i * 2654435761u);
    CHILD_CU(cuMemcpyHtoD(a, host.data(), 1 << 20));
    CHILD_CU(cuMemcpyDtoD(b, a, 1 << 20));
    CHILD_CU(cuMemcpyDtoH(back.data(), b, 1 << 20));
    CHILD_CHECK(back == host);
    CHILD_CU(cuMemsetD32(b, 0xdeadbeef, 1 << 18));
    CHILD_CU(cuMemsetD8Async(b, 7, 4, nullptr));
    CHILD_CU(cuMemcpyDtoHAsync(back.data(), b, 8, nullptr));
    CHILD_CU(cuCtxSynchronize());
    CHILD_CHECK(back[0] == 0x07070707u && back[1] == 0xdeadbeefu);
    CHILD_CHECK(cuMemcpyHtoD(a + (1 << 20) - 4, host.data(), 8) == CUDA_ERROR_INVALID_VALUE);

    size_t free1 = 0;
    CHILD_CU(cuMemGetInfo(&free1, &total));
    CHILD_CHECK(free0 - free1 == 2u << 20);
    unsigned memtype = 0;
    CHILD_CU(cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 100));
    CHILD_CHECK(memtype == CU_MEMORYTYPE_DEVICE);

    // VMM: physical memory is charged at creation and visible once mapped.
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CHILD_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle handle;
    CHILD_CU(cuMemCreate(&handle, 2 * gran, &prop, 0));
    CUdeviceptr va;
    CHILD_CU(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
    CHILD_CU(cuMemMap(va, 2 * gran, 0, handle, 0));
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHILD_CU(cuMemSetAccess(va, 2 * gran, &access, 1));
    CHILD_CU(cuMemcpyHtoD(va + gran, host.data(), 64));
    CHILD_CU(cuMemcpyDtoH(back.data(), va + gran, 64));
    CHILD_CHECK(std::memcmp(back.data(), host.data(), 64) == 0);
    size_t free2 = 0;
    CHILD_CU(cuMemGetInfo(&free2, &total));
    CHILD_CHECK(free1 - free2 == 2 * gran);
    CHILD_CU(cuMemUnmap(va, 2 * gran));
    CHILD_CU(cuMemRelease(handle));
    CHILD_CU(cuMemAddressFree(va, 2 * gran));

    // Pitch, managed, async, pool and array allocations all count.
    CUdeviceptr p, m, s;
    size_t pitch = 0;
    CHILD_CU(cuMemAllocPitch(&p, &pitch, 1000, 10, 4));
    CHILD_CHECK(pitch >= 1000);
    CHILD_CU(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    CHILD_CU(cuMemAllocAsync(&s, 4096, nullptr));
    CUmemoryPool pool;
    CHILD_CU(cuDeviceGetDefaultMemPool(&pool, 0));
    CUdeviceptr q;
    CHILD_CU(cuMemAllocFromPoolAsync(&q, 4096, pool, nullptr));
    CUarray arr;
    CUDA_ARRAY_DESCRIPTOR desc{};
    desc.Width = 256;
    desc.Height = 256;
    desc.Format = CU_AD_FORMAT_FLOAT;
    desc.NumChannels = 1;
    CHILD_CU(cuArrayCreate(&arr, &desc));
    size_t free3 = 0;
    CHILD_CU(cuMemGetInfo(&free3, &total));
    CHILD_CHECK(free1 - free3 == pitch * 10 + 4096 * 3 + 256 * 256 * 4);
    CHILD_CU(cuArrayDestroy(arr));
    CHILD_CU(cuMemFreeAsync(s, nullptr));
    CHILD_CU(cuMemFreeAsync(q, nullptr));
    CHILD_CU(cuMemFree(p));
    CHILD_CU(cuMemFree(m));
    CHILD_CU(cuMemFree(a));
    CHILD_CU(cuMemFree(b));
    // The default pool (release threshold 0) gives its cached memory back at a sync.
    CHILD_CU(cuCtxSynchronize());
    CHILD_CU(cuMemGetInfo(&free1, &total));
    CHILD_CHECK(free1 == free0);
    CHILD_CHECK(cuMemAlloc(&a, 2ULL << 30) == CUDA_ERROR_OUT_OF_MEMORY);
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

namespace {

// Device memory in use, as cuMemGetInfo reports it.
size_t device_used() {
  size_t free = 0, total = 0;
  if (cuMemGetInfo(&free, &total) != CUDA_SUCCESS) return SIZE_MAX;
  return total - free;
}

cuuint64_t pool_attribute(CUmemoryPool pool, CUmemPool_attribute attribute) {
  cuuint64_t value = ~0ull;
  if (cuMemPoolGetAttribute(pool, attribute, &value) != CUDA_SUCCESS) return ~0ull;
  return value;
}

constexpr size_t kMiB = 1 << 20;

}  // namespace

// cuMemRelease: "the memory allocation will be freed when all outstanding mappings to the
// memory are unmapped" (CUDA driver API reference).
TEST(SimgpuMemory, ReleasedVmmHandleKeepsItsMemoryUntilItsLastMappingIsUnmapped) {
  UniqueState state("vmm-release");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}}, [] {
    CUcontext ctx;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
    const size_t base = device_used();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CHILD_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle handle;
    CHILD_CU(cuMemCreate(&handle, 4 * gran, &prop, 0));
    CUdeviceptr first, second;
    CHILD_CU(cuMemAddressReserve(&first, 4 * gran, 0, 0, 0));
    CHILD_CU(cuMemAddressReserve(&second, 4 * gran, 0, 0, 0));
    CHILD_CU(cuMemMap(first, 4 * gran, 0, handle, 0));
    CHILD_CU(cuMemMap(second, 4 * gran, 0, handle, 0));
    CHILD_CU(cuMemRelease(handle));
    CHILD_CHECK(device_used() - base == 4 * gran);  // released, still mapped twice
    CHILD_CHECK(cuMemMap(first, gran, 0, handle, 0) == CUDA_ERROR_INVALID_VALUE);
    const uint32_t word = 0x5eed;
    CHILD_CU(cuMemcpyHtoD(second, &word, sizeof word));  // the mapping still works
    CHILD_CU(cuMemUnmap(first, 4 * gran));
    CHILD_CHECK(device_used() - base == 4 * gran);  // one mapping left
    CHILD_CU(cuMemUnmap(second, 4 * gran));
    CHILD_CHECK(device_used() == base);  // the last unmap freed it
    // Unmapped first, released last: freed by the release.
    CHILD_CU(cuMemCreate(&handle, 2 * gran, &prop, 0));
    CHILD_CU(cuMemMap(first, 2 * gran, 0, handle, 0));
    CHILD_CU(cuMemUnmap(first, 2 * gran));
    CHILD_CHECK(device_used() - base == 2 * gran);
    CHILD_CU(cuMemRelease(handle));
    CHILD_CHECK(device_used() == base);
    CHILD_CU(cuMemAddressFree(first, 4 * gran));
    CHILD_CU(cuMemAddressFree(second, 4 * gran));
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

// CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: "when more than the release threshold bytes of memory
// are held by the memory pool, the allocator will try to release memory back to the OS on
// the next call to stream, event or context synchronize" (default 0); cuMemPoolTrimTo gives
// back what is above its argument.
TEST(SimgpuMemory, PoolKeepsFreedMemoryUpToItsReleaseThresholdUntilASynchronisation) {
  UniqueState state("pool-threshold");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}}, [] {
    CUcontext ctx;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
    CUstream stream;
    CHILD_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    const size_t base = device_used();

    // The default pool (threshold 0): held after the free, given back at the next sync.
    CUdeviceptr p;
    CHILD_CU(cuMemAllocAsync(&p, 8 * kMiB, stream));
    CHILD_CU(cuMemFreeAsync(p, stream));
    CHILD_CHECK(device_used() - base == 8 * kMiB);
    CUmemoryPool default_pool;
    CHILD_CU(cuDeviceGetMemPool(&default_pool, 0));
    CHILD_CHECK(pool_attribute(default_pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 8 * kMiB);
    CHILD_CHECK(pool_attribute(default_pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    CHILD_CU(cuStreamSynchronize(stream));
    CHILD_CHECK(device_used() == base);

    // A pool with the threshold at its maximum keeps everything through syncs, and reuses
    // it: a second allocation of the same size takes no new memory.
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool;
    CHILD_CU(cuMemPoolCreate(&pool, &props));
    cuuint64_t threshold = UINT64_MAX;
    CHILD_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CHILD_CU(cuMemAllocFromPoolAsync(&p, 16 * kMiB, pool, stream));
    CHILD_CU(cuMemFreeAsync(p, stream));
    CHILD_CU(cuStreamSynchronize(stream));
    CHILD_CU(cuCtxSynchronize());
    CHILD_CHECK(device_used() - base == 16 * kMiB);
    CHILD_CU(cuMemAllocFromPoolAsync(&p, 16 * kMiB, pool, stream));
    CHILD_CHECK(device_used() - base == 16 * kMiB);
    CHILD_CHECK(pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 16 * kMiB);
    CHILD_CU(cuMemFreeAsync(p, stream));
    CHILD_CU(cuMemPoolTrimTo(pool, 4 * kMiB));
    CHILD_CHECK(device_used() - base == 4 * kMiB);
    CHILD_CU(cuMemPoolTrimTo(pool, 0));
    CHILD_CHECK(device_used() == base);

    // A finite threshold: a sync trims down to it, not below.
    threshold = 4 * kMiB;
    CHILD_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CHILD_CU(cuMemAllocFromPoolAsync(&p, 12 * kMiB, pool, stream));
    CHILD_CU(cuMemFreeAsync(p, stream));
    CUevent event;
    CHILD_CU(cuEventCreate(&event, 0));
    CHILD_CU(cuEventRecord(event, stream));
    CHILD_CU(cuEventSynchronize(event));
    CHILD_CHECK(device_used() - base == 4 * kMiB);

    // Destroying a pool gives back its cache now and a live allocation at its free.
    CHILD_CU(cuMemAllocFromPoolAsync(&p, 2 * kMiB, pool, stream));
    CHILD_CU(cuMemPoolDestroy(pool));
    CHILD_CHECK(device_used() - base == 2 * kMiB);
    CHILD_CU(cuMemFreeAsync(p, stream));
    CHILD_CHECK(device_used() == base);
    CHILD_CU(cuEventDestroy(event));
    CHILD_CU(cuStreamDestroy(stream));
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

// cuMemFreeAsync during stream capture "results in the creation of a free node": nothing is
// freed until the graph is launched.
TEST(SimgpuGraph, FreeEnqueuedDuringCaptureFreesNothingUntilTheGraphRuns) {
  UniqueState state("capture-free");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}, {"SIMGPU_MEMORY", "1Gi"}}, [] {
    CUcontext ctx;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
    CUstream stream;
    CHILD_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    const size_t base = device_used();

    // A graph allocation: captured cuMemAllocAsync, made when the first graph is built.
    CHILD_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CHILD_CU(cuStreamIsCapturing(stream, &status));
    CHILD_CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHILD_CHECK(cuStreamSynchronize(stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUdeviceptr p;
    CHILD_CU(cuMemAllocAsync(&p, 8 * kMiB, stream));
    CUgraph make;
    CHILD_CU(cuStreamEndCapture(stream, &make));
    CHILD_CU(cuStreamIsCapturing(stream, &status));
    CHILD_CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE);
    CUgraphExec make_exec;
    CHILD_CU(cuGraphInstantiateWithFlags(&make_exec, make, 0));
    CHILD_CU(cuGraphLaunch(make_exec, stream));
    CHILD_CU(cuStreamSynchronize(stream));
    CHILD_CHECK(device_used() - base == 8 * kMiB);

    // Its free, captured into a second graph: nothing freed at capture or instantiation.
    CHILD_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHILD_CU(cuMemFreeAsync(p, stream));
    CUgraph release;
    CHILD_CU(cuStreamEndCapture(stream, &release));
    CUgraphExec release_exec;
    CHILD_CU(cuGraphInstantiateWithFlags(&release_exec, release, 0));
    CHILD_CU(cuCtxSynchronize());
    CHILD_CHECK(device_used() - base == 8 * kMiB);
    CHILD_CU(cuGraphLaunch(release_exec, stream));
    CHILD_CU(cuStreamSynchronize(stream));
    CHILD_CHECK(device_used() == base);

    CHILD_CU(cuGraphExecDestroy(release_exec));
    CHILD_CU(cuGraphExecDestroy(make_exec));
    CHILD_CU(cuGraphDestroy(release));
    CHILD_CU(cuGraphDestroy(make));
    CHILD_CU(cuStreamDestroy(stream));
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

TEST(SimgpuEvents, ElapsedTimeBetweenEventsIsTheKernelsDeviceTime) {
  UniqueState state("events");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}}, [] {
    CUcontext ctx;
    CUfunction spin;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
    CHILD_CU(load_spin(&spin));
    CUevent start, stop;
    CHILD_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHILD_CU(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    CUstream stream;
    CHILD_CU(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, -1));
    CHILD_CU(launch_spin(spin, 2'000'000, stream));
    CHILD_CU(cuEventRecord(start, stream));
    CHILD_CU(launch_spin(spin, 3'000'000, stream));
    CHILD_CU(cuEventRecord(stop, stream));
    CHILD_CHECK(cuEventQuery(stop) == CUDA_ERROR_NOT_READY);
    CHILD_CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);
    float ms = 0;
    CHILD_CHECK(cuEventElapsedTime(&ms, start, stop) == CUDA_ERROR_NOT_READY);
    CHILD_CU(cuEventSynchronize(stop));
    CHILD_CU(cuEventQuery(stop));
    CHILD_CU(cuStreamQuery(stream));
    CHILD_CU(cuEventElapsedTime(&ms, start, stop));
    std::fprintf(stderr, "elapsed %.4f ms\n", ms);
    CHILD_CHECK(std::fabs(ms - 3.0f) < 0.001f);  // device time: exact, whatever the host did
    CHILD_CU(cuEventDestroy(start));
    CHILD_CU(cuEventDestroy(stop));
    CHILD_CU(cuStreamDestroy(stream));
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

TEST(SimgpuGraph, LaunchedGraphRunsItsKernelNodes) {
  UniqueState state("graph");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}}, [] {
    CUcontext ctx;
    CUfunction spin;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuCtxCreate(&ctx, nullptr, 0, 0));
    CHILD_CU(load_spin(&spin));
    CUgraph graph;
    CHILD_CU(cuGraphCreate(&graph, 0));
    unsigned long long ns = 2'000'000;
    void* params[] = {&ns};
    CUDA_KERNEL_NODE_PARAMS kp{};
    kp.func = spin;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = params;
    CUgraphNode a, b, alloc, release;
    CHILD_CU(cuGraphAddKernelNode(&a, graph, nullptr, 0, &kp));
    CHILD_CU(cuGraphAddKernelNode(&b, graph, &a, 1, &kp));
    CUDA_MEM_ALLOC_NODE_PARAMS ap{};
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.bytesize = 1 << 20;
    CHILD_CU(cuGraphAddMemAllocNode(&alloc, graph, &b, 1, &ap));
    CHILD_CHECK(ap.dptr != 0);
    CHILD_CU(cuGraphAddMemFreeNode(&release, graph, &alloc, 1, ap.dptr));
    CUgraphExec exec;
    CHILD_CU(cuGraphInstantiate(&exec, graph, 0));
    CUevent start, stop;
    CHILD_CU(cuEventCreate(&start, 0));
    CHILD_CU(cuEventCreate(&stop, 0));
    // A kernel ahead of the start event pins it to device time, so the elapsed time below
    // is the graph's alone.
    CHILD_CU(launch_spin(spin, 20'000'000));
    CHILD_CU(cuEventRecord(start, nullptr));
    CHILD_CU(cuGraphLaunch(exec, nullptr));
    CHILD_CU(cuEventRecord(stop, nullptr));
    CHILD_CU(cuCtxSynchronize());
    float ms = 0;
    CHILD_CU(cuEventElapsedTime(&ms, start, stop));
    CHILD_CHECK(std::fabs(ms - 4.0f) < 0.001f);
    CHILD_CU(cuGraphExecDestroy(exec));
    CHILD_CU(cuGraphDestroy(graph));
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

TEST(SimgpuLaunch, LibraryKernelsLaunchDirectlyAndThroughTheirFunction) {
  UniqueState state("library");
  ChildResult r = run_child({{"SIMGPU_STATE", state.name()}}, [] {
    CUcontext ctx;
    CHILD_CU(cuInit(0));
    CHILD_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHILD_CU(cuCtxPushCurrent(ctx));
    CUlibrary lib;
    CHILD_CU(cuLibraryLoadData(&lib, "image", nullptr, nullptr, 0, nullptr, nullptr, 0));
    CUkernel kernel;
    CHILD_CU(cuLibraryGetKernel(&kernel, lib, "quanta_spin_library"));
    CUfunction fn;
    CHILD_CU(cuKernelGetFunction(&fn, kernel));
    CUevent start, stop;
    CHILD_CU(cuEventCreate(&start, 0));
    CHILD_CU(cuEventCreate(&stop, 0));
    CHILD_CU(cuEventRecord(start, nullptr));
    CHILD_CU(launch_spin(reinterpret_cast<CUfunction>(kernel), 1'000'000));
    CHILD_CU(launch_spin(fn, 1'000'000));
    unsigned long long ns = 1'000'000;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &ns, CU_LAUNCH_PARAM_BUFFER_SIZE, nullptr,
                     CU_LAUNCH_PARAM_END};
    CUlaunchConfig cfg{};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    CHILD_CU(cuLaunchKernelEx(&cfg, fn, nullptr, extra));
    void* params[] = {&ns};
    CHILD_CU(cuLaunchCooperativeKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, params));
    CHILD_CU(cuEventRecord(stop, nullptr));
    CHILD_CU(cuCtxSynchronize());
    float ms = 0;
    CHILD_CU(cuEventElapsedTime(&ms, start, stop));
    // Four 1 ms spin kernels of device time, plus whatever host gaps separated the launches.
    CHILD_CHECK(ms >= 3.999f && ms < 8.0f);
    CUmodule mod;
    CHILD_CU(cuLibraryGetModule(&mod, lib));
    CUfunction other;
    CHILD_CU(cuModuleGetFunction(&other, mod, "ordinary_kernel"));
    CHILD_CU(cuLaunchKernel(other, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
    CHILD_CU(cuCtxSynchronize());
    CHILD_CU(cuLibraryUnload(lib));
    CUcontext popped;
    CHILD_CU(cuCtxPopCurrent(&popped));
    CHILD_CHECK(popped == ctx);
    CHILD_CU(cuDevicePrimaryCtxRelease(0));
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

TEST(SimgpuDevice, AttributesDescribeAComputeCapability90DeviceWith132Sms) {
  UniqueState state("device");
  ChildResult r = run_child(
      {{"SIMGPU_STATE", state.name()}, {"SIMGPU_DEVICES", "2"}, {"SIMGPU_NAME", "Test GPU"}}, [] {
        CHILD_CU(cuInit(0));
        int count = 0, major = 0, minor = 0, sms = 0, version = 0;
        CHILD_CU(cuDriverGetVersion(&version));
        CHILD_CHECK(version == 13000);
        CHILD_CU(cuDeviceGetCount(&count));
        CHILD_CHECK(count == 2);
        CHILD_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1));
        CHILD_CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 1));
        CHILD_CU(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1));
        CHILD_CHECK(major == 9 && minor == 0 && sms == 132);
        char name[64];
        CHILD_CU(cuDeviceGetName(name, sizeof name, 0));
        CHILD_CHECK(std::string(name) == "Test GPU");
        CUuuid u0, u1;
        CHILD_CU(cuDeviceGetUuid(&u0, 0));
        CHILD_CU(cuDeviceGetUuid_v2(&u1, 1));
        CHILD_CHECK(std::memcmp(u0.bytes, u1.bytes, 16) != 0);
        size_t total = 0;
        CHILD_CU(cuDeviceTotalMem(&total, 1));
        CHILD_CHECK(total == 80ULL << 30);
        CHILD_CHECK(cuDeviceGet(&count, 2) == CUDA_ERROR_INVALID_DEVICE);
        const char* text = nullptr;
        CHILD_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &text));
        CHILD_CHECK(std::string(text) == "CUDA_ERROR_OUT_OF_MEMORY");
        unsigned flags = 0;
        int active = 1;
        CHILD_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
        CHILD_CHECK(active == 0);
        CUcontext c1, c2, cur;
        // The older cuCtxCreate versions, reached the way cudart does.
        void* v3 = nullptr;
        void* v2 = nullptr;
        CHILD_CU(cuGetProcAddress("cuCtxCreate", &v3, 11040, 0, nullptr));
        CHILD_CU(cuGetProcAddress("cuCtxCreate", &v2, 3020, 0, nullptr));
        using CtxCreateV3 = CUresult (*)(CUcontext*, CUexecAffinityParam*, int, unsigned, CUdevice);
        using CtxCreateV2 = CUresult (*)(CUcontext*, unsigned, CUdevice);
        CHILD_CU(reinterpret_cast<CtxCreateV3>(v3)(&c1, nullptr, 0, 0, 0));
        CHILD_CU(reinterpret_cast<CtxCreateV2>(v2)(&c2, 0, 1));
        CHILD_CU(cuCtxGetCurrent(&cur));
        CHILD_CHECK(cur == c2);
        CUdevice d;
        CHILD_CU(cuCtxGetDevice(&d));
        CHILD_CHECK(d == 1);
        unsigned api = 0;
        CHILD_CU(cuCtxGetApiVersion(c1, &api));
        CHILD_CU(cuCtxDestroy(c2));
        CHILD_CU(cuCtxGetCurrent(&cur));
        CHILD_CHECK(cur == c1);
        CHILD_CU(cuCtxDestroy(c1));
        return 0;
      });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

namespace {

const std::vector<std::string> kThreeUuids = {
    "GPU-51750000-0000-0000-0000-000000000000",
    "GPU-51751111-0000-0000-0000-000000000000",
    "MIG-abcd0000-0000-0000-0000-000000000000",
};

}  // namespace

TEST(SimgpuVisibleDevices, UnsetKeepsEveryDeviceAndIndexesReorder) {
  EXPECT_EQ(parse_visible_devices(nullptr, kThreeUuids), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(parse_visible_devices("1", kThreeUuids), (std::vector<int>{1}));
  EXPECT_EQ(parse_visible_devices("2,0", kThreeUuids), (std::vector<int>{2, 0}));
  EXPECT_EQ(parse_visible_devices(" 2 , 1 ", kThreeUuids), (std::vector<int>{2, 1}));
}

TEST(SimgpuVisibleDevices, UuidsAndUniquePrefixesSelectTheirDevice) {
  EXPECT_EQ(parse_visible_devices("GPU-51751111-0000-0000-0000-000000000000", kThreeUuids),
            (std::vector<int>{1}));
  EXPECT_EQ(parse_visible_devices("GPU-517511,gpu-51750", kThreeUuids), (std::vector<int>{1, 0}));
  EXPECT_EQ(parse_visible_devices("MIG-abcd,0", kThreeUuids), (std::vector<int>{2, 0}));
  // "GPU-5175" starts both GPUs' UUIDs: ambiguous, so it ends the list.
  EXPECT_EQ(parse_visible_devices("2,GPU-5175,0", kThreeUuids), (std::vector<int>{2}));
}

TEST(SimgpuVisibleDevices, ListEndsAtTheFirstInvalidOrRepeatedEntry) {
  EXPECT_EQ(parse_visible_devices("1,3,0", kThreeUuids), (std::vector<int>{1}));
  EXPECT_EQ(parse_visible_devices("1,1,0", kThreeUuids), (std::vector<int>{1}));
  EXPECT_EQ(parse_visible_devices("0,GPU-ffff,1", kThreeUuids), (std::vector<int>{0}));
  EXPECT_EQ(parse_visible_devices("0,,1", kThreeUuids), (std::vector<int>{0}));
  EXPECT_EQ(parse_visible_devices("1x", kThreeUuids), (std::vector<int>{}));
  EXPECT_EQ(parse_visible_devices("", kThreeUuids), (std::vector<int>{}));
  EXPECT_EQ(parse_visible_devices("-1", kThreeUuids), (std::vector<int>{}));
  EXPECT_EQ(parse_visible_devices("GPU-", kThreeUuids), (std::vector<int>{}));
}
