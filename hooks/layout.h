// Where Quanta's files are, on the host (under the install prefix, default /opt/quanta) and
// inside every GPU container, and the small settings files the shim reads there. One list
// of mounts serves the CDI spec, the hooks.d form (which mounts them from the hook) and the
// tests; docs/containers.md shows it.
#pragma once

#include <string>
#include <vector>

#include "config/node_config.h"

namespace quanta::hooks {

// In-container paths; fixed whatever the host prefix. /etc/quanta is the host's
// <prefix>/etc, read-only: node.conf, and container.conf, over which quanta-hook mounts each
// container's own (the file there is a placeholder, so the mount point exists even in a
// read-only image).
inline constexpr const char* kContainerLibrary = "/opt/quanta/lib/libquanta.so";
inline constexpr const char* kContainerPreload = "/etc/ld.so.preload";
inline constexpr const char* kContainerEtc = "/etc/quanta";
inline constexpr const char* kContainerNodeConf = "/etc/quanta/node.conf";
inline constexpr const char* kContainerConf = "/etc/quanta/container.conf";
inline constexpr const char* kContainerSocketDir = "/run/quanta";

// The file createRuntime writes into the bundle (host side) and createContainer mounts.
inline constexpr const char* kBundleContainerConf = "quanta-container.conf";

// The whole environment of every hook the spec and hooks.d files name. Never absent: runc
// runs a hook with no `env` in the container's environment, before pivot_root, with the
// image's rootfs as working directory. The hook needs nothing from its environment (the
// node config and the arbiter say everything); bin/quanta-hook discards whatever a runtime
// passes anyway (hooks/launcher.c).
inline std::vector<std::string> hook_environment() {
  return {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
}

struct Layout {
  std::string prefix = "/opt/quanta";
  std::string host_socket = "/run/quanta/tenant.sock";  // the arbiter's tenant socket
  std::string config = "/etc/quanta/quanta.toml";       // the node config the hook reads

  std::string hook_binary() const { return prefix + "/bin/quanta-hook"; }
  std::string library() const { return prefix + "/lib/libquanta.so"; }
  std::string etc() const { return prefix + "/etc"; }
  std::string node_conf() const { return prefix + "/etc/node.conf"; }
  std::string preload() const { return prefix + "/etc/ld.so.preload"; }
  std::string container_conf_placeholder() const { return prefix + "/etc/container.conf"; }
  std::string host_socket_dir() const;
  // The tenant socket's path inside containers (the shim's `socket` setting).
  std::string container_socket() const;
};

struct QuantaMount {
  std::string host;
  std::string container;
  bool directory = false;
  std::vector<std::string> options;  // OCI/CDI mount options
};

// libquanta.so, the preload list over /etc/ld.so.preload, <prefix>/etc at /etc/quanta, and
// the tenant socket's folder (a folder, so an arbiter restart's new socket shows in running
// containers), each read-only.
std::vector<QuantaMount> quanta_mounts(const Layout& layout);

// /etc/quanta/node.conf: the node's enforcement settings for every shim.
std::string node_conf_text(const config::NodeConfig& config, const Layout& layout);
// The preload list: the library's in-container path.
std::string preload_text();
// <prefix>/etc/container.conf, what a container sees when no hook mounted its own.
std::string container_conf_placeholder_text();
// /etc/quanta/container.conf: this container's pod, whether it is capped, and the node's
// unplaced rule resolved for it.
std::string container_conf_text(const std::string& container_id, const std::string& pod_key,
                                 bool capped, bool closed);
// "open" or "closed": what the node's [enforce] unplaced means for a pod.
bool unplaced_closed(const config::NodeConfig& config, bool capped);

// Writes `text` to `path` through a temporary file and rename(2), so a reader (a runtime
// loading CDI specs) never sees half a file. Creates the folder. Throws HookError.
void write_file_atomically(const std::string& path, const std::string& text, unsigned mode);

}  // namespace quanta::hooks
