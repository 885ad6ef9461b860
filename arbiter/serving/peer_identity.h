// Who is on the other end of a tenant connection, bound to the live process rather than
// to a pid number: a pidfd of the process that connected (SO_PEERPIDFD, Linux >= 6.5), or
// on older kernels the SO_PEERCRED pid checked against its start time and against the
// sender of each message (SCM_CREDENTIALS). A pid is acted on only while that very
// process is alive, so a connection left by a process that died never lends its identity
// to whatever process gets the pid next.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "arbiter/loop/event_loop.h"

namespace quanta::arbiter {

enum class IdentityMethod {
  kPeerPidfd,  // SO_PEERPIDFD: the kernel's reference to the connecting process
  kStartTime,  // SO_PEERCRED pid + pidfd_open + /proc/<pid>/stat start time
};

struct PeerIdentity {
  IdentityMethod method = IdentityMethod::kPeerPidfd;
  pid_t pid = 0;  // in the arbiter's pid namespace
  uid_t uid = 0;
  UniqueFd pidfd;
  uint64_t start_time = 0;  // kStartTime: clock ticks after boot, from /proc/<pid>/stat
};

// Takes the identity of the peer of an accepted socket. `allow_peer_pidfd` false forces
// the fallback (tests of older kernels). Returns false with `why` when the peer is
// already gone or cannot be identified.
bool identify_peer(int socket_fd, bool allow_peer_pidfd, PeerIdentity* out, std::string* why);

// True while the identified process runs (not exited, not a zombie, pid not reused).
bool peer_alive(const PeerIdentity& peer);

// The pid a pidfd refers to, in this namespace; -1 once it exited, 0 when unknown.
pid_t pid_of_pidfd(int pidfd);
// Field 22 of /proc/<pid>/stat (start time in clock ticks after boot); 0 when unreadable.
uint64_t process_start_time(pid_t pid);

}  // namespace quanta::arbiter
