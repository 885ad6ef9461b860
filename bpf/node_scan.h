// What `quanta-trace session` finds on a node by reading /proc, with nothing to pass on the
// command line: arbiters, processes mapping libquanta.so or libcuda.so.1, the files they map
// (by inode, whichever mount namespace they were seen through) and the shared-memory regions
// that tie a tenant to its arbiter.
#pragma once

#include <sys/types.h>

#include <compare>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace quanta::bpf {

struct FileId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  auto operator<=>(const FileId&) const = default;
};

// A file one process maps (or executes).
struct MappedFile {
  FileId id;              // the file itself (the real inode, also under overlayfs)
  std::string path;       // as the process sees it, in its own mount namespace
  std::string open_path;  // where this tracer opens it now: /proc/<pid>/map_files/<range> or
                          // /proc/<pid>/exe
};

struct ProcessScan {
  pid_t pid = 0;
  std::string comm;
  bool arbiter = false;                  // its executable is named quanta-arbiter
  std::optional<MappedFile> executable;  // set for arbiters
  std::optional<MappedFile> shim;        // libquanta.so
  std::optional<MappedFile> driver;      // libcuda.so.1 (any libcuda.so* name)
  std::set<FileId> shm;                  // files under /dev/shm it maps (Quanta's regions)
};

// Every numeric entry of /proc.
std::vector<pid_t> list_pids();

// The process's maps and executable; nullopt when it is gone or cannot be read.
std::optional<ProcessScan> scan_process(pid_t pid);

// A file no process maps yet but one soon may: `path` as seen from `root` ("/" or
// /proc/<pid>/root), nullopt when it does not exist there.
std::optional<MappedFile> file_at(const std::string& root, const std::string& path);

// Where the dynamic loader would find library `soname` for this process: LD_LIBRARY_PATH,
// then the loader cache (ldconfig -p). Existing regular files only.
std::vector<std::string> loader_paths(const std::string& soname);

// "name" of /proc/<pid>/comm, empty when gone.
std::string process_comm(pid_t pid);

}  // namespace quanta::bpf
