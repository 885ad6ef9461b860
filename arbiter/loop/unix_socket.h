// Unix-socket plumbing shared by the tenant and admin servers and quantactl: listening
// sockets with a mode, and packets carrying descriptors (SCM_RIGHTS); peers are identified
// in peer_identity.h.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "arbiter/loop/event_loop.h"

namespace quanta::arbiter {

// Binds and listens on `path` (creating its folder), chmods it to `mode`. A stale socket
// file is replaced; one another process still serves is an error.
UniqueFd listen_unix(const std::string& path, int type, unsigned mode);
UniqueFd connect_unix(const std::string& path, int type);

// Where a path leads now (device and inode; zeros when nothing is there), so a server
// notices that its socket file was removed or replaced and listens there again.
struct PathIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const PathIdentity&) const = default;
};
PathIdentity path_identity(const std::string& path);
// One packet with optional descriptors; false when the peer is gone.
bool send_with_fds(int fd, const void* data, size_t len, const std::vector<int>& fds);

}  // namespace quanta::arbiter
