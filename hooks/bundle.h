// What quanta-hook reads from a container's bundle (config.json, the runtime-spec "Spec"):
// the rootfs, annotations, environment, mounts, device nodes and device cgroup rules. Only
// these fields are read; everything else in the file is left alone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace quanta::hooks {

struct DeviceNode {
  std::string path;
  char type = 'c';  // c, b, u or p
  int64_t major = -1;
  int64_t minor = -1;
};

// linux.resources.devices: an allow/deny rule; -1 stands for "any" (an absent field).
struct DeviceRule {
  bool allow = false;
  char type = 'a';
  int64_t major = -1;
  int64_t minor = -1;
  std::string access;  // "rwm" subsets; empty = all
};

struct BundleConfig {
  std::string root_path;  // absolute: root.path joined to the bundle when relative
  bool root_readonly = false;
  std::map<std::string, std::string> annotations;
  std::map<std::string, std::string> env;  // process.env, the last of a repeated name wins
  std::vector<std::string> mount_destinations;
  std::vector<DeviceNode> devices;
  std::vector<DeviceRule> device_rules;
};

// Parses config.json text; `bundle` is the folder it came from (resolves root.path).
// Throws HookError naming the field.
BundleConfig parse_bundle_config(std::string_view text, const std::string& bundle);
// Reads and parses <bundle>/config.json (at most 16 MiB).
BundleConfig read_bundle_config(const std::string& bundle);

}  // namespace quanta::hooks
