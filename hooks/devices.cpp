// Device evidence and its resolution to UUIDs through the device table.
#include "hooks/devices.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "hooks/error.h"

namespace quanta::hooks {
namespace {

constexpr int64_t kNvidiaMajor = 195;  // /dev/nvidia<N>; 254 and 255 are modeset and ctl
constexpr int64_t kMaxGpuMinor = 253;

// CDI kinds whose device names are NVIDIA's (index, UUID, N:M, all).
bool gpu_kind(const std::string& kind) {
  return kind == "nvidia.com/gpu" || kind == "k8s.device-plugin.nvidia.com/gpu" ||
         kind == "quanta.dev/gpu" || kind == "nvidia.com/mig";
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(0, 1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

bool full_uuid(const std::string& name) {
  if (name.size() < 40) return false;
  std::string head = name.substr(0, 4);
  for (char& c : head) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return head == "GPU-" || head == "MIG-";
}

bool grants_use(const DeviceRule& r) {
  return r.access.empty() || r.access.find('r') != std::string::npos ||
         r.access.find('w') != std::string::npos;
}

}  // namespace

std::string device_marker_name(const std::string& uuid_or_all) {
  std::string name = "QUANTA_DEVICE_";
  if (uuid_or_all == "all") return name + "ALL";
  for (unsigned char c : uuid_or_all)
    name += std::isalnum(c) ? static_cast<char>(std::toupper(c)) : '_';
  return name;
}

DeviceEvidence gather_device_evidence(const BundleConfig& config) {
  DeviceEvidence e;
  auto claim = [&e](const std::string& name, const std::string& source) {
    e.claims.push_back(name);
    e.claim_sources.push_back(source);
  };

  // Quanta's own "all" device means "Quanta on whatever GPUs the container has": it names
  // every GPU only when nothing else names any.
  std::string quanta_all;
  for (const auto& [key, value] : config.annotations) {
    if (key.rfind("cdi.k8s.io/", 0) != 0) continue;
    for (const std::string& qualified : split(value, ',')) {
      const size_t eq = qualified.find('=');
      if (eq == std::string::npos) continue;
      const std::string kind = qualified.substr(0, eq);
      const std::string name = qualified.substr(eq + 1);
      if (kind == "quanta.dev/gpu" && name == "all") {
        quanta_all = "annotation " + key + " (" + qualified + ")";
      } else if (gpu_kind(kind)) {
        claim(name, "annotation " + key + " (" + qualified + ")");
      }
    }
  }
  if (auto it = config.env.find("NVIDIA_VISIBLE_DEVICES"); it != config.env.end()) {
    const std::string& v = it->second;
    if (v != "void" && v != "none" && !v.empty()) {
      for (const std::string& name : split(v, ',')) {
        // A qualified CDI name ("nvidia.com/gpu=0") is NVIDIA's runtime's CDI mode.
        const size_t eq = name.find('=');
        if (eq == std::string::npos) {
          claim(name, "NVIDIA_VISIBLE_DEVICES=" + v);
        } else if (gpu_kind(name.substr(0, eq))) {
          claim(name.substr(eq + 1), "NVIDIA_VISIBLE_DEVICES=" + v);
        }
      }
    }
  }
  for (const auto& [key, value] : config.env) {
    if (key.rfind("QUANTA_DEVICE_", 0) != 0 || value.empty() || key != device_marker_name(value))
      continue;
    if (value == "all") {
      quanta_all = "Quanta's CDI device all (" + key + ")";
    } else {
      claim(value, "Quanta's CDI device (" + key + ")");
    }
  }
  if (e.claims.empty() && !quanta_all.empty()) claim("all", quanta_all);

  for (const DeviceNode& n : config.devices) {
    if (n.type == 'c' && n.major == kNvidiaMajor && n.minor >= 0 && n.minor <= kMaxGpuMinor) {
      e.has_nodes = true;
      e.minors.insert(static_cast<int>(n.minor));
    }
  }
  for (const DeviceRule& r : config.device_rules) {
    if (!r.allow || !grants_use(r) || r.type == 'b') continue;
    if (r.major != kNvidiaMajor && !(r.major == -1 && r.type == 'a')) continue;
    if (r.minor == -1) {
      e.has_nodes = true;
      e.all_minors = true;
    } else if (r.minor >= 0 && r.minor <= kMaxGpuMinor) {
      e.has_nodes = true;
      e.minors.insert(static_cast<int>(r.minor));
    }
  }
  return e;
}

std::vector<std::string> resolve_devices(const DeviceEvidence& e,
                                         const std::function<DeviceTable()>& load,
                                         std::vector<std::string>* notes) {
  std::optional<DeviceTable> table;
  auto get_table = [&]() -> const DeviceTable& {
    if (!table) table = load();
    return *table;
  };
  auto node_allows = [&e](const GpuEntry& g) {
    return e.all_minors || e.minors.count(g.minor) != 0;
  };

  std::vector<std::string> out;
  auto add = [&out](const std::string& uuid) {
    if (std::find(out.begin(), out.end(), uuid) == out.end()) out.push_back(uuid);
  };

  bool needs_table = e.has_nodes;
  for (const std::string& c : e.claims) needs_table = needs_table || !full_uuid(c);

  if (e.claims.empty()) {
    if (!e.has_nodes) return out;
    for (const GpuEntry& g : get_table().entries)
      if (node_allows(g)) add(g.uuid);
    return out;
  }

  for (size_t i = 0; i < e.claims.size(); ++i) {
    const std::string& name = e.claims[i];
    if (!needs_table) {
      std::string uuid = name;
      for (size_t k = 4; k < uuid.size(); ++k)
        uuid[k] = static_cast<char>(std::tolower(static_cast<unsigned char>(uuid[k])));
      uuid[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(uuid[0])));
      uuid[1] = static_cast<char>(std::toupper(static_cast<unsigned char>(uuid[1])));
      uuid[2] = static_cast<char>(std::toupper(static_cast<unsigned char>(uuid[2])));
      add(uuid);
      continue;
    }
    const DeviceTable& t = get_table();
    std::vector<const GpuEntry*> named;
    if (name == "all") {
      for (const GpuEntry& g : t.entries) named.push_back(&g);
    } else if (const GpuEntry* g = t.find(name)) {
      named.push_back(g);
    } else {
      std::string listed;
      for (const GpuEntry& g : t.entries) listed += (listed.empty() ? "" : ", ") + g.name;
      throw HookError(e.claim_sources[i] + " names GPU " + shown(name) +
                      ", which NVML does not list: use an index, GPU:INSTANCE or UUID of " +
                      (listed.empty() ? std::string("(no GPUs)") : listed) + ", or all");
    }
    for (const GpuEntry* g : named) {
      if (e.has_nodes && !node_allows(*g)) {
        if (notes != nullptr && name != "all")
          notes->push_back(e.claim_sources[i] + " names " + g->uuid +
                           " but the container has no device node for it: not registered for it");
        continue;
      }
      add(g->uuid);
    }
  }
  // NVML order, so a registration reads the same whatever order the claims came in.
  if (table) {
    std::vector<std::string> ordered;
    for (const GpuEntry& g : table->entries)
      if (std::find(out.begin(), out.end(), g.uuid) != out.end()) ordered.push_back(g.uuid);
    for (const std::string& u : out)
      if (std::find(ordered.begin(), ordered.end(), u) == ordered.end()) ordered.push_back(u);
    out = ordered;
  }
  return out;
}

}  // namespace quanta::hooks
