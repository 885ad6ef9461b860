// What the shim adds per call: cuLaunchKernel and a cuMemAlloc_v2 + cuMemFree_v2 pair
// through the shim's wrappers (the symbols the program links, with libquanta.so preloaded)
// next to the same driver with no shim at all: a second copy of libcuda.so.1 opened with
// dlmopen in a new link namespace, where LD_PRELOAD does not apply. Run on simgpu with
// LD_PRELOAD=libquanta.so LD_LIBRARY_PATH=build/sim.
#define __CUDA_API_VERSION_INTERNAL 1
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace {

// One driver's entry points and a context with a spin kernel on it.
struct Driver {
  decltype(&cuInit) init = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuCtxCreate_v2) ctx_create = nullptr;
  decltype(&cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&cuCtxSynchronize) synchronize = nullptr;
  decltype(&cuModuleLoadData) module_load = nullptr;
  decltype(&cuModuleGetFunction) get_function = nullptr;
  decltype(&cuLaunchKernel) launch = nullptr;
  decltype(&cuMemAlloc_v2) alloc = nullptr;
  decltype(&cuMemFree_v2) free = nullptr;
  CUcontext context = nullptr;
  CUfunction spin = nullptr;

  void set_up(const char* what) {
    CUdevice device;
    CUmodule module;
    if (!init || !launch || !alloc || !free || init(0) || device_get(&device, 0) ||
        ctx_create(&context, 0, device) || module_load(&module, "quanta") ||
        get_function(&spin, module, "quanta_spin")) {
      std::fprintf(stderr, "cannot set up a context through %s\n", what);
      std::exit(1);
    }
  }
};

template <typename Fn>
void find(void* library, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(library, name));
}

Driver& direct() {
  static Driver d = [] {
    Driver made;
    void* copy = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!copy) {
      std::fprintf(stderr, "dlmopen(libcuda.so.1): %s\n", dlerror());
      std::exit(1);
    }
    find(copy, "cuInit", &made.init);
    find(copy, "cuDeviceGet", &made.device_get);
    find(copy, "cuCtxCreate_v2", &made.ctx_create);
    find(copy, "cuCtxSetCurrent", &made.ctx_set_current);
    find(copy, "cuCtxGetCurrent", &made.ctx_get_current);
    find(copy, "cuCtxSynchronize", &made.synchronize);
    find(copy, "cuModuleLoadData", &made.module_load);
    find(copy, "cuModuleGetFunction", &made.get_function);
    find(copy, "cuLaunchKernel", &made.launch);
    find(copy, "cuMemAlloc_v2", &made.alloc);
    find(copy, "cuMemFree_v2", &made.free);
    made.set_up("the driver without the shim");
    return made;
  }();
  return d;
}

Driver& shimmed() {
  static Driver d = [] {
    Driver made{&cuInit,          &cuDeviceGet,      &cuCtxCreate_v2,   &cuCtxSetCurrent,
                &cuCtxGetCurrent, &cuCtxSynchronize, &cuModuleLoadData, &cuModuleGetFunction,
                &cuLaunchKernel,  &cuMemAlloc_v2,    &cuMemFree_v2};
    made.set_up("the shim");
    return made;
  }();
  return d;
}

// Zero-length spin kernels; a synchronize every 1024 launches keeps simgpu's queue short
// (the same for both).
void launch_loop(benchmark::State& state, Driver& d) {
  unsigned long long ns = 0;
  void* params[] = {&ns};
  unsigned count = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(d.launch(d.spin, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    if (++count % 1024 == 0) d.synchronize();
  }
  d.synchronize();
}

void alloc_free_loop(benchmark::State& state, Driver& d) {
  for (auto _ : state) {
    CUdeviceptr p = 0;
    benchmark::DoNotOptimize(d.alloc(&p, 1 << 20));
    d.free(p);
  }
}

void BM_LaunchDirect(benchmark::State& state) {
  launch_loop(state, direct());
}
void BM_LaunchThroughShim(benchmark::State& state) {
  launch_loop(state, shimmed());
}
void BM_AllocFreeDirect(benchmark::State& state) {
  alloc_free_loop(state, direct());
}
void BM_AllocFreeThroughShim(benchmark::State& state) {
  alloc_free_loop(state, shimmed());
}

// The one driver call the shim's launch path adds itself: finding the current context.
void BM_CtxGetCurrent(benchmark::State& state) {
  Driver& d = direct();
  for (auto _ : state) {
    CUcontext context;
    benchmark::DoNotOptimize(d.ctx_get_current(&context));
  }
}

BENCHMARK(BM_LaunchDirect);
BENCHMARK(BM_LaunchThroughShim);
BENCHMARK(BM_AllocFreeDirect);
BENCHMARK(BM_AllocFreeThroughShim);
BENCHMARK(BM_CtxGetCurrent);

}  // namespace

int main(int argc, char** argv) {
  direct();  // both set up before any timing
  shimmed();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
