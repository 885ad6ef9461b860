// Paths inside the rootfs walked component by component with O_NOFOLLOW (symlinks resolved
// against the image's root by hand), then the fd-based mount API (open_tree, mount_setattr,
// move_mount: read-only from the moment it appears, Linux 5.12), or on older kernels
// mount(MS_BIND) followed by a read-only remount.
#include "hooks/container_mounts.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hooks/error.h"
#include "hosted/errno_text.h"
#include "hosted/unique_fd.h"

namespace quanta::hooks {
namespace {

// The mount API's ABI, spelled here so the build does not depend on the libc's headers
// (the syscall numbers are the same on every architecture).
constexpr long kSysOpenTree = 428;
constexpr long kSysMoveMount = 429;
constexpr long kSysMountSetattr = 442;
constexpr unsigned kOpenTreeClone = 1;
constexpr unsigned kMoveMountFromEmptyPath = 0x04;
constexpr unsigned kMoveMountToEmptyPath = 0x40;
constexpr uint64_t kAttrReadOnly = 0x1, kAttrNoSuid = 0x2, kAttrNoDev = 0x4, kAttrNoExec = 0x8;
struct MountAttr {
  uint64_t attr_set;
  uint64_t attr_clr;
  uint64_t propagation;
  uint64_t userns_fd;
};

using hosted::errno_text;
using Fd = hosted::UniqueFd;

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (!part.empty() && part != ".") parts.push_back(part);
    start = end + 1;
  }
  return parts;
}

// A read-only rootfs (readOnlyRootFilesystem; crun applies it before createContainer hooks)
// made writable on the container's own rootfs mount while a missing mount point is created,
// with its other flags kept, as runtimes do for their own mounts. Only the container's mount
// namespace sees it, and only until the hook's mount is in place.
class RootfsWritable {
 public:
  explicit RootfsWritable(std::string rootfs) : rootfs_(std::move(rootfs)) {}
  ~RootfsWritable() {
    if (lifted_) mount(nullptr, rootfs_.c_str(), nullptr, flags_ | MS_RDONLY, nullptr);
  }
  RootfsWritable(const RootfsWritable&) = delete;
  RootfsWritable& operator=(const RootfsWritable&) = delete;

  // True when the rootfs was read-only and now is not.
  bool lift() {
    if (lifted_) return false;
    struct statvfs st {};
    if (statvfs(rootfs_.c_str(), &st) != 0 || (st.f_flag & ST_RDONLY) == 0) return false;
    flags_ = MS_BIND | MS_REMOUNT;
    if (st.f_flag & ST_NOSUID) flags_ |= MS_NOSUID;
    if (st.f_flag & ST_NODEV) flags_ |= MS_NODEV;
    if (st.f_flag & ST_NOEXEC) flags_ |= MS_NOEXEC;
    lifted_ = mount(nullptr, rootfs_.c_str(), nullptr, flags_, nullptr) == 0;
    return lifted_;
  }

 private:
  std::string rootfs_;
  unsigned long flags_ = 0;
  bool lifted_ = false;
};

// The mount point at `target` under `root`, created (empty) when missing. The path is
// walked one component at a time without following anything: a symlink in the image is
// read and its target walked from the image's root (absolute) or its own folder, and ".."
// stops at the image's root, the way the container itself will see the path.
Fd mount_point(int root, const std::string& rootfs, const std::string& target, bool directory) {
  RootfsWritable writable(rootfs);
  auto create = [&writable](auto op) {
    int rc = op();
    if (rc < 0 && errno == EROFS && writable.lift()) rc = op();
    return rc;
  };
  std::vector<std::string> pending = components(target);
  if (pending.empty()) throw HookError("mount target " + target + " is the container's root");
  std::vector<Fd> stack;  // the folders walked, from the root down
  stack.emplace_back(::dup(root));
  std::string where;  // for messages
  int links = 0;
  while (!pending.empty()) {
    const std::string part = pending.front();
    pending.erase(pending.begin());
    const bool leaf = pending.empty();
    if (part == "..") {
      if (stack.size() > 1) stack.pop_back();
      continue;
    }
    const int dir = stack.back().get();
    struct stat st {};
    if (fstatat(dir, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT)
        throw HookError("cannot look at " + rootfs + where + "/" + part + ": " + errno_text(errno));
      const int made = create([&] {
        return leaf && !directory
                   ? openat(dir, part.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)
                   : mkdirat(dir, part.c_str(), 0755);
      });
      if (made < 0)
        throw HookError("cannot create " + rootfs + where + "/" + part + " for the mount point of " +
                        target + ": " + errno_text(errno));
      if (leaf && !directory) ::close(made);
      if (fstatat(dir, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        throw HookError("cannot look at " + rootfs + where + "/" + part + ": " + errno_text(errno));
    }
    if (S_ISLNK(st.st_mode)) {
      if (++links > 40) throw HookError("too many symlinks in the image on the way to " + target);
      char link[4096] = {};
      const ssize_t n = readlinkat(dir, part.c_str(), link, sizeof(link) - 1);
      if (n <= 0) throw HookError("cannot read the symlink " + rootfs + where + "/" + part);
      std::vector<std::string> rest = components(std::string(link, static_cast<size_t>(n)));
      rest.insert(rest.end(), pending.begin(), pending.end());
      pending = rest;
      if (link[0] == '/') {
        stack.resize(1);
        where.clear();
      }
      continue;
    }
    where += "/" + part;
    if (leaf) {
      if (directory ? !S_ISDIR(st.st_mode) : S_ISDIR(st.st_mode))
        throw HookError("the image has " + target + " as " +
                        (directory ? "something other than a folder" : "a folder") +
                        ": cannot mount Quanta's " + (directory ? "folder" : "file") + " there");
      Fd point(openat(dir, part.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC | (directory ? O_DIRECTORY : 0)));
      if (point.get() < 0)
        throw HookError("cannot open the mount point " + rootfs + where + ": " + errno_text(errno));
      return point;
    }
    if (!S_ISDIR(st.st_mode))
      throw HookError("the image has " + where + " as a file, on the way to the mount point " + target);
    Fd next(openat(dir, part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0) throw HookError("cannot open " + rootfs + where + ": " + errno_text(errno));
    stack.push_back(std::move(next));
  }
  throw HookError("mount target " + target + " resolves to the container's root");
}

}  // namespace

void bind_read_only(const std::string& rootfs, const std::string& source,
                    const std::string& target, bool directory) {
  Fd root(::open(rootfs.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root.get() < 0)
    throw HookError("cannot open the container's rootfs " + rootfs + ": " + errno_text(errno));
  struct stat src {};
  if (stat(source.c_str(), &src) != 0)
    throw HookError("cannot mount " + source + " at " + target + ": " + errno_text(errno));
  if (directory != S_ISDIR(src.st_mode))
    throw HookError("cannot mount " + source + " at " + target + ": it is not a " +
                    (directory ? "folder" : "file"));
  Fd point = mount_point(root.get(), rootfs, target, directory);
  const uint64_t attrs =
      kAttrReadOnly | kAttrNoSuid | kAttrNoDev | (directory ? kAttrNoExec : 0);

  Fd tree(static_cast<int>(
      syscall(kSysOpenTree, AT_FDCWD, source.c_str(), kOpenTreeClone | O_CLOEXEC)));
  if (tree.get() >= 0) {
    MountAttr attr{attrs, 0, 0, 0};
    if (syscall(kSysMountSetattr, tree.get(), "", AT_EMPTY_PATH, &attr, sizeof(attr)) == 0) {
      if (syscall(kSysMoveMount, tree.get(), "", point.get(), "",
                  kMoveMountFromEmptyPath | kMoveMountToEmptyPath) == 0)
        return;
      throw HookError("cannot mount " + source + " at " + target + ": " + errno_text(errno));
    }
    if (errno != ENOSYS)
      throw HookError("cannot make the mount of " + source + " read-only: " + errno_text(errno));
  } else if (errno != ENOSYS) {
    throw HookError("cannot mount " + source + " at " + target + ": " + errno_text(errno));
  }

  // Kernels before 5.12: bind, then remount read-only through the path the fd now names.
  const std::string via = "/proc/self/fd/" + std::to_string(point.get());
  char resolved[4096] = {};
  const ssize_t len = readlink(via.c_str(), resolved, sizeof(resolved) - 1);
  if (len <= 0) throw HookError("cannot resolve the mount point " + rootfs + target);
  if (mount(source.c_str(), via.c_str(), nullptr, MS_BIND, nullptr) != 0)
    throw HookError("cannot mount " + source + " at " + target + ": " + errno_text(errno));
  unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV;
  if (directory) flags |= MS_NOEXEC;
  if (mount(nullptr, resolved, nullptr, flags, nullptr) != 0) {
    const int err = errno;
    umount2(resolved, MNT_DETACH);
    throw HookError("cannot make the mount of " + source + " at " + target +
                    " read-only: " + errno_text(err));
  }
}

}  // namespace quanta::hooks
