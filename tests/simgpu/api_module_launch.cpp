// Driver entry points for modules, libraries, kernels and launches. simgpu never reads
// an image: any function name resolves, and a launch queues its duration as device work
// (`quanta_spin*` kernels take it from their first parameter, others last 5 us).
#include <cstring>

#include "tests/simgpu/launch.h"
#include "tests/simgpu/runtime.h"

using namespace quanta::simgpu;

namespace quanta::simgpu {

constexpr uint64_t kDefaultKernelNs = 5'000;

CUfunc_st* resolve_function(CUfunction f) {
  if (has_handle(f, HandleKind::Function)) return f;
  // cudart 12+ launches CUkernel handles through the CUfunction parameter.
  auto* k = reinterpret_cast<CUkern_st*>(f);
  if (has_handle(k, HandleKind::Kernel)) return k->function;
  return nullptr;
}

uint64_t kernel_duration_ns(const CUfunc_st* fn, void** kernelParams, void** extra) {
  if (!fn->spin) return kDefaultKernelNs;
  if (kernelParams != nullptr && kernelParams[0] != nullptr) {
    unsigned long long ns = 0;
    std::memcpy(&ns, kernelParams[0], sizeof ns);
    return ns;
  }
  for (int i = 0; extra != nullptr && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER && extra[i + 1] != nullptr) {
      unsigned long long ns = 0;
      std::memcpy(&ns, extra[i + 1], sizeof ns);
      return ns;
    }
  }
  return kDefaultKernelNs;
}

CUresult launch(CUfunction f, CUstream h, void** kernelParams, void** extra) {
  SIMGPU_REQUIRE_INIT();
  CUfunc_st* fn = resolve_function(f);
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUctx_st* ctx = nullptr;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ctx, s); r != CUDA_SUCCESS) return r;
  enqueue_work(ctx, s, kernel_duration_ns(fn, kernelParams, extra));
  return CUDA_SUCCESS;
}

}  // namespace quanta::simgpu

namespace {

CUmod_st* new_module(CUctx_st* ctx) {
  auto* m = new CUmod_st();
  m->ctx = ctx;
  add_handle(m, HandleKind::Module);
  return m;
}

CUresult load_module(CUmodule* module, const void* image) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *module = new_module(ctx);
  return CUDA_SUCCESS;
}

CUfunc_st* function_in(CUmod_st* m, const char* name) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto& slot = m->functions[name];
  if (!slot) {
    slot = std::make_unique<CUfunc_st>();
    slot->name = name;
    slot->spin = std::strncmp(name, "quanta_spin", 11) == 0;
    slot->module = m;
    rt.handles[slot.get()] = HandleKind::Function;
  }
  return slot.get();
}

void unload_module(CUmod_st* m) {
  for (auto& [name, fn] : m->functions) remove_handle(fn.get());
  for (auto& [name, g] : m->globals) free_device_memory(g.first);
  remove_handle(m);
  delete m;
}

CUresult module_global(CUmod_st* m, const char* name, CUdeviceptr* dptr, size_t* bytes) {
  constexpr size_t kGlobalBytes = 256;
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto it = m->globals.find(name);
  if (it == m->globals.end()) {
    CUdeviceptr p = 0;
    if (CUresult r = allocate_device_memory(m->ctx, kGlobalBytes, AllocKind::Global, &p);
        r != CUDA_SUCCESS)
      return r;
    it = m->globals.emplace(name, std::make_pair(p, kGlobalBytes)).first;
  }
  if (dptr) *dptr = it->second.first;
  if (bytes) *bytes = it->second.second;
  return CUDA_SUCCESS;
}

CUresult launch_ex(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->hStream, kernelParams, extra);
}

}  // namespace

extern "C" {

CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  return load_module(module, fname);
}
CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return load_module(module, image);
}
CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int, CUjit_option*,
                            void**) {
  return load_module(module, image);
}
CUresult cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return load_module(module, fatCubin);
}

CUresult cuModuleUnload(CUmodule hmod) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(hmod, HandleKind::Module)) return CUDA_ERROR_INVALID_HANDLE;
  unload_module(hmod);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  SIMGPU_REQUIRE_INIT();
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(hmod, HandleKind::Module)) return CUDA_ERROR_INVALID_HANDLE;
  *hfunc = function_in(hmod, name);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod, const char* name) {
  SIMGPU_REQUIRE_INIT();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(hmod, HandleKind::Module)) return CUDA_ERROR_INVALID_HANDLE;
  return module_global(hmod, name, dptr, bytes);
}

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_EAGER_LOADING;
  return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                           unsigned int, CUlibraryOption*, void**, unsigned int) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* lib = new CUlib_st();
  lib->module.reset(new CUmod_st());
  lib->module->ctx = ctx;
  add_handle(lib->module.get(), HandleKind::Module);
  add_handle(lib, HandleKind::Library);
  *library = lib;
  return CUDA_SUCCESS;
}

CUresult cuLibraryLoadFromFile(CUlibrary* library, const char* fileName, CUjit_option* jo,
                               void** jv, unsigned int nj, CUlibraryOption* lo, void** lv,
                               unsigned int nl) {
  return cuLibraryLoadData(library, fileName, jo, jv, nj, lo, lv, nl);
}

CUresult cuLibraryUnload(CUlibrary library) {
  SIMGPU_REQUIRE_INIT();
  if (!has_handle(library, HandleKind::Library)) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& [name, k] : library->kernels) remove_handle(k.get());
  unload_module(library->module.release());
  remove_handle(library);
  delete library;
  return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  SIMGPU_REQUIRE_INIT();
  if (pKernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(library, HandleKind::Library)) return CUDA_ERROR_INVALID_HANDLE;
  CUfunc_st* fn = function_in(library->module.get(), name);
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  auto& k = library->kernels[name];
  if (!k) {
    k = std::make_unique<CUkern_st>();
    k->function = fn;
    k->library = library;
    rt.handles[k.get()] = HandleKind::Kernel;
  }
  *pKernel = k.get();
  return CUDA_SUCCESS;
}

CUresult cuLibraryGetModule(CUmodule* pMod, CUlibrary library) {
  SIMGPU_REQUIRE_INIT();
  if (pMod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(library, HandleKind::Library)) return CUDA_ERROR_INVALID_HANDLE;
  *pMod = library->module.get();
  return CUDA_SUCCESS;
}

CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary library, const char* name) {
  SIMGPU_REQUIRE_INIT();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(library, HandleKind::Library)) return CUDA_ERROR_INVALID_HANDLE;
  return module_global(library->module.get(), name, dptr, bytes);
}

CUresult cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  SIMGPU_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(kernel, HandleKind::Kernel)) return CUDA_ERROR_INVALID_HANDLE;
  *pFunc = kernel->function;
  return CUDA_SUCCESS;
}

CUresult cuKernelGetName(const char** name, CUkernel kernel) {
  SIMGPU_REQUIRE_INIT();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!has_handle(kernel, HandleKind::Kernel)) return CUDA_ERROR_INVALID_HANDLE;
  *name = kernel->function->name.c_str();
  return CUDA_SUCCESS;
}

CUresult cuFuncGetName(const char** name, CUfunction hfunc) {
  SIMGPU_REQUIRE_INIT();
  CUfunc_st* fn = resolve_function(hfunc);
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = fn->name.c_str();
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  SIMGPU_REQUIRE_INIT();
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (resolve_function(hfunc) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *pi = 1024;
      break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *pi = 16;
      break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
      *pi = 90;
      break;
    default:
      *pi = 0;
      break;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute, int) {
  SIMGPU_REQUIRE_INIT();
  return resolve_function(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache) {
  SIMGPU_REQUIRE_INIT();
  return resolve_function(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, CUstream hStream,
                        void** kernelParams, void** extra) {
  return launch(f, hStream, kernelParams, extra);
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream hStream,
                             void** kernelParams, void** extra) {
  return launch(f, hStream, kernelParams, extra);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                          void** extra) {
  return launch_ex(config, f, kernelParams, extra);
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                               void** extra) {
  return launch_ex(config, f, kernelParams, extra);
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int, unsigned int, unsigned int,
                                   unsigned int, unsigned int, unsigned int, unsigned int,
                                   CUstream hStream, void** kernelParams) {
  return launch(f, hStream, kernelParams, nullptr);
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int, unsigned int, unsigned int,
                                        unsigned int, unsigned int, unsigned int, unsigned int,
                                        CUstream hStream, void** kernelParams) {
  return launch(f, hStream, kernelParams, nullptr);
}
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS* launchParamsList,
                                              unsigned int numDevices, unsigned int) {
  SIMGPU_REQUIRE_INIT();
  if (launchParamsList == nullptr || numDevices == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < numDevices; ++i) {
    const CUDA_LAUNCH_PARAMS& p = launchParamsList[i];
    if (CUresult r = launch(p.function, p.hStream, p.kernelParams, nullptr); r != CUDA_SUCCESS)
      return r;
  }
  return CUDA_SUCCESS;
}
CUresult cuLaunch(CUfunction f) {
  return launch(f, nullptr, nullptr, nullptr);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, CUfunction func, int, size_t) {
  SIMGPU_REQUIRE_INIT();
  if (numBlocks == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (resolve_function(func) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *numBlocks = 2;
  return CUDA_SUCCESS;
}

}  // extern "C"
