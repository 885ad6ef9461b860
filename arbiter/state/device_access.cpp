// Device grants from registrations, cgroup v1 device lists and /dev nodes.
#include "arbiter/state/device_access.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <fstream>
#include <sstream>

namespace quanta::arbiter {
namespace {

constexpr unsigned kNvidiaMajor = 195;

void add_minor(DeviceGrant* grant, int minor, const std::vector<GpuInfo>& gpus) {
  for (const GpuInfo& g : gpus) {
    if (g.minor >= 0 && g.minor == minor) grant->uuids.insert(g.uuid);
  }
}

bool minors_known(const std::vector<GpuInfo>& gpus) {
  for (const GpuInfo& g : gpus) {
    if (g.minor < 0) return false;
  }
  return !gpus.empty();
}

std::string devices_cgroup_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "5:devices:/kubepods/…"
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    std::string controllers = line.substr(first + 1, second - first - 1);
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) {
      if (name == "devices") return line.substr(second + 1);
    }
  }
  return "";
}

// True when the process's /dev is a tmpfs or devtmpfs, which is safe to list from the
// event loop (a FUSE /dev would make every lookup wait for its server).
bool dev_is_tmpfs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/mountinfo");
  std::string line;
  std::string type;
  while (std::getline(in, line)) {
    // "id parent major:minor root mountpoint options ... - fstype source superoptions"
    std::istringstream fields(line);
    std::string id, parent, devno, root, mountpoint;
    if (!(fields >> id >> parent >> devno >> root >> mountpoint)) continue;
    if (mountpoint != "/dev") continue;
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream rest(line.substr(dash + 3));
    rest >> type;  // the last mount on /dev wins, as it does in the process
  }
  return type == "tmpfs" || type == "devtmpfs";
}

}  // namespace

DeviceGrant devices_listed(const std::vector<std::string>& listed,
                           const std::vector<GpuInfo>& gpus) {
  DeviceGrant grant;
  grant.source = "its registration";
  for (const std::string& d : listed) {
    for (const GpuInfo& g : gpus) {
      if (g.uuid == d || g.parent == d) grant.uuids.insert(g.uuid);
    }
  }
  return grant;
}

DeviceGrant devices_in_cgroup_list(const std::string& devices_list,
                                   const std::vector<GpuInfo>& gpus) {
  DeviceGrant grant;
  grant.source = "its device cgroup";
  std::istringstream lines(devices_list);
  std::string line;
  while (std::getline(lines, line)) {
    // "a *:* rwm", "c 195:0 rw", "c 195:* m"
    std::istringstream fields(line);
    std::string type, numbers, access;
    if (!(fields >> type >> numbers >> access)) continue;
    if (access.find('r') == std::string::npos && access.find('w') == std::string::npos) continue;
    if (type == "a") {
      grant.all = true;
      return grant;
    }
    if (type != "c") continue;
    const auto colon = numbers.find(':');
    if (colon == std::string::npos) continue;
    const std::string major = numbers.substr(0, colon);
    const std::string minor = numbers.substr(colon + 1);
    if (major != "*" && major != std::to_string(kNvidiaMajor)) continue;
    if (minor == "*") {
      for (const GpuInfo& g : gpus) grant.uuids.insert(g.uuid);
      continue;
    }
    if (minor.empty() || minor.size() > 6 ||
        minor.find_first_not_of("0123456789") != std::string::npos)
      continue;
    add_minor(&grant, std::stoi(minor), gpus);
  }
  return grant;
}

DeviceGrant devices_granted(const Registration* reg, pid_t pid, const std::vector<GpuInfo>& gpus) {
  if (reg == nullptr) {
    DeviceGrant all;
    all.all = true;
    all.source = "an unregistered development process";
    return all;
  }
  if (!reg->devices.empty()) return devices_listed(reg->devices, gpus);
  if (!minors_known(gpus)) {
    // Without NVML's minor numbers no device node or cgroup rule can name a GPU.
    DeviceGrant all;
    all.all = true;
    all.source = "no device list in its registration (and NVML gives no minor numbers)";
    return all;
  }
  const std::string cgroup = devices_cgroup_of(pid);
  if (!cgroup.empty()) {
    std::ifstream in("/sys/fs/cgroup/devices" + cgroup + "/devices.list");
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      return devices_in_cgroup_list(text.str(), gpus);
    }
  }
  DeviceGrant grant;
  grant.source = "the NVIDIA device nodes in its /dev";
  const std::string dev = "/proc/" + std::to_string(pid) + "/root/dev";
  DIR* d = dev_is_tmpfs(pid) ? opendir(dev.c_str()) : nullptr;
  if (d != nullptr) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("nvidia", 0) != 0 || name.size() == 6 ||
          name.find_first_not_of("0123456789", 6) != std::string::npos)
        continue;
      struct stat st {};
      if (lstat((dev + "/" + name).c_str(), &st) != 0 || !S_ISCHR(st.st_mode) ||
          major(st.st_rdev) != kNvidiaMajor)
        continue;
      add_minor(&grant, static_cast<int>(minor(st.st_rdev)), gpus);
    }
    closedir(d);
  }
  return grant;
}

}  // namespace quanta::arbiter
