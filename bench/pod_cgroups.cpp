// Finding the bench's own cgroup in the hierarchy the arbiter reads, and making and removing
// a child of it per pod.
#include "bench/pod_cgroups.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bench/process.h"
#include "common/cgroup.h"

namespace quanta::bench {

namespace {

namespace fs = std::filesystem;

// One line of /proc/<pid>/cgroup: "ID:CONTROLLERS:PATH" (the path may hold ':').
struct CgroupLine {
  std::string id;
  std::string controllers;
  std::string path;
  bool unified() const { return id == "0" && controllers.empty(); }
};

std::optional<CgroupLine> split_cgroup_line(const std::string& line) {
  const size_t a = line.find(':');
  const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
  if (b == std::string::npos) return std::nullopt;
  return CgroupLine{line.substr(0, a), line.substr(a + 1, b - a - 1), line.substr(b + 1)};
}

// Whether a comma list (v1 controllers, mount options) names `name`.
bool lists(const std::string& commas, const std::string& name) {
  std::istringstream names(commas);
  for (std::string item; std::getline(names, item, ',');)
    if (item == name) return true;
  return false;
}

// One hierarchy the bench's cgroup can be reached in.
struct Hierarchy {
  std::string kind;  // "cgroup v2" | "cgroup v1 memory"
  std::string dir;   // the bench's own cgroup as a directory
  std::string path;  // ... as /proc/self/cgroup shows it
  bool unified = false;
};

// "ID:CONTROLLERS:PATH" lines: the unified path and the memory controller's.
struct OwnPaths {
  std::optional<std::string> unified;
  std::optional<std::string> memory;
};

OwnPaths own_paths(const std::string& text) {
  OwnPaths out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::optional<CgroupLine> cgroup = split_cgroup_line(line);
    if (!cgroup || cgroup->path.empty() || cgroup->path[0] != '/') continue;
    if (cgroup->unified()) {
      out.unified = cgroup->path;
    } else if (lists(cgroup->controllers, "memory")) {
      out.memory = cgroup->path;
    }
  }
  return out;
}

// The directory of cgroup `path` in a hierarchy mounted at `mountpoint` whose root there
// is `root` (mountinfo's fourth field); "" when the mount does not reach it.
std::string under_mount(const std::string& mountpoint, const std::string& root,
                        const std::string& path) {
  if (root == "/") return path == "/" ? mountpoint : mountpoint + path;
  if (path == root) return mountpoint;
  if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
      path[root.size()] == '/') {
    return mountpoint + path.substr(root.size());
  }
  return "";
}

// Where the bench's cgroup can be found, v2 first.
std::vector<Hierarchy> own_hierarchies() {
  const OwnPaths own = own_paths(read_file("/proc/self/cgroup"));
  std::optional<Hierarchy> v2, memory;
  std::istringstream lines(read_file("/proc/self/mountinfo"));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream left(line.substr(0, dash));
    std::istringstream right(line.substr(dash + 3));
    std::string id, parent, device, root, mountpoint, fstype, source, options;
    if (!(left >> id >> parent >> device >> root >> mountpoint) ||
        !(right >> fstype >> source >> options))
      continue;
    if (fstype == "cgroup2" && own.unified && !v2) {
      const std::string dir = under_mount(mountpoint, root, *own.unified);
      if (!dir.empty()) v2 = Hierarchy{"cgroup v2", dir, *own.unified, true};
    } else if (fstype == "cgroup" && own.memory && !memory) {
      const std::string dir =
          lists(options, "memory") ? under_mount(mountpoint, root, *own.memory) : "";
      if (!dir.empty()) memory = Hierarchy{"cgroup v1 memory", dir, *own.memory, false};
    }
  }
  std::vector<Hierarchy> out;
  if (v2) out.push_back(*v2);
  if (memory) out.push_back(*memory);
  return out;
}

// Whether a process moved from our cgroup to `child` (in `h`) would be named `child` by
// the arbiter's rule: our /proc/self/cgroup with that one line changed.
bool arbiter_would_see(const Hierarchy& h, const std::string& child) {
  std::istringstream lines(read_file("/proc/self/cgroup"));
  std::string line, moved;
  while (std::getline(lines, line)) {
    const std::optional<CgroupLine> cgroup = split_cgroup_line(line);
    if (cgroup && (h.unified ? cgroup->unified() : lists(cgroup->controllers, "memory")))
      line = cgroup->id + ":" + cgroup->controllers + ":" + child;
    moved += line + "\n";
  }
  return common::container_cgroup_path(moved) == child;
}

std::string joined(const std::string& path, const std::string& name) {
  return (path == "/" ? "" : path) + "/" + name;
}

// Moves what is left in cgroup `dir` back to `home`, then removes it (a cgroup with
// processes cannot be removed; a process that just exited may take a moment to leave).
bool remove_cgroup(const std::string& dir, const std::string& home) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (rmdir(dir.c_str()) == 0 || errno == ENOENT) return true;
    if (errno != EBUSY) return false;
    std::istringstream procs(read_file(dir + "/cgroup.procs"));
    for (std::string pid; procs >> pid;) {
      std::ofstream back(home + "/cgroup.procs");
      back << pid << std::flush;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void remove_run(const std::string& run_dir, const std::string& home) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(run_dir, error)) {
    if (entry.is_directory(error) && !remove_cgroup(entry.path().string(), home)) {
      spdlog::warn("cannot remove cgroup {}: {}", entry.path().string(), std::strerror(errno));
    }
  }
  if (!remove_cgroup(run_dir, home))
    spdlog::warn("cannot remove cgroup {}: {}", run_dir, std::strerror(errno));
}

}  // namespace

PodCgroups::PodCgroups(const std::string& run_name) {
  std::string tried;
  for (const Hierarchy& h : own_hierarchies()) {
    const std::string dir = h.dir + "/" + run_name;
    const std::string path = joined(h.path, run_name);
    std::string why;
    if (!arbiter_would_see(h, joined(path, "pod"))) {
      why = "the arbiter would place its processes by another hierarchy";
    } else if (mkdir(dir.c_str(), 0755) != 0) {
      why = std::strerror(errno);
    } else {
      home_dir_ = h.dir;
      run_dir_ = dir;
      run_path_ = path;
      return;
    }
    tried += (tried.empty() ? "" : "; ") + h.kind + " at " + dir + ": " + why;
  }
  throw std::runtime_error(
      "cannot make a cgroup for each pod, which the arbiter needs to tell the pods apart (" +
      (tried.empty()
           ? std::string(
                 "no cgroup v2 mount and no v1 memory controller reaches this process's cgroup")
           : tried) +
      "); run quanta-bench as root with a writable cgroup mount");
}

PodCgroups::~PodCgroups() {
  remove_run(run_dir_, home_dir_);
}

const PodCgroup& PodCgroups::of(const std::string& pod) {
  auto found = pods_.find(pod);
  if (found != pods_.end()) return found->second;
  // Pod names are the bench's own, but a cgroup name must be one path component.
  std::string name = std::to_string(pods_.size()) + "-";
  for (char c : pod.substr(0, 64))
    name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  const std::string dir = run_dir_ + "/" + name;
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw std::runtime_error("cannot make cgroup " + dir + " for pod " + pod + ": " +
                             std::strerror(errno));
  }
  return pods_.emplace(pod, PodCgroup{joined(run_path_, name), dir + "/cgroup.procs"})
      .first->second;
}

void PodCgroups::sweep(const std::function<bool(const std::string&)>& stale) {
  for (const Hierarchy& h : own_hierarchies()) {
    std::error_code error;
    std::vector<std::string> runs;
    for (const auto& entry : fs::directory_iterator(h.dir, error)) {
      if (entry.is_directory(error) && stale(entry.path().filename().string()))
        runs.push_back(entry.path().string());
    }
    for (const std::string& run : runs) remove_run(run, h.dir);
  }
}

}  // namespace quanta::bench
