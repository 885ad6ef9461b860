// The node's GPUs by the names users give them: from the arbiter's list, or from NVML
// (hosted/nvml.h loads the library) where no arbiter answers.
#include "hooks/device_table.h"

#include <strings.h>

#include <map>

#include "hosted/admin_client.h"
#include "hooks/error.h"
#include "hosted/nvml.h"

namespace quanta::hooks {

const GpuEntry* DeviceTable::find(const std::string& name) const {
  for (const GpuEntry& e : entries) {
    if (e.name == name || strcasecmp(e.uuid.c_str(), name.c_str()) == 0) return &e;
  }
  return nullptr;
}

DeviceTable arbiter_device_table(const std::string& admin_socket, uint64_t timeout_ns) {
  const hosted::AdminReply reply = hosted::admin_request(admin_socket, {{"cmd", "devices"}}, timeout_ns);
  if (reply.outcome == hosted::AdminOutcome::kUnreachable) throw ArbiterUnreachable(reply.reason);
  if (reply.outcome == hosted::AdminOutcome::kRefused)
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
  const hosted::Nvml& nvml = hosted::nvml();
  if (!nvml.loaded()) {
    throw HookError("cannot load NVML (libnvidia-ml.so.1): " + nvml.load_error +
                    ": the GPUs' names cannot be resolved without the NVIDIA driver (a driver "
                    "outside the library path needs LD_LIBRARY_PATH in the hook's env)");
  }
  const auto count = nvml.count;
  const auto handle = nvml.handle_by_index;
  const auto uuid = nvml.uuid;
  const auto minor = nvml.minor;
  const auto mig_count = nvml.max_mig_count;
  const auto mig_handle = nvml.mig_handle;
  auto fail = [&](const char* what, nvmlReturn_t rc) {
    throw HookError(std::string("NVML ") + what + " failed with " + nvml.describe(rc));
  };
  if (nvml.init == nullptr || count == nullptr || handle == nullptr || uuid == nullptr)
    throw HookError("libnvidia-ml.so.1 lacks nvmlInit/nvmlDeviceGetCount/GetHandleByIndex/GetUUID");
  if (nvmlReturn_t rc = nvml.init(); rc != NVML_SUCCESS) fail("nvmlInit", rc);
  unsigned n = 0;
  if (nvmlReturn_t rc = count(&n); rc != NVML_SUCCESS) fail("nvmlDeviceGetCount", rc);

  DeviceTable table;
  std::map<int, int> top_level_instances;  // minor -> MIG instances listed at the top level
  for (unsigned i = 0; i < n; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t rc = handle(i, &dev); rc != NVML_SUCCESS) fail("nvmlDeviceGetHandleByIndex", rc);
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
    if (nvmlReturn_t rc = uuid(dev, text, sizeof(text)); rc != NVML_SUCCESS) fail("nvmlDeviceGetUUID", rc);
    unsigned m = i;
    if (minor == nullptr || minor(dev, &m) != NVML_SUCCESS) m = i;
    GpuEntry e;
    e.uuid = text;
    e.minor = static_cast<int>(m);
    e.mig = strncasecmp(text, "MIG-", 4) == 0;
    e.name = e.mig ? std::to_string(m) + ":" + std::to_string(top_level_instances[e.minor]++)
                   : std::to_string(i);
    table.entries.push_back(e);
    unsigned migs = 0;
    if (e.mig || mig_count == nullptr || mig_handle == nullptr || mig_count(dev, &migs) != NVML_SUCCESS)
      continue;
    for (unsigned k = 0; k < migs; ++k) {
      nvmlDevice_t mig = nullptr;
      if (mig_handle(dev, k, &mig) != NVML_SUCCESS || mig == nullptr) continue;  // not made
      char mtext[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
      if (uuid(mig, mtext, sizeof(mtext)) != NVML_SUCCESS) continue;
      table.entries.push_back(GpuEntry{std::to_string(i) + ":" + std::to_string(k), mtext,
                                       e.minor, true});
    }
  }
  // The library stays loaded: NVML does not like being shut down and re-initialised.
  return table;
}

}  // namespace quanta::hooks
