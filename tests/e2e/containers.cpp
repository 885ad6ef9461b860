// The e2e harness: installation, image, bundles with CDI edits applied, runtimes.
#include "tests/e2e/containers.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "hooks/spec_io.h"
#include "tests/support/temp_dir.h"

extern char** environ;

namespace quanta::e2e {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr long kCgroup2Magic = 0x63677270;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

// Runs argv to completion; returns the exit code and fills out/err.
integration::Env inherited_env() {
  integration::Env env;
  for (char** p = environ; *p != nullptr; ++p) {
    std::string text = *p;
    const auto eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return env;
}

int run_command(const std::vector<std::string>& argv, const std::string& dir, std::string* out,
                std::string* err, double timeout_s = 60, const integration::Env& env = inherited_env()) {
  static int n = 0;
  const std::string o = dir + "/cmd.out." + std::to_string(n), e = dir + "/cmd.err." + std::to_string(n);
  ++n;
  Child c(argv, env, o, e);
  int rc = c.wait(timeout_s);
  if (rc < 0) {
    c.signal(SIGKILL);
    rc = c.wait(5);
  }
  if (out != nullptr) *out = read_file(o);
  if (err != nullptr) *err = read_file(e);
  return rc;
}

bool on_path(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"}) {
    if (access((std::string(dir) + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string which(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return name;
}

// crun refuses hybrid hosts whose cgroup v2 root has controllers; it runs on their v1
// hierarchies when it does not see the v2 mount (what a v1 node is).
bool hybrid_with_v2_controllers() {
  struct statfs st {};
  if (statfs("/sys/fs/cgroup/unified", &st) != 0 || st.f_type != kCgroup2Magic) return false;
  return !read_file("/sys/fs/cgroup/unified/cgroup.controllers").empty() &&
         read_file("/sys/fs/cgroup/unified/cgroup.controllers") != "\n";
}

void copy_file(const std::string& from, const std::string& to) {
  fs::create_directories(fs::path(to).parent_path());
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

}  // namespace

json base_config(const ContainerSpec& c, const std::string& rootfs) {
  json caps = json::array({"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
                           "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
                           "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"});
  json env = json::array({"PATH=/usr/local/bin:/usr/bin:/bin"});
  for (const std::string& e : c.env) env.push_back(e);
  json namespaces = json::array({{{"type", "mount"}}, {{"type", "ipc"}}, {{"type", "uts"}}});
  if (c.own_pid_namespace) namespaces.push_back({{"type", "pid"}});
  json annotations = c.annotations;
  if (!c.pod.empty()) {
    annotations["io.kubernetes.cri.container-type"] = "container";
    annotations["io.kubernetes.cri.sandbox-name"] = c.pod;
    annotations["io.kubernetes.cri.sandbox-namespace"] = c.pod_namespace;
    annotations["io.kubernetes.cri.sandbox-uid"] = "uid-" + c.pod;
    annotations["io.kubernetes.cri.container-name"] = c.container_name.empty() ? c.id : c.container_name;
  }
  return json{
      {"ociVersion", "1.0.2"},
      {"process",
       {{"terminal", false},
        {"user", {{"uid", 0}, {"gid", 0}}},
        {"args", c.args},
        {"env", env},
        {"cwd", "/"},
        {"capabilities",
         {{"bounding", caps}, {"effective", caps}, {"permitted", caps}, {"inheritable", json::array()}}},
        {"noNewPrivileges", true}}},
      {"root", {{"path", rootfs}, {"readonly", true}}},
      {"hostname", c.id.substr(0, 60)},
      {"annotations", annotations},
      {"mounts",
       json::array({
           {{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
           {{"destination", "/dev"},
            {"type", "tmpfs"},
            {"source", "tmpfs"},
            {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
           {{"destination", "/dev/pts"},
            {"type", "devpts"},
            {"source", "devpts"},
            {"options", {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}}},
           {{"destination", "/dev/shm"},
            {"type", "tmpfs"},
            {"source", "shm"},
            {"options", {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}},
           {{"destination", "/sys"},
            {"type", "sysfs"},
            {"source", "sysfs"},
            {"options", {"nosuid", "noexec", "nodev", "ro"}}},
           {{"destination", "/tmp"},
            {"type", "tmpfs"},
            {"source", "tmpfs"},
            {"options", {"nosuid", "nodev", "mode=1777"}}},
       })},
      {"linux",
       {{"namespaces", namespaces},
        {"resources", {{"devices", json::array({{{"allow", false}, {"access", "rwm"}}})}}},
        {"maskedPaths", {"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"}},
        {"readonlyPaths", {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}}}}};
}

const char* runtime_name(Runtime r) {
  return r == Runtime::kRunc ? "runc" : "crun";
}

bool runtime_available(Runtime r) {
  return on_path(runtime_name(r));
}

void RuntimeTest::SetUp() {
    if (geteuid() != 0) GTEST_SKIP() << "containers need root";
    if (!runtime_available(GetParam())) {
      if (getenv("QUANTA_REQUIRE_E2E") != nullptr) FAIL() << runtime_name(GetParam()) << " is not installed";
      GTEST_SKIP() << runtime_name(GetParam()) << " is not installed (scripts/install-deps.sh installs it)";
    }
}

bool podman_available() {
  return access("/usr/bin/podman", X_OK) == 0 && access("/usr/sbin/runc", X_OK) == 0;
}

size_t registrations_logged(const World& world) {
  const std::string log = world.arbiter_log();
  size_t n = 0;
  for (size_t at = log.find("registered container"); at != std::string::npos; at = log.find("registered container", at + 1))
    if (log.compare(at > 2 ? at - 2 : at, 2, "un") != 0) ++n;
  return n;
}

int run_podman(const World& world, const std::string& rootfs, const PodmanRun& run,
               const std::vector<std::string>& args, std::string* said) {
  const std::string d = world.dir().path();
  std::vector<std::string> argv = {"/usr/bin/podman", "--root", d + "/podman-root", "--runroot", d + "/podman-run",
                                   "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
                                   "--events-backend", "none", "--runtime", run.runtime};
  argv.insert(argv.end(), run.global.begin(), run.global.end());
  argv.insert(argv.end(), {"run", "--rm", "--network", "none", "--log-driver", "none"});
  for (const std::string& dev : run.devices) argv.insert(argv.end(), {"--device", dev});
  for (const std::string& a : run.annotations) argv.insert(argv.end(), {"--annotation", a});
  for (const std::string& e : run.env) argv.insert(argv.end(), {"--env", e});
  argv.insert(argv.end(), {"--rootfs", rootfs});
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  return run_command(argv, d, &out, said, 120);
}

json vendor_spec(const World& world, const std::string& kind, bool device_nodes) {
  return vendor_spec(world.sim_state(), world.sim_log_path(), gpu0_uuid(world), kind, device_nodes);
}

json vendor_spec(const std::string& sim_state, const std::string& sim_log, const std::string& uuid,
                 const std::string& kind, bool device_nodes) {
  const std::string driver = QUANTA_E2E_DRIVER_DIR;
  // The execution log is opened by path in every process: it has to be at the same path.
  if (!sim_log.empty()) std::ofstream(sim_log, std::ios::app).close();
  json device_edits = json::object();
  if (device_nodes) {
    // What NVIDIA's spec gives for GPU 0; simgpu never opens it, the hook reads it.
    json node = json::object();
    node["path"] = "/dev/nvidia0";
    node["type"] = "c";
    node["major"] = 195;
    node["minor"] = 0;
    device_edits["deviceNodes"] = json::array({node});
  } else {
    device_edits["env"] = json::array({"E2E_VENDOR_DEVICE=0"});
  }
  json env = json::array({"NVIDIA_VISIBLE_DEVICES=void", "SIMGPU_STATE=" + sim_state, "E2E_VENDOR_EDITS=1"});
  // What a context costs on this simulated GPU, where the caller gives one: the driver's
  // own property, so every process that uses the GPU sees the same.
  if (const char* context = std::getenv("SIMGPU_CONTEXT_MEMORY")) env.push_back(std::string("SIMGPU_CONTEXT_MEMORY=") + context);
  json spec{
      {"cdiVersion", "0.5.0"},
      {"kind", kind},
      {"containerEdits",
       {{"env", env},
        {"mounts",
         json::array({
             {{"hostPath", driver + "/libcuda.so.1"},
              {"containerPath", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
              {"options", {"ro", "nosuid", "nodev", "bind"}}},
             {{"hostPath", driver + "/libnvidia-ml.so.1"},
              {"containerPath", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"},
              {"options", {"ro", "nosuid", "nodev", "bind"}}},
             {{"hostPath", "/dev/shm"}, {"containerPath", "/dev/shm"}, {"options", {"rbind", "nosuid", "nodev"}}},
         })}}},
      {"devices",
       json::array({{{"name", "0"}, {"containerEdits", device_edits}},
                    {{"name", uuid}, {"containerEdits", device_edits}},
                    {{"name", "all"}, {"containerEdits", device_edits}}})}};
  if (!sim_log.empty())
    spec["containerEdits"]["mounts"].push_back(
        {{"hostPath", sim_log}, {"containerPath", sim_log}, {"options", {"bind", "nosuid", "nodev"}}});
  return spec;
}

Install install_quanta(const World& world, const std::vector<std::string>& extra,
                       const std::string& output_name) {
  Install in;
  in.prefix = world.dir().file("opt-quanta");
  // As deploy/image/quanta-install-host lays it out: the static launcher in bin/, the
  // program it starts in libexec/, the shim in lib/.
  for (const char* d : {"/bin", "/libexec", "/lib"}) fs::create_directories(in.prefix + d);
  const std::string built = fs::path(QUANTA_HOOK_BINARY).parent_path().parent_path().string();
  copy_file(QUANTA_HOOK_BINARY, in.prefix + "/bin/quanta-hook");
  copy_file(built + "/libexec/quanta-hook", in.prefix + "/libexec/quanta-hook");
  for (const char* f : {"/bin/quanta-hook", "/libexec/quanta-hook"})
    fs::permissions(in.prefix + f, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                       fs::perms::others_read | fs::perms::others_exec);
  copy_file(QUANTA_SHIM_LIBRARY, in.prefix + "/lib/libquanta.so");
  in.spec_path = world.dir().file(output_name);
  // The installer's command line (its --format aside: the tests read JSON).
  std::vector<std::string> argv = {in.prefix + "/bin/quanta-hook", "cdi", "generate", "--config", world.config_path(),
                                   "--prefix", in.prefix, "--output", in.spec_path};
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::string out, err;
  // NVML is simgpu's, in the world's state: the generator names the devices the arbiter sees.
  const int rc = run_command(argv, world.dir().path(), &out, &err, 60, world.tenant_env("", false));
  if (rc != 0) throw std::runtime_error("quanta-hook cdi generate failed (" + std::to_string(rc) + "): " + err);
  if (in.spec_path.size() > 5 && in.spec_path.substr(in.spec_path.size() - 5) == ".json")
    in.spec = json::parse(read_file(in.spec_path));
  return in;
}

NodeInstall install_as_node(const World& world) {
  NodeInstall in;
  in.prefix = world.dir().file("opt-quanta");
  in.cdi_dir = world.dir().file("cdi");
  in.hooks_dir = world.dir().file("hooks.d");
  in.installed_config = world.dir().file("etc-quanta/quanta.toml");
  const std::string built = fs::path(QUANTA_HOOK_BINARY).parent_path().parent_path().string();
  const std::vector<std::string> argv = {
      std::string(QUANTA_SOURCE_DIR) + "/deploy/image/quanta-install-host", "--prefix=" + in.prefix,
      "--node-config=" + world.config_path(), "--config=" + in.installed_config,
      "--socket=" + world.tenant_socket(), "--cdi-dir=" + in.cdi_dir, "--hooks-dir=" + in.hooks_dir,
      "--payload=" + built, "--arbiter=" + built + "/bin/quanta-arbiter"};
  std::string out, err;
  // The init container's environment is the node's: here simgpu's NVML, as the arbiter's.
  const int rc = run_command(argv, world.dir().path(), &out, &err, 60, world.tenant_env("", false));
  if (rc != 0) throw std::runtime_error("quanta-install-host failed (" + std::to_string(rc) + "): " + out + err);
  in.spec_path = in.cdi_dir + "/quanta.yaml";
  in.spec = hooks::read_spec_file(in.spec_path);
  return in;
}

std::string assemble_rootfs(const std::string& dir) {
  const std::string root = dir + "/rootfs";
  for (const char* d : {"bin", "lib64", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "etc", "proc",
                        "dev", "sys", "tmp", "run"})
    fs::create_directories(root + "/" + d);
  // The C library an image brings (glibc, as Debian's and Ubuntu's images do), nothing more.
  for (const char* lib : {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}) {
    const std::string from = std::string("/lib/x86_64-linux-gnu/") + lib;
    if (fs::exists(from)) copy_file(from, root + "/lib/x86_64-linux-gnu/" + lib);
  }
  copy_file("/lib64/ld-linux-x86-64.so.2", root + "/lib64/ld-linux-x86-64.so.2");
  copy_file(QUANTA_E2E_TENANT, root + "/bin/quanta-tenant");
  copy_file(QUANTA_E2E_ADMIN_PROBE, root + "/bin/admin-probe");
  fs::permissions(root + "/bin/quanta-tenant", fs::perms::owner_all | fs::perms::group_read |
                                                  fs::perms::group_exec | fs::perms::others_read |
                                                  fs::perms::others_exec);
  fs::permissions(root + "/bin/admin-probe", fs::perms::owner_all | fs::perms::group_read |
                                                 fs::perms::group_exec | fs::perms::others_read |
                                                 fs::perms::others_exec);
  write_text(root + "/etc/passwd", "root:x:0:0:root:/:/bin/false\n");
  write_text(root + "/etc/group", "root:x:0:\n");
  return root;
}

void apply_cdi(json* config, const json& spec, const std::vector<std::string>& devices) {
  json& c = *config;
  auto apply = [&c](const json& edits) {
    if (!edits.is_object()) return;
    for (const json& e : edits.value("env", json::array())) {
      const std::string text = e.get<std::string>();
      const std::string name = text.substr(0, text.find('='));
      json& env = c["process"]["env"];
      json kept = json::array();
      for (const json& old : env)
        if (old.get<std::string>().substr(0, old.get<std::string>().find('=')) != name) kept.push_back(old);
      kept.push_back(text);
      env = kept;
    }
    for (const json& m : edits.value("mounts", json::array())) {
      json& mounts = c["mounts"];
      json kept = json::array();
      for (const json& old : mounts)
        if (old["destination"] != m["containerPath"]) kept.push_back(old);
      json mount{{"destination", m["containerPath"]}, {"source", m["hostPath"]},
                 {"options", m.value("options", json::array())}};
      if (m.contains("type")) mount["type"] = m["type"];
      kept.push_back(mount);
      mounts = kept;
    }
    for (const json& h : edits.value("hooks", json::array())) {
      json hook{{"path", h["path"]}};
      for (const char* k : {"args", "env", "timeout"})
        if (h.contains(k)) hook[k] = h[k];
      c["hooks"][h["hookName"].get<std::string>()].push_back(hook);
    }
    for (const json& spec_node : edits.value("deviceNodes", json::array())) {
      // What the spec leaves out comes from the host's node, as the CDI library fills it
      // (NVIDIA's specs name paths only).
      json n = spec_node;
      if (!n.contains("major") || !n.contains("minor")) {
        const std::string host = n.value("hostPath", n.value("path", ""));
        struct stat st {};
        if (::stat(host.c_str(), &st) != 0 || !(S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)))
          throw std::runtime_error("CDI device node " + host + " is not a device on this host");
        n["type"] = S_ISBLK(st.st_mode) ? "b" : "c";
        n["major"] = major(st.st_rdev);
        n["minor"] = minor(st.st_rdev);
      }
      json node{{"path", n["path"]}, {"type", n.value("type", "c")}, {"major", n["major"]}, {"minor", n["minor"]},
                {"fileMode", 0666}, {"uid", 0}, {"gid", 0}};
      c["linux"]["devices"].push_back(node);
      c["linux"]["resources"]["devices"].push_back(
          {{"allow", true}, {"type", node["type"]}, {"major", n["major"]}, {"minor", n["minor"]}, {"access", "rwm"}});
    }
  };
  apply(spec.value("containerEdits", json::object()));
  for (const std::string& name : devices) {
    bool found = false;
    for (const json& d : spec["devices"]) {
      if (d["name"] != name) continue;
      apply(d["containerEdits"]);
      found = true;
    }
    if (!found) throw std::runtime_error("the CDI spec has no device " + name);
  }
}

Containers::Containers(World& world, Runtime runtime) : world_(world), runtime_(runtime) {
  root_ = world.dir().file(std::string(runtime_name(runtime)) + "-state");
  fs::create_directories(root_);
  rootfs_ = assemble_rootfs(world.dir().path());
}

Containers::~Containers() {
  for (const std::string& id : started_) {
    std::string out, err;
    run_command(command({"kill", id, "KILL"}), world_.dir().path(), &out, &err, 10);
    run_command(command({"delete", "--force", id}), world_.dir().path(), &out, &err, 20);
  }
}

std::vector<std::string> Containers::command(const std::vector<std::string>& args) const {
  std::vector<std::string> argv;
  const std::string binary = which(runtime_name(runtime_));
  std::vector<std::string> runtime_args = {binary, "--root", root_};
  runtime_args.insert(runtime_args.end(), args.begin(), args.end());
  if (runtime_ == Runtime::kCrun && hybrid_with_v2_controllers()) {
    // A private mount namespace where /sys/fs/cgroup/unified is not mounted: crun then
    // takes the host for cgroup v1 and puts the container in v1 cgroups only.
    std::string line = "umount -l /sys/fs/cgroup/unified && exec";
    for (const std::string& a : runtime_args) line += " '" + a + "'";
    return {which("unshare"), "--mount", "--propagation", "private", "/bin/sh", "-c", line};
  }
  return runtime_args;
}

json Containers::config_for(const ContainerSpec& c, const std::vector<Edits>& edits) const {
  json config = base_config(c, rootfs_);
  if (runtime_ == Runtime::kCrun)
    config["annotations"]["run.oci.hooks.stderr"] = world_.dir().file("hooks-stderr." + c.id);
  for (const Edits& e : edits) apply_cdi(&config, *e.spec, e.devices);
  return config;
}

std::string Containers::write_bundle(const ContainerSpec& c, const json& config) {
  const std::string bundle = world_.dir().file("bundles/" + c.id);
  fs::create_directories(bundle);
  write_text(bundle + "/config.json", config.dump(2));
  return bundle;
}

Child Containers::run(const std::string& id, const std::string& bundle) {
  started_.push_back(id);
  return world_.spawn(command({"run", "--bundle", bundle, id}), inherited_env());
}

std::string Containers::hook_stderr(const std::string& id) const {
  return read_file(world_.dir().file("hooks-stderr." + id));
}

pid_t Containers::pid_of(const std::string& id) {
  std::string out, err;
  if (run_command(command({"state", id}), world_.dir().path(), &out, &err, 10) != 0) return 0;
  json s = json::parse(out, nullptr, false);
  if (!s.is_object() || s.value("status", "") != "running") return 0;
  return s.value("pid", 0);
}

int Containers::kill(const std::string& id, const char* signal) {
  std::string out, err;
  return run_command(command({"kill", id, signal}), world_.dir().path(), &out, &err, 10);
}

json status(const World& world) {
  std::string out, err;
  const int rc = run_command({QUANTACTL_BINARY, "--admin-socket", world.admin_socket(), "status", "--json"},
                             world.dir().path(), &out, &err, 10);
  if (rc != 0) return json{{"ok", false}, {"error", err}};
  return json::parse(out, nullptr, false);
}

std::vector<json> tenants_of(const json& status, const std::string& pod) {
  std::vector<json> out;
  if (!status.is_object() || !status.contains("gpus")) return out;
  for (const json& gpu : status["gpus"])
    for (const json& t : gpu["tenants"])
      if (t.value("pod", "") == pod) out.push_back(t);
  return out;
}

json registrations(const World& world) {
  const std::string path = world.dir().file("state/" + world.scope() + ".state.json");
  json j = json::parse(read_file(path), nullptr, false);
  return j.is_object() && j.contains("registrations") ? j["registrations"] : json::array();
}

const json* registration(const json& regs, const std::string& container_id) {
  for (const json& r : regs)
    if (r.value("container_id", "") == container_id) return &r;
  return nullptr;
}

Shares shares_from_log(const std::string& sim_log, const std::vector<pid_t>& pids, uint64_t trim_ns) {
  Shares out;
  const std::vector<integration::Slice> slices = integration::read_sim_log(sim_log);
  uint64_t from = 0, to = UINT64_MAX;
  for (pid_t pid : pids) {
    uint64_t first = UINT64_MAX, last = 0;
    for (const integration::Slice& s : slices) {
      if (s.pid != pid || s.device != 0) continue;
      first = std::min(first, s.start_ns);
      last = std::max(last, s.end_ns);
    }
    if (first == UINT64_MAX) {
      out.why = "pid " + std::to_string(pid) + " never ran on the device (" + sim_log + ")";
      return out;
    }
    from = std::max(from, first);
    to = std::min(to, last);
  }
  if (pids.empty() || to <= from + 2 * trim_ns) {
    out.why = "the processes never ran at the same time";
    return out;
  }
  out.from_ns = from + trim_ns;
  out.to_ns = to - trim_ns;
  std::vector<integration::Slice> gpu0;
  for (const integration::Slice& s : slices)
    if (s.device == 0) gpu0.push_back(s);
  out.busy_ns = integration::busy_by_pid(gpu0, out.from_ns, out.to_ns);
  for (pid_t pid : pids) out.busy_ns.emplace(pid, 0);
  out.ok = true;
  return out;
}

std::string gpu0_uuid(const World& world) {
  json s = status(world);
  if (!s.is_object() || !s.contains("gpus") || s["gpus"].empty()) return "";
  return s["gpus"][0].value("uuid", "");
}

}  // namespace quanta::e2e
