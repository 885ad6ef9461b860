// Resolution of the real libcuda.so.1 and libnvidia-ml.so.1: dlopen with RTLD_NOLOAD
// first (the program linked or opened them already), then a plain dlopen, which searches
// past the preloaded shim. Every entry found is checked not to lie in the shim itself.
#include "shim/interpose/real_driver.h"

#include <dlfcn.h>

#include <cstring>

#include "shim/base/log.h"

namespace quanta::shim {

namespace {

constexpr const char* kDriverName = "libcuda.so.1";
constexpr const char* kNvmlName = "libnvidia-ml.so.1";

// glibc's dlsym, found with dlvsym (not overridden) past this library.
using DlsymFn = void* (*)(void*, const char*);
std::atomic<DlsymFn> g_real_dlsym{nullptr};

// One real library: its handle and load base, filled once.
struct RealLibrary {
  const char* soname;
  const char* probe_symbol;  // an entry every version exports, to find the load base
  std::atomic<void*> handle{nullptr};
  std::atomic<const void*> base{nullptr};
  std::atomic<bool> load_failure_reported{false};
};
RealLibrary g_driver{kDriverName, "cuInit"};
RealLibrary g_nvml{kNvmlName, "nvmlInit_v2"};

const void* base_of(const void* address) {
  Dl_info info{};
  if (!address || !dladdr(address, &info)) return nullptr;
  return info.dli_fbase;
}

const void* shim_base() {
  static std::atomic<const void*> base{nullptr};
  const void* b = base.load(std::memory_order_acquire);
  if (!b) {
    b = base_of(reinterpret_cast<const void*>(&shim_base));
    base.store(b, std::memory_order_release);
  }
  return b;
}

// Records `handle` for `library` unless it is the shim itself (a libquanta.so installed
// under the driver's name would otherwise call itself forever).
void* adopt(RealLibrary& library, void* handle) {
  if (!handle) return nullptr;
  void* probe = real_dlsym(handle, library.probe_symbol);
  const void* base = base_of(probe);
  if (!probe || base == shim_base()) {
    QUANTA_LOG_ERROR(
        "%s resolves to libquanta.so itself or lacks %s: refusing it as the real library",
        library.soname, library.probe_symbol);
    return nullptr;
  }
  library.base.store(base, std::memory_order_release);
  void* expected = nullptr;
  if (!library.handle.compare_exchange_strong(expected, handle, std::memory_order_acq_rel)) {
    dlclose(handle);  // another thread won; its handle is the same library
    return expected;
  }
  return handle;
}

void* loaded_handle(RealLibrary& library) {
  if (void* h = library.handle.load(std::memory_order_acquire)) return h;
  return adopt(library, dlopen(library.soname, RTLD_NOW | RTLD_NOLOAD));
}

void* open_handle(RealLibrary& library) {
  if (void* h = loaded_handle(library)) return h;
  void* handle = dlopen(library.soname, RTLD_NOW);
  if (!handle) {
    const char* why = dlerror();
    if (!library.load_failure_reported.exchange(true))  // once: callers may retry often
      QUANTA_LOG_ERROR("cannot load the real %s: %s", library.soname, why ? why : "unknown error");
    return nullptr;
  }
  return adopt(library, handle);
}

void* symbol_in(RealLibrary& library, const char* name) {
  void* handle = open_handle(library);
  if (!handle) return nullptr;
  void* entry = real_dlsym(handle, name);
  if (entry && base_of(entry) == shim_base()) {
    QUANTA_LOG_ERROR("%s from %s resolves into libquanta.so; refusing it", name, library.soname);
    return nullptr;
  }
  if (!entry) QUANTA_LOG_DEBUG("%s does not export %s", library.soname, name);
  return entry;
}

}  // namespace

void* real_dlsym_function() noexcept {
  DlsymFn real = g_real_dlsym.load(std::memory_order_acquire);
  if (__builtin_expect(real == nullptr, 0)) {
    real = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", QUANTA_GLIBC_BASE));
    if (!real) real = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    if (real) g_real_dlsym.store(real, std::memory_order_release);
  }
  return reinterpret_cast<void*>(real);
}

void* real_dlsym(void* handle, const char* name) noexcept {
  auto real = reinterpret_cast<DlsymFn>(real_dlsym_function());
  return real ? real(handle, name) : nullptr;  // glibc always has dlsym under its base version
}

void* real_driver_symbol(const char* name) noexcept {
  return symbol_in(g_driver, name);
}
void* real_nvml_symbol(const char* name) noexcept {
  return symbol_in(g_nvml, name);
}

void* loaded_driver_handle() noexcept {
  return loaded_handle(g_driver);
}
void* loaded_nvml_handle() noexcept {
  return loaded_handle(g_nvml);
}

ObjectKind object_of(const void* address) noexcept {
  Dl_info info{};
  if (!address || !dladdr(address, &info)) return ObjectKind::other;
  if (info.dli_fbase == shim_base()) return ObjectKind::shim;
  // Only an object whose file looks like a real library is matched against it, so this
  // never calls dlopen (and never touches the caller's dlerror) for anything else.
  const char* file = info.dli_fname ? info.dli_fname : "";
  for (const char* p = file; *p; ++p)
    if (*p == '/') file = p + 1;
  if (!strncmp(file, "libcuda.so", 10) && loaded_driver_handle() &&
      info.dli_fbase == g_driver.base.load(std::memory_order_acquire))
    return ObjectKind::cuda_driver;
  if (!strncmp(file, "libnvidia-ml.so", 15) && loaded_nvml_handle() &&
      info.dli_fbase == g_nvml.base.load(std::memory_order_acquire))
    return ObjectKind::nvml;
  return ObjectKind::other;
}

}  // namespace quanta::shim
