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

#include "arbiter/loop/event_loop.h"
#include "common/shm_layout.h"

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

// The region the state file recorded (`inode`, 0 when it recorded none) under `name`, as a
// tenant still maps it and it was reopened; nullptr otherwise. Nothing else a tenant maps
// is ever looked at.
FoundRegion* recorded_region(RecoveryScan& scan, uint64_t inode, const std::string& name);

// What a restarted arbiter does with a process entry of a pod region it re-adopts. The entry
// is tenant-writable, so it is adopted only for a process the state file recorded in this
// pod that is alive, not adopted already, and maps this very region; one recorded but whose
// maps could not be read in time keeps its memory counted (never under) until it is known;
// anything else is dead or forged, and its memory goes back to this pod alone.
enum class EntryFate {
  kAdopt,        // a process of the pod again, with its slots to carry over
  kKeepCounted,  // its entry and memory kept, the process admitted afresh when it reconnects
  kReclaim,      // its entry cleared, its memory returned to the pod's ledger
};
struct EntryFacts {
  bool recorded = false;         // the state file lists the pid in this pod
  bool unanswered = false;       // its maps were not read before the scan's deadline
  bool alive = false;            // a pidfd to it opened (asked only of a recorded pid)
  bool adopted_already = false;  // another pod's entry took it first
  bool maps_region = false;      // the scan found it mapping this pod's region
};
EntryFate entry_fate(const EntryFacts& facts);

// Each slot of a previous control region whose owner word is set, by that word: a re-adopted
// process gets the slot whose owner word is its own (slot_owner.h), so no tenant chooses
// which slot, or whose grant, it inherits. A word two slots carry names the first.
std::map<uint32_t, uint32_t> slots_by_owner(const common::ControlRegion& previous);

}  // namespace quanta::arbiter
