// Read-only bind mounts into a container's rootfs from a createContainer hook, which runs in
// the container's mount namespace before pivot_root: the host's files are still visible and
// the rootfs is a folder below. Paths inside the rootfs are resolved within it (a symlink in
// an image cannot point the mount at the host), mount points are created empty when the
// image lacks them, and nothing is ever written into the image's files.
#pragma once

#include <string>

namespace quanta::hooks {

// Binds the host's `source` (a file, or a folder when `directory`) read-only, nosuid, nodev
// (and noexec for folders) at the absolute in-container path `target` under `rootfs`.
// Throws HookError naming the path and what failed.
void bind_read_only(const std::string& rootfs, const std::string& source,
                    const std::string& target, bool directory);

}  // namespace quanta::hooks
