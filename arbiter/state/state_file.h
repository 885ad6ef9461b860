// The arbiter's state file (<state_dir>/<scope>.state.json): registrations, live policy
// overrides, the generation, the key of the control slots' owner words, and for each pod
// region and control region what a restarted arbiter needs to find it again in its
// tenants' mappings (inode, recovery tag, the pids that map it, the cgroup that claimed it). Parsing is pure and entry by entry: a
// malformed entry is dropped with a warning and every other entry kept (fuzzed).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/state/registration.h"

namespace quanta::arbiter {

struct SavedPod {
  std::string key;
  uint64_t inode = 0;         // the pod region memfd's inode
  uint64_t recovery_tag = 0;  // PodHeader::recovery_tag
  std::vector<pid_t> pids;    // processes admitted into it
  // The cgroup that claimed it ("" for a registered pod): a restart keeps counting the pod
  // against that cgroup's bound on unregistered pods.
  std::string claimed_from;
  bool operator==(const SavedPod&) const = default;
};

struct SavedGpu {
  std::string uuid;
  // The inodes of its control region memfds, one per layout in use: the layout-2 region
  // first when it has one (the file's "inode", which releases that read one region read)
  // and all of them in "inodes".
  std::vector<uint64_t> inodes;
  bool operator==(const SavedGpu&) const = default;
};

struct SavedState {
  uint64_t generation = 0;
  std::vector<Registration> registrations;
  std::map<std::string, std::map<std::string, std::string>> overrides;
  std::map<uint32_t, SavedPod> pods;  // by pod region index
  std::map<uint32_t, SavedGpu> gpus;  // by GPU index
  std::string slot_key;               // the control slots' owner key (slot_owner.h), hex
  bool operator==(const SavedState&) const = default;
};

// Never throws. Each entry that cannot be read adds one line to `warnings` and is left out.
SavedState parse_state(std::string_view text, std::vector<std::string>* warnings);
// Never throws; text that is not UTF-8 is replaced, so one bad name cannot stop a save.
std::string render_state(const SavedState& state);
// One registration as the file's "registrations" list holds it: a JSON object on one line.
std::string render_registration(const Registration& r);
// The file with `registration_texts` (render_registration of each) as its registrations,
// state.registrations unused: the registry renders a registration once, when it is made,
// so a save of thousands of them copies text instead of rendering each again.
std::string render_state(const SavedState& state,
                         const std::vector<std::string_view>& registration_texts);

}  // namespace quanta::arbiter
