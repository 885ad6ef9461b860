// Parsing of the SIMGPU_* environment into a Config. Every rejection names the variable,
// the value and what is allowed, because a silently defaulted fake GPU makes tests lie.
#include "tests/simgpu/config.h"

#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace quanta::simgpu {
namespace {

constexpr int kMaxPhysicalDevices = 16;
constexpr int kMaxMigInstances = 7;
constexpr int kMaxVisibleDevices = 32;

bool parse_u64(const std::string& text, uint64_t& value) {
  if (text.empty() || text.size() > 19) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  value = v;
  return true;
}

std::string bad(const char* var, const char* value, const char* allowed) {
  return std::string("simgpu: ") + var + "='" + value + "' is invalid: " + allowed;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    parts.push_back(text.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

// Deterministic per-index UUID bytes, so two runs with the same config see the same GPUs.
void default_uuid(int physical, int mig, uint8_t out[16]) {
  static constexpr uint8_t kBase[16] = {0x51, 0x75, 0x61, 0x6e, 0x74, 0x61, 0x40, 0x00,
                                        0x80, 0x00, 0x53, 0x49, 0x4d, 0x00, 0x00, 0x00};
  std::memcpy(out, kBase, 16);
  out[13] = static_cast<uint8_t>(mig + 1);
  out[15] = static_cast<uint8_t>(physical);
}

}  // namespace

bool parse_byte_size(const std::string& text, uint64_t& bytes) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  uint64_t number = 0;
  if (!parse_u64(text.substr(0, digits), number)) return false;
  const std::string suffix = text.substr(digits);
  uint64_t unit = 1;
  if (suffix.empty())
    unit = 1;
  else if (suffix == "K")
    unit = 1000ULL;
  else if (suffix == "M")
    unit = 1000ULL * 1000;
  else if (suffix == "G")
    unit = 1000ULL * 1000 * 1000;
  else if (suffix == "T")
    unit = 1000ULL * 1000 * 1000 * 1000;
  else if (suffix == "Ki")
    unit = 1ULL << 10;
  else if (suffix == "Mi")
    unit = 1ULL << 20;
  else if (suffix == "Gi")
    unit = 1ULL << 30;
  else if (suffix == "Ti")
    unit = 1ULL << 40;
  else
    return false;
  if (number != 0 && unit > UINT64_MAX / number) return false;
  bytes = number * unit;
  return true;
}

bool parse_uuid(const std::string& text, const char* prefix, uint8_t out[16]) {
  const size_t plen = std::strlen(prefix);
  if (text.compare(0, plen, prefix) != 0) return false;
  const std::string body = text.substr(plen);
  static constexpr int kGroups[5] = {8, 4, 4, 4, 12};
  auto groups = split(body, '-');
  if (groups.size() != 5) return false;
  std::string hex;
  for (int i = 0; i < 5; ++i) {
    if (groups[i].size() != static_cast<size_t>(kGroups[i])) return false;
    hex += groups[i];
  }
  for (int i = 0; i < 16; ++i) {
    unsigned value = 0;
    for (int j = 0; j < 2; ++j) {
      char c = static_cast<char>(std::tolower(static_cast<unsigned char>(hex[2 * i + j])));
      if (c >= '0' && c <= '9')
        value = value * 16 + static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        value = value * 16 + static_cast<unsigned>(c - 'a' + 10);
      else
        return false;
    }
    out[i] = static_cast<uint8_t>(value);
  }
  return true;
}

std::string format_uuid(const char* prefix, const uint8_t uuid[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text = prefix;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += kHex[uuid[i] >> 4];
    text += kHex[uuid[i] & 15];
  }
  return text;
}

bool parse_config(EnvLookup env, Config& out, std::string& error) {
  Config cfg;
  const char* v = nullptr;

  int physical = 1;
  if ((v = env("SIMGPU_DEVICES")) != nullptr) {
    uint64_t n = 0;
    if (!parse_u64(v, n) || n < 1 || n > kMaxPhysicalDevices) {
      error = bad("SIMGPU_DEVICES", v, "expected a device count from 1 to 16");
      return false;
    }
    physical = static_cast<int>(n);
  }

  uint64_t memory = 80ULL << 30;
  if ((v = env("SIMGPU_MEMORY")) != nullptr) {
    if (!parse_byte_size(v, memory) || memory < (1ULL << 20) || memory > (64ULL << 40)) {
      error = bad("SIMGPU_MEMORY", v,
                  "expected bytes from 1Mi to 64Ti, plain or with a K, M, G, T, Ki, Mi, Gi or Ti "
                  "suffix (e.g. 80Gi)");
      return false;
    }
  }

  std::string name = "simgpu H100";
  if ((v = env("SIMGPU_NAME")) != nullptr) {
    if (std::strlen(v) == 0 || std::strlen(v) > 63) {
      error = bad("SIMGPU_NAME", v, "expected a device name of 1 to 63 characters");
      return false;
    }
    name = v;
  }

  std::vector<std::array<uint8_t, 16>> uuids(static_cast<size_t>(physical));
  for (int i = 0; i < physical; ++i) default_uuid(i, -1, uuids[static_cast<size_t>(i)].data());
  if ((v = env("SIMGPU_UUIDS")) != nullptr) {
    auto parts = split(v, ',');
    bool ok = parts.size() == static_cast<size_t>(physical);
    for (size_t i = 0; ok && i < parts.size(); ++i)
      ok = parse_uuid(parts[i], "GPU-", uuids[i].data());
    if (!ok) {
      error = bad("SIMGPU_UUIDS", v,
                  "expected one GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex) per device, "
                  "comma separated, as many as SIMGPU_DEVICES");
      return false;
    }
  }

  std::vector<int> mig(static_cast<size_t>(physical), 0);
  if ((v = env("SIMGPU_MIG")) != nullptr && *v != '\0') {
    bool ok = true;
    for (const auto& part : split(v, ',')) {
      auto fields = split(part, ':');
      uint64_t index = 0, count = 0;
      if (fields.size() != 2 || !parse_u64(fields[0], index) || !parse_u64(fields[1], count) ||
          index >= static_cast<uint64_t>(physical) || count < 1 || count > kMaxMigInstances ||
          mig[index] != 0) {
        ok = false;
        break;
      }
      mig[index] = static_cast<int>(count);
    }
    if (!ok) {
      error = bad("SIMGPU_MIG", v,
                  "expected DEVICE:INSTANCES pairs, comma separated, each device below "
                  "SIMGPU_DEVICES at most once, 1 to 7 instances (e.g. 0:3)");
      return false;
    }
  }

  for (int p = 0; p < physical; ++p) {
    const auto& uuid = uuids[static_cast<size_t>(p)];
    if (mig[static_cast<size_t>(p)] == 0) {
      DeviceSpec spec;
      spec.name = name;
      std::memcpy(spec.uuid, uuid.data(), 16);
      std::memcpy(spec.parent_uuid, uuid.data(), 16);
      spec.uuid_text = format_uuid("GPU-", spec.uuid);
      spec.memory_bytes = memory;
      spec.physical_index = p;
      cfg.devices.push_back(spec);
      continue;
    }
    const int count = mig[static_cast<size_t>(p)];
    for (int m = 0; m < count; ++m) {
      DeviceSpec spec;
      spec.name = name + " MIG " + std::to_string(m + 1) + "/" + std::to_string(count);
      std::memcpy(spec.uuid, uuid.data(), 16);
      std::memcpy(spec.parent_uuid, uuid.data(), 16);
      spec.uuid[12] ^= 0x4d;  // MIG instance UUIDs differ from their parent's
      spec.uuid[13] = static_cast<uint8_t>(m + 1);
      spec.uuid_text = format_uuid("MIG-", spec.uuid);
      spec.memory_bytes = memory / static_cast<uint64_t>(count);
      spec.physical_index = p;
      spec.mig_instance = m;
      cfg.devices.push_back(spec);
    }
  }
  if (cfg.devices.size() > kMaxVisibleDevices) {
    error = std::string("simgpu: SIMGPU_DEVICES and SIMGPU_MIG give ") +
            std::to_string(cfg.devices.size()) + " devices: at most 32 are allowed";
    return false;
  }

  if ((v = env("SIMGPU_TIMESLICE_US")) != nullptr) {
    uint64_t us = 0;
    if (!parse_u64(v, us) || us < 10 || us > 10'000'000) {
      error = bad("SIMGPU_TIMESLICE_US", v, "expected microseconds from 10 to 10000000");
      return false;
    }
    cfg.timeslice_ns = us * 1000;
  }
  if ((v = env("SIMGPU_SWITCH_US")) != nullptr) {
    uint64_t us = 0;
    if (!parse_u64(v, us) || us > 1'000'000) {
      error = bad("SIMGPU_SWITCH_US", v, "expected microseconds from 0 to 1000000");
      return false;
    }
    cfg.switch_ns = us * 1000;
  }
  if ((v = env("SIMGPU_CONTEXT_MEMORY")) != nullptr) {
    uint64_t bytes = 0;
    if (!parse_byte_size(v, bytes) || bytes > (64ULL << 30)) {
      error = bad("SIMGPU_CONTEXT_MEMORY", v,
                  "expected bytes from 0 to 64Gi, plain or with a K, M, G, T, Ki, Mi, Gi or Ti "
                  "suffix (e.g. 518Mi)");
      return false;
    }
    cfg.context_bytes = bytes;
  }
  if ((v = env("SIMGPU_LOG")) != nullptr && *v != '\0') {
    if (std::strlen(v) >= 480) {
      error = bad("SIMGPU_LOG", v, "expected a file path shorter than 480 characters");
      return false;
    }
    cfg.log_path = v;
  }
  cfg.state_name = "simgpu-" + std::to_string(static_cast<unsigned long>(getuid()));
  if ((v = env("SIMGPU_STATE")) != nullptr) {
    bool ok = std::strlen(v) >= 1 && std::strlen(v) <= 200;
    for (const char* c = v; ok && *c; ++c)
      ok = std::isalnum(static_cast<unsigned char>(*c)) || *c == '-' || *c == '_' || *c == '.';
    if (!ok) {
      error = bad("SIMGPU_STATE", v,
                  "expected a shared-state name of 1 to 200 letters, digits, '-', '_' or '.'");
      return false;
    }
    cfg.state_name = v;
  }
  out = std::move(cfg);
  return true;
}

std::vector<int> parse_visible_devices(const char* value, const std::vector<std::string>& uuids) {
  const int count = static_cast<int>(uuids.size());
  std::vector<int> visible;
  if (value == nullptr) {
    for (int i = 0; i < count; ++i) visible.push_back(i);
    return visible;
  }
  const std::string text(value);
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string entry = text.substr(start, end - start);
    const size_t first = entry.find_first_not_of(" \t");
    const size_t last = entry.find_last_not_of(" \t");
    entry = first == std::string::npos ? "" : entry.substr(first, last - first + 1);
    int device = -1;
    uint64_t index = 0;
    if (parse_u64(entry, index)) {
      if (index < static_cast<uint64_t>(count)) device = static_cast<int>(index);
    } else if (entry.size() > 4 && (strncasecmp(entry.c_str(), "GPU-", 4) == 0 ||
                                    strncasecmp(entry.c_str(), "MIG-", 4) == 0)) {
      // A prefix names a device only when exactly one UUID starts with it.
      for (int i = 0; i < count; ++i) {
        if (strncasecmp(uuids[static_cast<size_t>(i)].c_str(), entry.c_str(), entry.size()) != 0)
          continue;
        if (device >= 0) {
          device = -1;
          break;
        }
        device = i;
      }
    }
    if (device < 0 || std::find(visible.begin(), visible.end(), device) != visible.end()) break;
    visible.push_back(device);
    start = end + 1;
  }
  return visible;
}

}  // namespace quanta::simgpu
