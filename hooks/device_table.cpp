// NVML through dlopen: only the entry points naming devices, declared with NVML's C ABI
// (opaque handles, int results, 0 = success), as arbiter/gpu_inventory.cpp does.
#include "hooks/device_table.h"

#include <dlfcn.h>
#include <strings.h>

#include <map>

#include "hooks/admin_client.h"
#include "hooks/error.h"

namespace quanta::hooks {
namespace {

using Device = struct NvmlDeviceOpaque*;
using InitFn = int (*)();
using CountFn = int (*)(unsigned*);
using HandleFn = int (*)(unsigned, Device*);
using UuidFn = int (*)(Device, char*, unsigned);
using MinorFn = int (*)(Device, unsigned*);
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

const GpuEntry* DeviceTable::find(const std::string& name) const {
  for (const GpuEntry& e : entries) {
    if (e.name == name || strcasecmp(e.uuid.c_str(), name.c_str()) == 0) return &e;
  }
  return nullptr;
}

DeviceTable arbiter_device_table(const std::string& admin_socket, uint64_t timeout_ns) {
  const AdminReply reply = admin_request(admin_socket, {{"cmd", "devices"}}, timeout_ns);
  if (reply.outcome == AdminOutcome::kUnreachable) throw ArbiterUnreachable(reply.reason);
  if (reply.outcome == AdminOutcome::kRefused)
    throw HookError("the arbiter did not list the node's GPUs: " + reply.reason);
  DeviceTable table;
  const auto list = reply.response.find("devices");
  if (list == reply.response.end() || !list->is_array())
    throw HookError("the arbiter's list of GPUs has no \"devices\" array");
  for (const nlohmann::json& d : *list) {
    if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || !d.contains("uuid") ||
        !d["uuid"].is_string() || !d.contains("minor") || !d["minor"].is_number_integer())
      throw HookError("the arbiter's list of GPUs has an entry without name, uuid and minor: " +
                      shown(d.dump()));
    table.entries.push_back(GpuEntry{d["name"].get<std::string>(), d["uuid"].get<std::string>(),
                                     d["minor"].get<int>(), d.value("mig", false)});
  }
  return table;
}

DeviceTable load_nvml_devices() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw HookError(std::string("cannot load NVML (libnvidia-ml.so.1): ") +
                    (why ? why : "unknown error") +
                    ": the GPUs' names cannot be resolved without the NVIDIA driver (a driver "
                    "outside the library path needs LD_LIBRARY_PATH in the hook's env)");
  }
  auto init = symbol<InitFn>(lib, "nvmlInit_v2", "nvmlInit");
  auto count = symbol<CountFn>(lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
  auto handle =
      symbol<HandleFn>(lib, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
  auto uuid = symbol<UuidFn>(lib, "nvmlDeviceGetUUID");
  auto minor = symbol<MinorFn>(lib, "nvmlDeviceGetMinorNumber");
  auto mig_count = symbol<MigCountFn>(lib, "nvmlDeviceGetMaxMigDeviceCount");
  auto mig_handle = symbol<MigHandleFn>(lib, "nvmlDeviceGetMigDeviceHandleByIndex");
  auto error_string = symbol<ErrorStringFn>(lib, "nvmlErrorString");
  auto fail = [&](const char* what, int rc) {
    std::string text = std::string("NVML ") + what + " failed with code " + std::to_string(rc);
    if (error_string != nullptr) text += std::string(" (") + error_string(rc) + ")";
    throw HookError(text);
  };
  if (init == nullptr || count == nullptr || handle == nullptr || uuid == nullptr)
    throw HookError("libnvidia-ml.so.1 lacks nvmlInit/nvmlDeviceGetCount/GetHandleByIndex/GetUUID");
  if (int rc = init(); rc != 0) fail("nvmlInit", rc);
  unsigned n = 0;
  if (int rc = count(&n); rc != 0) fail("nvmlDeviceGetCount", rc);

  DeviceTable table;
  std::map<int, int> top_level_instances;  // minor -> MIG instances listed at the top level
  for (unsigned i = 0; i < n; ++i) {
    Device dev = nullptr;
    if (int rc = handle(i, &dev); rc != 0) fail("nvmlDeviceGetHandleByIndex", rc);
    char text[96] = {};
    if (int rc = uuid(dev, text, sizeof(text)); rc != 0) fail("nvmlDeviceGetUUID", rc);
    unsigned m = i;
    if (minor == nullptr || minor(dev, &m) != 0) m = i;
    GpuEntry e;
    e.uuid = text;
    e.minor = static_cast<int>(m);
    e.mig = strncasecmp(text, "MIG-", 4) == 0;
    e.name = e.mig ? std::to_string(m) + ":" + std::to_string(top_level_instances[e.minor]++)
                   : std::to_string(i);
    table.entries.push_back(e);
    unsigned migs = 0;
    if (e.mig || mig_count == nullptr || mig_handle == nullptr || mig_count(dev, &migs) != 0)
      continue;
    for (unsigned k = 0; k < migs; ++k) {
      Device mig = nullptr;
      if (mig_handle(dev, k, &mig) != 0 || mig == nullptr) continue;  // slot not populated
      char mtext[96] = {};
      if (uuid(mig, mtext, sizeof(mtext)) != 0) continue;
      table.entries.push_back(GpuEntry{std::to_string(i) + ":" + std::to_string(k), mtext,
                                       e.minor, true});
    }
  }
  // The library stays loaded: NVML does not like being shut down and re-initialised.
  return table;
}

}  // namespace quanta::hooks
