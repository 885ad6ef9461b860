// /proc readers for node discovery. A mapped file is opened through
// /proc/<pid>/map_files/<range>, which reaches the very file the process mapped even when
// it lives in another mount namespace, under an overlayfs, or was deleted since.
#include "bpf/node_scan.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace quanta::bpf {
namespace {

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

std::optional<FileId> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

// "fd:01" and an inode number from a maps line, as one id (only compared with its kind).
FileId maps_id(const std::string& dev, uint64_t inode) {
  const auto colon = dev.find(':');
  uint64_t major = std::strtoull(dev.substr(0, colon).c_str(), nullptr, 16);
  uint64_t minor =
      colon == std::string::npos ? 0 : std::strtoull(dev.c_str() + colon + 1, nullptr, 16);
  return FileId{(major << 32) | minor, inode};
}

}  // namespace

std::vector<pid_t> list_pids() {
  std::vector<pid_t> pids;
  DIR* dir = ::opendir("/proc");
  if (!dir) return pids;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end != entry->d_name && *end == '\0' && pid > 0) pids.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  return pids;
}

std::string process_comm(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

std::optional<MappedFile> file_at(const std::string& root, const std::string& path) {
  const std::string open_path = (root == "/" ? std::string() : root) + path;
  struct stat st {};
  if (::stat(open_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return MappedFile{FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)},
                    path, open_path};
}

std::vector<std::string> loader_paths(const std::string& soname) {
  std::vector<std::string> paths;
  auto add = [&](const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        std::find(paths.begin(), paths.end(), path) == paths.end())
      paths.push_back(path);
  };
  if (const char* dirs = std::getenv("LD_LIBRARY_PATH")) {
    std::stringstream list(dirs);
    std::string dir;
    while (std::getline(list, dir, ':')) {
      if (!dir.empty()) add(dir + "/" + soname);
    }
  }
  // The loader cache: "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1".
  for (const char* ldconfig : {"/sbin/ldconfig", "/usr/sbin/ldconfig"}) {
    if (::access(ldconfig, X_OK) != 0) continue;
    const std::string command = std::string(ldconfig) + " -p 2>/dev/null";
    if (FILE* out = ::popen(command.c_str(), "r")) {
      char line[4096];
      while (std::fgets(line, sizeof line, out)) {
        std::string text(line);
        const auto arrow = text.find(" => ");
        if (text.find(soname + " ") == std::string::npos || arrow == std::string::npos) continue;
        std::string path = text.substr(arrow + 4);
        while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
        add(path);
      }
      ::pclose(out);
    }
    break;
  }
  return paths;
}

std::optional<ProcessScan> scan_process(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream maps(proc + "/maps");
  if (!maps) return std::nullopt;
  ProcessScan scan;
  scan.pid = pid;
  scan.comm = process_comm(pid);

  char exe[4096];
  const ssize_t n = ::readlink((proc + "/exe").c_str(), exe, sizeof exe - 1);
  if (n > 0) {
    std::string path(exe, static_cast<size_t>(n));
    const std::string deleted = " (deleted)";
    if (path.size() > deleted.size() &&
        path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
      path.resize(path.size() - deleted.size());
    if (basename_of(path) == "quanta-arbiter") {
      if (auto id = file_id(proc + "/exe")) {
        scan.arbiter = true;
        scan.executable = MappedFile{*id, path, proc + "/exe"};
      }
    }
  }

  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev;
    uint64_t inode = 0;
    fields >> range >> perms >> offset >> dev >> inode;
    std::string path;
    std::getline(fields >> std::ws, path);
    if (inode == 0 || path.empty() || path[0] != '/') continue;
    const std::string deleted = " (deleted)";
    if (path.size() > deleted.size() &&
        path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
      path.resize(path.size() - deleted.size());
    if (starts_with(path, "/dev/shm/")) {
      scan.shm.insert(maps_id(dev, inode));
      continue;
    }
    const std::string name = basename_of(path);
    std::optional<MappedFile>* slot = nullptr;
    if (starts_with(name, "libquanta.so")) {
      slot = &scan.shim;
    } else if (starts_with(name, "libcuda.so")) {
      slot = &scan.driver;
    }
    if (!slot || slot->has_value()) continue;
    const std::string open_path = proc + "/map_files/" + range;
    if (auto id = file_id(open_path)) *slot = MappedFile{*id, path, open_path};
  }
  return scan;
}

}  // namespace quanta::bpf
