// The e2e harness: real containers on simgpu. It installs Quanta into a private prefix,
// generates the CDI spec with the real quanta-hook, assembles an image without libstdc++,
// writes OCI bundles with a CDI spec's edits applied (as a CDI-aware engine would; podman
// proves the real CDI library does the same in cdi_consumer_test.cpp), and runs them under
// real runc or crun. Everything lives in the test's World (tests/integration/harness.h):
// its arbiter, simgpu state and temp dir.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace quanta::e2e {

using integration::Child;
using integration::World;

enum class Runtime { kRunc, kCrun };
const char* runtime_name(Runtime r);
// Whether the runtime's binary is installed; tests skip (or fail under QUANTA_REQUIRE_E2E=1).
bool runtime_available(Runtime r);

// A test run once per runtime: SetUp skips without root or the runtime (fails instead under
// QUANTA_REQUIRE_E2E=1). A fixture's own SetUp calls it first and returns when it skipped.
class RuntimeTest : public ::testing::TestWithParam<Runtime> {
 protected:
  void SetUp() override;
  bool skipped() const { return IsSkipped() || HasFatalFailure(); }
};

// What the tests' stand-in for NVIDIA's CDI spec provides: simgpu's C++-free libcuda.so.1
// and libnvidia-ml.so.1 where the toolkit mounts the driver, the host's /dev/shm (simgpu's
// device state) and its execution log, under kind `kind` with devices "0", its UUID, "all".
nlohmann::json vendor_spec(const World& world, const std::string& kind = "nvidia.com/gpu",
                           bool device_nodes = false);
nlohmann::json vendor_spec(const std::string& sim_state, const std::string& sim_log,
                           const std::string& gpu0_uuid, const std::string& kind, bool device_nodes);

// A Quanta installation for one test: <dir>/opt-quanta/{bin/quanta-hook,lib/libquanta.so}
// and what `quanta-hook cdi generate` writes there, plus the generated spec.
struct Install {
  std::string prefix;
  std::string spec_path;
  nlohmann::json spec;
};
// Installs the files as deploy/image/quanta-install-host does and runs the installed
// quanta-hook's cdi generate (JSON) against the world's config, in the world's environment
// (simgpu's NVML), as the installer runs it. `extra` are more generate arguments.
Install install_quanta(const World& world, const std::vector<std::string>& extra = {},
                       const std::string& output_name = "quanta.json");

// Quanta installed exactly as the DaemonSet's init container installs it: the real
// deploy/image/quanta-install-host, its payload the build folder, with the world's node
// config, tenant socket and a CDI folder (and hooks.d folder) of the world's own. The spec
// is the YAML file it wrote; `hooks_dir` the hooks.d folder it filled.
struct NodeInstall : Install {
  std::string cdi_dir;
  std::string hooks_dir;
  std::string installed_config;  // the node config's copy the hooks read
};
NodeInstall install_as_node(const World& world);

// An image: glibc's libraries, the C++-free quanta-tenant and the admin probe, and no
// libstdc++ or libgcc_s anywhere. Returns the rootfs folder.
std::string assemble_rootfs(const std::string& dir);

// `podman run --rm` of `args` in `rootfs`, as root, with podman's storage under the world's
// folder; its exit code, and its stderr in *said.
struct PodmanRun {
  std::vector<std::string> devices;      // --device
  std::vector<std::string> annotations;  // --annotation KEY=VALUE
  std::vector<std::string> env;          // --env KEY=VALUE
  std::vector<std::string> global;       // podman's own options (--hooks-dir DIR)
  std::string runtime = "/usr/sbin/runc";
};
bool podman_available();
// How many containers the world's arbiter logged as registered (its "registered container"
// lines, not the "unregistered" ones).
size_t registrations_logged(const World& world);
int run_podman(const World& world, const std::string& rootfs, const PodmanRun& run,
               const std::vector<std::string>& args, std::string* said);

struct ContainerSpec {
  std::string id;
  std::vector<std::string> args;  // the container's command
  std::map<std::string, std::string> annotations;
  // Pod annotations as containerd writes them (io.kubernetes.cri.*), when `pod` is set.
  std::string pod_namespace = "e2e";
  std::string pod;
  std::string container_name;
  std::vector<std::string> env;
  bool own_pid_namespace = false;
};

// The OCI config of a container before any CDI edits.
nlohmann::json base_config(const ContainerSpec& c, const std::string& rootfs);

// Applies a CDI spec's edits for `devices` (device names of that spec) to an OCI config:
// the spec's containerEdits once, then each device's, the way the CDI library's
// ContainerEdits.Apply does (env overrides by name, a mount or device node replaces one at
// the same path, hooks are appended per stage).
void apply_cdi(nlohmann::json* config, const nlohmann::json& spec,
               const std::vector<std::string>& devices);

struct Edits {
  const nlohmann::json* spec;
  std::vector<std::string> devices;
};

class Containers {
 public:
  Containers(World& world, Runtime runtime);
  ~Containers();

  Runtime runtime() const { return runtime_; }
  const std::string& rootfs() const { return rootfs_; }

  // The OCI config for `c` with the given CDI edits applied, as written to its bundle.
  nlohmann::json config_for(const ContainerSpec& c, const std::vector<Edits>& edits) const;
  std::string write_bundle(const ContainerSpec& c, const nlohmann::json& config);

  // `RUNTIME run` in the foreground: returns when the container exits (or the runtime
  // refuses it); stdout is the container's, stderr the runtime's and the hooks'.
  Child run(const std::string& id, const std::string& bundle);
  // What the hooks wrote on stderr, where the runtime does not show it: crun keeps hook
  // output to itself unless the run.oci.hooks.stderr annotation names a file (this harness
  // sets it for crun); runc puts it into its own error line.
  std::string hook_stderr(const std::string& id) const;

  // The container's host pid once it runs (0 when not yet or no longer).
  pid_t pid_of(const std::string& id);
  int kill(const std::string& id, const char* signal = "KILL");

  // The runtime command line (crun on a hybrid cgroup host runs where cgroup v2 is hidden).
  std::vector<std::string> command(const std::vector<std::string>& args) const;

 private:
  World& world_;
  Runtime runtime_;
  std::string root_;  // the runtime's state folder
  std::string rootfs_;
  std::vector<std::string> started_;
};

// quantactl status --json against the world's arbiter.
nlohmann::json status(const World& world);
// The tenants of a pod (by key) in `status`, over all GPUs.
std::vector<nlohmann::json> tenants_of(const nlohmann::json& status, const std::string& pod);
// The arbiter's registrations as its state file keeps them.
nlohmann::json registrations(const World& world);
const nlohmann::json* registration(const nlohmann::json& regs, const std::string& container_id);

using test_support::read_file;

// Each process's busy time on GPU 0 in simgpu's execution log, over the window where all of
// `pids` ran (from the latest first slice to the earliest last one), less `trim_ns` at both
// ends so start-up and the final drain do not count. ok is false, with why, when a pid never
// ran or the window is empty.
struct Shares {
  bool ok = false;
  std::string why;
  uint64_t from_ns = 0, to_ns = 0;
  std::map<pid_t, uint64_t> busy_ns;
};
Shares shares_from_log(const std::string& sim_log, const std::vector<pid_t>& pids, uint64_t trim_ns);
// The first UUID simgpu lists (NVML index 0) for the world's shape.
std::string gpu0_uuid(const World& world);

}  // namespace quanta::e2e
