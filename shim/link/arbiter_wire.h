// The tenant side of the arbiter's socket and regions: connecting, one message out, one
// message in with the file descriptors that travel with it, and mapping the regions those
// descriptors name after checking magic, version and size. Stateless; session.cpp owns the
// connection and decides what a failure means (always: run ungated, log once).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/shm_layout.h"
#include "common/wire.h"

namespace quanta::shim {

// Which file a descriptor refers to, so a reconnect can tell a re-adopted region (same
// file: keep the mapping) from a new one (remap).
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
};

// Any message the arbiter sends a tenant, received into one buffer and told apart by type.
union ArbiterReply {
  common::MessageHeader header;
  common::WelcomeMessage welcome;
  common::RefusedMessage refused;
  common::AttachedMessage attached;
  common::AttachFailedMessage attach_failed;
};

// Connects a SOCK_SEQPACKET|SOCK_CLOEXEC socket to `path` with send and receive timeouts,
// so a hung arbiter can never hang a CUDA call for long. -1 with errno on failure.
int wire_connect(const char* path) noexcept;

// Sends one whole message. False on any failure (errno set).
bool wire_send(int socket_fd, const void* message, size_t size) noexcept;

// Receives one message into `buffer` (zeroed first). Descriptors that arrive land in
// `fds` (close-on-exec); those beyond `max_fds` are closed. Returns the bytes received,
// 0 on end of stream, -1 on error or timeout.
long wire_receive(int socket_fd, void* buffer, size_t capacity, int* fds, int max_fds,
                  int* fd_count) noexcept;

// True when a received message has our magic and version, a type we know and exactly the
// size that type has.
bool wire_message_valid(const common::MessageHeader& header, long received) noexcept;

// Closes every descriptor in fds[0..count).
void close_all(const int* fds, int count) noexcept;

bool file_identity(int fd, FileIdentity* out) noexcept;

// Maps a control region read-only after checking the file is large enough and its header
// carries our magic, version and size. nullptr (and a reason) otherwise; never unmapped.
const common::ControlRegion* map_control_region(int fd, const char** why) noexcept;

// Maps a pod region read-write with the same checks.
common::PodRegion* map_pod_region(int fd, const char** why) noexcept;

}  // namespace quanta::shim
