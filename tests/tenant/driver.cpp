// Fills the tenant's driver table by each lookup path. The direct path takes the
// addresses of the linked symbols (weak, so a driver lacking one family still runs the
// others); dlsym and cuGetProcAddress resolve at run time like cudart does.
#include "tests/tenant/driver.h"

#include <dlfcn.h>

#include <string>

// Weak references: a symbol the loaded libcuda.so.1 lacks resolves to null instead of
// failing the program's start, and the table reports it as missing. The core entries
// stay strong so the program records its need of libcuda.so.1 (DT_NEEDED) even when the
// linker drops libraries that only satisfy weak references.
#define QUANTA_TENANT_STRINGIFY(x) #x
#define QUANTA_TENANT_WEAK(member, symbol, name) _Pragma(QUANTA_TENANT_STRINGIFY(weak symbol))
QUANTA_TENANT_DRIVER_OPTIONAL_ENTRIES(QUANTA_TENANT_WEAK)
#pragma weak cuCtxCreate_v4

namespace quanta::tenant {
namespace {

using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

void load_direct(Driver& driver) {
#define QUANTA_TENANT_DIRECT(member, symbol, name) driver.member = &symbol;
  QUANTA_TENANT_DRIVER_ENTRIES(QUANTA_TENANT_DIRECT)
#undef QUANTA_TENANT_DIRECT
  driver.CtxCreate_v4 = &cuCtxCreate_v4;
}

std::string load_dlsym(Driver& driver) {
  // Never closed: the table points into the library for the life of the process.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    return std::string("dlopen(\"libcuda.so.1\") failed: ") + dlerror();
  }
#define QUANTA_TENANT_DLSYM(member, symbol, name) \
  driver.member = reinterpret_cast<decltype(driver.member)>(dlsym(library, #symbol));
  QUANTA_TENANT_DRIVER_ENTRIES(QUANTA_TENANT_DLSYM)
#undef QUANTA_TENANT_DLSYM
  driver.CtxCreate_v4 = reinterpret_cast<CtxCreateV4>(dlsym(library, "cuCtxCreate_v4"));
  driver.CtxCreate_v3 = reinterpret_cast<CtxCreateV3>(dlsym(library, "cuCtxCreate_v3"));
  driver.CtxCreate_v2 = reinterpret_cast<CtxCreateV2>(dlsym(library, "cuCtxCreate_v2"));
  return {};
}

std::string load_getproc(Driver& driver, cuuint64_t flags) {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    return std::string("dlopen(\"libcuda.so.1\") failed: ") + dlerror();
  }
  auto get_proc = reinterpret_cast<GetProcAddressV2>(dlsym(library, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    return "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12.0)";
  }
  CUresult init_result = CUDA_SUCCESS;
  CUdriverProcAddressQueryResult init_status = CU_GET_PROC_ADDRESS_SUCCESS;
  auto resolve = [&](const char* name) -> void* {
    void* function = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUresult result = get_proc(name, &function, driver.cuda_version, flags, &status);
    if (std::string_view(name) == "cuInit") {
      init_result = result;
      init_status = status;
    }
    if (result != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) {
      return nullptr;
    }
    return function;
  };
#define QUANTA_TENANT_GETPROC(member, symbol, name) \
  driver.member = reinterpret_cast<decltype(driver.member)>(resolve(name));
  QUANTA_TENANT_DRIVER_ENTRIES(QUANTA_TENANT_GETPROC)
#undef QUANTA_TENANT_GETPROC
  // The driver picks the cuCtxCreate revision by the version asked for: _v4 from 12.5,
  // _v3 from 11.4, _v2 before; the pointer is only callable with that prototype.
  void* ctx_create = resolve("cuCtxCreate");
  if (driver.cuda_version >= 12050) {
    driver.CtxCreate_v4 = reinterpret_cast<CtxCreateV4>(ctx_create);
  } else if (driver.cuda_version >= 11040) {
    driver.CtxCreate_v3 = reinterpret_cast<CtxCreateV3>(ctx_create);
  } else {
    driver.CtxCreate_v2 = reinterpret_cast<CtxCreateV2>(ctx_create);
  }
  if (driver.Init == nullptr) {
    return "cuGetProcAddress_v2(\"cuInit\", " + std::to_string(driver.cuda_version) + ", " +
           std::to_string(flags) + ") gave " +
           (init_result != CUDA_SUCCESS
                ? error_name(driver, init_result)
                : "symbol status " + std::to_string(static_cast<int>(init_status)));
  }
  return {};
}

}  // namespace

std::string_view lookup_name(Lookup lookup) {
  switch (lookup) {
    case Lookup::direct:
      return "direct";
    case Lookup::dlsym:
      return "dlsym";
    case Lookup::getproc:
      return "getproc";
    case Lookup::getproc_ptds:
      return "getproc-ptds";
  }
  return "unknown";
}

std::string load_driver(Lookup lookup, int cuda_version, Driver& driver) {
  driver = Driver{};
  driver.lookup = lookup;
  driver.cuda_version = cuda_version;
  std::string failure;
  switch (lookup) {
    case Lookup::direct:
      load_direct(driver);
      break;
    case Lookup::dlsym:
      failure = load_dlsym(driver);
      break;
    case Lookup::getproc:
      failure = load_getproc(driver, CU_GET_PROC_ADDRESS_DEFAULT);
      break;
    case Lookup::getproc_ptds:
      failure = load_getproc(driver, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
      break;
  }
  if (!failure.empty()) {
    return failure;
  }
#define QUANTA_TENANT_MISSING(member, symbol, name) \
  if (driver.member == nullptr) driver.missing.emplace_back(name);
  QUANTA_TENANT_DRIVER_ENTRIES(QUANTA_TENANT_MISSING)
#undef QUANTA_TENANT_MISSING
  if (driver.CtxCreate_v4 == nullptr && driver.CtxCreate_v3 == nullptr &&
      driver.CtxCreate_v2 == nullptr) {
    driver.missing.emplace_back("cuCtxCreate");
  }
  if (driver.Init == nullptr) {
    return "the driver has no cuInit through lookup " + std::string(lookup_name(lookup));
  }
  return {};
}

std::string describe_entry(const void* entry) {
  if (entry == nullptr) return "unresolved";
  Dl_info info{};
  if (dladdr(entry, &info) == 0) return "unknown";
  std::string library = info.dli_fname != nullptr ? info.dli_fname : "?";
  library = library.substr(library.find_last_of('/') + 1);
  return std::string(info.dli_sname != nullptr ? info.dli_sname : "?") + "@" + library;
}

std::string error_name(const Driver& driver, CUresult result) {
  const char* name = nullptr;
  if (driver.GetErrorName != nullptr && driver.GetErrorName(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  // The ones a driver that cannot name errors (the toolkit's stub, for one) gives most.
  switch (result) {
    case CUDA_ERROR_INVALID_VALUE:
      return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
      return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY:
      return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_NO_DEVICE:
      return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE:
      return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_NOT_FOUND:
      return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED:
      return "CUDA_ERROR_NOT_SUPPORTED";
    default:
      return "CUresult " + std::to_string(static_cast<int>(result));
  }
}

}  // namespace quanta::tenant
