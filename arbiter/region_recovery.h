// Finding a previous arbiter's regions after a restart. They are memfds, so the only
// handles left are the mappings in its tenants: for each pid the state file recorded, the
// memfds named "<scope>.*" it maps are listed from /proc/<pid>/maps and reopened through
// /proc/<pid>/map_files (root with CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE). Reading
// another process's maps waits for its memory-map lock, which a hostile process could hold,
// so the scan runs on a helper thread and the start-up goes on without it after a deadline.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "arbiter/event_loop.h"

namespace quanta::arbiter {

struct FoundRegion {
  std::string name;    // memfd name ("<scope>.pod.3")
  uint64_t inode = 0;  // as /proc/<pid>/maps shows it
  pid_t pid = 0;       // a process that maps it
  UniqueFd fd;         // reopened read-write (pod) or read-only (control); empty if that failed
};

struct RecoveryScan {
  // One entry per distinct memfd inode, with the first pid that maps it.
  std::map<uint64_t, FoundRegion> regions;
  // For every scanned pid, the inodes of the "<scope>.*" memfds it maps.
  std::map<pid_t, std::set<uint64_t>> mapped_by;
  // Pids whose maps could not be read before the deadline (the start-up went on).
  std::vector<pid_t> unanswered;
};

// Parses /proc/<pid>/maps text: the (inode, memfd name) of each mapping named
// "/memfd:<scope>.<rest> (deleted)", with its address range "start-end". Pure.
struct MemfdMapping {
  std::string range;
  uint64_t inode = 0;
  std::string name;
};
std::vector<MemfdMapping> memfd_mappings(const std::string& maps_text, const std::string& scope);

// Scans `pids` (a pid that no longer exists is skipped) within `deadline_ms`.
RecoveryScan scan_tenant_mappings(const std::string& scope, const std::vector<pid_t>& pids,
                                  int deadline_ms);

}  // namespace quanta::arbiter
