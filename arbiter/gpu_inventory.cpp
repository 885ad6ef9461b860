// NVML through dlopen: only the handful of entry points discovery needs, declared here
// with NVML's C ABI (opaque device handles, int return codes, 0 = success).
#include "arbiter/gpu_inventory.h"

#include <dlfcn.h>

#include <stdexcept>

namespace quanta::arbiter {
namespace {

using Device = struct NvmlDeviceOpaque*;
using InitFn = int (*)();
using CountFn = int (*)(unsigned*);
using HandleFn = int (*)(unsigned, Device*);
using UuidFn = int (*)(Device, char*, unsigned);
using MigCountFn = int (*)(Device, unsigned*);
using MigHandleFn = int (*)(Device, unsigned, Device*);
using ErrorStringFn = const char* (*)(int);

template <typename F>
F symbol(void* lib, const char* name, const char* fallback = nullptr) {
  void* p = dlsym(lib, name);
  if (p == nullptr && fallback != nullptr) p = dlsym(lib, fallback);
  return reinterpret_cast<F>(p);
}

}  // namespace

std::vector<std::string> discover_gpus(const std::vector<std::string>& wanted) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(
        std::string("cannot load NVML (libnvidia-ml.so.1): ") + (why ? why : "unknown error") +
        ": install the NVIDIA driver, or for tests set LD_LIBRARY_PATH to simgpu's build/sim");
  }
  auto init = symbol<InitFn>(lib, "nvmlInit_v2", "nvmlInit");
  auto count = symbol<CountFn>(lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
  auto handle =
      symbol<HandleFn>(lib, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
  auto uuid = symbol<UuidFn>(lib, "nvmlDeviceGetUUID");
  auto mig_count = symbol<MigCountFn>(lib, "nvmlDeviceGetMaxMigDeviceCount");
  auto mig_handle = symbol<MigHandleFn>(lib, "nvmlDeviceGetMigDeviceHandleByIndex");
  auto error_string = symbol<ErrorStringFn>(lib, "nvmlErrorString");
  auto fail = [&](const char* what, int rc) {
    std::string text = std::string("NVML ") + what + " failed with code " + std::to_string(rc);
    if (error_string != nullptr) text += std::string(" (") + error_string(rc) + ")";
    throw std::runtime_error(text);
  };
  if (init == nullptr || count == nullptr || handle == nullptr || uuid == nullptr) {
    throw std::runtime_error(
        "libnvidia-ml.so.1 lacks nvmlInit/nvmlDeviceGetCount/GetHandleByIndex/GetUUID");
  }
  if (int rc = init(); rc != 0) fail("nvmlInit", rc);
  unsigned n = 0;
  if (int rc = count(&n); rc != 0) fail("nvmlDeviceGetCount", rc);

  std::vector<std::string> all;
  for (unsigned i = 0; i < n; ++i) {
    Device dev = nullptr;
    if (int rc = handle(i, &dev); rc != 0) fail("nvmlDeviceGetHandleByIndex", rc);
    char buf[96] = {};
    if (int rc = uuid(dev, buf, sizeof(buf)); rc != 0) fail("nvmlDeviceGetUUID", rc);
    auto add = [&all](const char* uuid_text) {
      for (const std::string& a : all) {
        if (a == uuid_text) return;  // a driver listing MIG instances both ways
      }
      all.emplace_back(uuid_text);
    };
    add(buf);
    unsigned migs = 0;
    if (mig_count == nullptr || mig_handle == nullptr || mig_count(dev, &migs) != 0) continue;
    for (unsigned m = 0; m < migs; ++m) {
      Device mig = nullptr;
      if (mig_handle(dev, m, &mig) != 0 || mig == nullptr) continue;  // slot not populated
      char mbuf[96] = {};
      if (uuid(mig, mbuf, sizeof(mbuf)) == 0) add(mbuf);
    }
  }
  // The library stays loaded: NVML does not like being shut down and re-initialised.

  if (wanted.empty()) return all;
  std::vector<std::string> out;
  for (const std::string& w : wanted) {
    bool found = false;
    for (const std::string& a : all) found = found || a == w;
    if (!found) {
      std::string list;
      for (const std::string& a : all) list += (list.empty() ? "" : ", ") + a;
      throw std::runtime_error("[node] gpus names " + w +
                               ", which NVML does not report; it reports: " +
                               (list.empty() ? std::string("no devices") : list));
    }
    out.push_back(w);
  }
  return out;
}

}  // namespace quanta::arbiter
