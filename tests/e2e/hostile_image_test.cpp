// Hostile images and pod specs against the injection path as a node runs it: Quanta installed
// by the real deploy/image/quanta-install-host, its CDI spec and hooks.d files exactly as
// that installer writes them, real runc and crun (and podman for hooks.d). Each test asserts
// that no host file changed, that no other pod's registration, share or cap moved, and that
// a refusal is one clear line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/e2e/containers.h"

namespace quanta::e2e {
namespace {

namespace fs = std::filesystem;
using integration::ArbiterConfig;
using integration::eventually;
using nlohmann::json;

std::string test_name() {
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

std::string id_for(const std::string& what, Runtime r) {
  return "qhostile-" + std::to_string(getpid()) + "-" + what + "-" + runtime_name(r);
}

// CRI-O's own annotations for a container of pod namespace/name with uid `uid`: the
// container type and the kubelet's labels, as CRI-O writes them over any pod annotation.
std::map<std::string, std::string> crio_pod(const std::string& ns, const std::string& name,
                                            const std::string& uid) {
  const json labels{{"io.kubernetes.pod.name", name},
                    {"io.kubernetes.pod.namespace", ns},
                    {"io.kubernetes.pod.uid", uid},
                    {"io.kubernetes.container.name", "main"}};
  return {{"io.kubernetes.cri-o.ContainerType", "container"}, {"io.kubernetes.cri-o.Labels", labels.dump()}};
}

// A node that registers every GPU container, with the bounds deploy/node/node-config.yaml
// ships, its arbiter started.
std::unique_ptr<World> hostile_node() {
  ArbiterConfig c;
  c.allow_unregistered = false;
  c.quantum = "10ms";
  c.sockets_in_run_dir = true;
  c.extra =
      "[shim]\ncontext_overhead = \"0\"\n[hook]\ntimeout = \"2s\"\n"
      "[bounds]\nmax_weight = 100\npriorities = [\"batch\", \"best-effort\"]\nmax_min_share = \"25%\"\n"
      "namespace_min_share = \"50%\"\nmemory_limit = \"required\"\n";
  auto world = std::make_unique<World>(test_name(), c);
  world->start_arbiter();
  return world;
}

class HostileImageTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (skipped()) return;
    world_ = hostile_node();
    install_ = install_as_node(*world_);
    vendor_ = vendor_spec(*world_);
    containers_ = std::make_unique<Containers>(*world_, GetParam());
  }

  std::string bundle(const ContainerSpec& c) {
    json config = containers_->config_for(c, {{&vendor_, {"0"}}, {&install_.spec, {"0"}}});
    return containers_->write_bundle(c, config);
  }

  // Runs the container to its end; its exit code, with what the runtime and hooks said.
  int run(const ContainerSpec& c, std::string* said) {
    Child child = containers_->run(c.id, bundle(c));
    const int code = child.wait(90);
    *said = child.err() + containers_->hook_stderr(c.id);
    return code;
  }

  json registration_of(const std::string& id) {
    const json regs = registrations(*world_);
    const json* r = registration(regs, id);
    return r == nullptr ? json() : *r;
  }

  std::unique_ptr<World> world_;
  NodeInstall install_;
  json vendor_;
  std::unique_ptr<Containers> containers_;
};

TEST_P(HostileImageTest, TheInstallersHooksNameTheirWholeEnvironment) {
  for (const json& h : install_.spec["containerEdits"]["hooks"])
    EXPECT_EQ(h["env"], json::array({"PATH=/usr/sbin:/usr/bin:/sbin:/bin"})) << h.dump();
  for (const auto& entry : fs::directory_iterator(install_.hooks_dir)) {
    const json h = json::parse(read_file(entry.path().string()));
    EXPECT_EQ(h["hook"]["env"], json::array({"PATH=/usr/sbin:/usr/bin:/sbin:/bin"})) << entry.path();
  }
}

// runc runs createContainer hooks inside `runc init`: a hook without its own env gets the
// container's process.env, and the image's rootfs as working directory, as host root.
TEST_P(HostileImageTest, AnImagesLoaderVariablesNeverRunInTheHook) {
  const std::string mark = world_->file("ran-as-the-host-hook");
  fs::copy_file(QUANTA_HOSTILE_PRELOAD, containers_->rootfs() + "/evil.so", fs::copy_options::overwrite_existing);
  ContainerSpec c;
  c.id = id_for("loader", GetParam());
  c.annotations = {{"quanta.dev/weight", "2"}, {"quanta.dev/memory-limit", "1Gi"}};
  c.env = {"LD_PRELOAD=/proc/self/cwd/evil.so", "LD_AUDIT=/proc/self/cwd/evil.so", "LD_LIBRARY_PATH=/proc/self/cwd",
           "GCONV_PATH=/proc/self/cwd", "GLIBC_TUNABLES=glibc.malloc.check=3", "HOSTILE_MARK=" + mark};
  c.args = {"/bin/quanta-tenant", "--json", "info"};
  std::string said;
  const int code = run(c, &said);
  EXPECT_EQ(code, 0) << said;
  EXPECT_FALSE(fs::exists(mark)) << "the image's library ran on the host as the hook: "
                                 << read_file(mark);
}

// The preload list and Quanta's folder are symbolic links to host paths in the image: the
// mounts land inside the container (or the container is refused), never on the host.
TEST_P(HostileImageTest, SymlinkedMountTargetsNeverReachHostPaths) {
  const std::string host_file = world_->file("host-preload"), host_dir = world_->file("host-etc");
  {
    std::ofstream(host_file) << "untouched\n";
  }
  fs::create_directories(host_dir);
  const std::string root = containers_->rootfs();
  std::error_code ec;
  fs::remove(root + "/etc/ld.so.preload", ec);
  fs::remove_all(root + "/etc/quanta", ec);
  fs::create_symlink(host_file, root + "/etc/ld.so.preload");
  fs::create_symlink(host_dir, root + "/etc/quanta");
  struct stat before {};
  ASSERT_EQ(stat(host_file.c_str(), &before), 0);
  ContainerSpec c;
  c.id = id_for("symlinks", GetParam());
  c.annotations = {{"quanta.dev/weight", "2"}, {"quanta.dev/memory-limit", "1Gi"}};
  c.args = {"/bin/quanta-tenant", "--json", "info"};
  std::string said;
  const int code = run(c, &said);
  // The runtime itself may refuse such an image (crun: "openat2 etc/quanta"); either way
  // the refusal says why.
  if (code != 0) {
    EXPECT_FALSE(said.empty()) << "a refusal without a reason";
  }
  EXPECT_EQ(read_file(host_file), "untouched\n");
  struct stat after {};
  ASSERT_EQ(stat(host_file.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_TRUE(fs::is_empty(host_dir)) << "something was written into the host folder the image pointed at";
}

// The same with links into /dev and /proc, as a host path would be reached through them:
// the preload list a link to /dev/null (the image that made podman+runc fail half way),
// Quanta's folder a link through /proc/self/root to a host folder. The host's /dev/null
// stays the device it was, with nothing mounted on it, and the host folder stays empty.
TEST_P(HostileImageTest, LinksIntoDevAndProcNeverReachTheHost) {
  const std::string host_dir = world_->file("host-through-proc");
  fs::create_directories(host_dir);
  const std::string root = containers_->rootfs();
  std::error_code ec;
  fs::remove(root + "/etc/ld.so.preload", ec);
  fs::remove_all(root + "/etc/quanta", ec);
  fs::create_symlink("/dev/null", root + "/etc/ld.so.preload");
  fs::create_symlink("/proc/self/root" + host_dir, root + "/etc/quanta");
  struct stat null_before {};
  ASSERT_EQ(stat("/dev/null", &null_before), 0);
  ContainerSpec c;
  c.id = id_for("dev-proc", GetParam());
  c.annotations = {{"quanta.dev/weight", "2"}, {"quanta.dev/memory-limit", "1Gi"}};
  c.args = {"/bin/quanta-tenant", "--json", "info"};
  std::string said;
  const int code = run(c, &said);
  if (code != 0) {
    EXPECT_FALSE(said.empty()) << "a refusal without a reason";
  }
  struct stat null_after {};
  ASSERT_EQ(stat("/dev/null", &null_after), 0);
  EXPECT_TRUE(S_ISCHR(null_after.st_mode)) << "the host's /dev/null is no longer a device";
  EXPECT_EQ(null_after.st_rdev, null_before.st_rdev);
  EXPECT_EQ(null_after.st_ino, null_before.st_ino) << "something was mounted on the host's /dev/null";
  const std::string mounts = read_file("/proc/self/mountinfo");
  EXPECT_EQ(mounts.find(" /dev/null "), std::string::npos) << "a mount on the host's /dev/null";
  EXPECT_EQ(mounts.find(" " + host_dir + " "), std::string::npos) << "a mount on the host folder the image pointed at";
  EXPECT_TRUE(fs::is_empty(host_dir)) << "something was written into the host folder the image pointed at";
}

// CRI-O copies every pod annotation into the spec: a pod writing containerd's keys for
// another pod must stay itself, and must not pass as a sandbox to escape registration.
TEST_P(HostileImageTest, ACrioPodClaimingAnotherPodStaysItselfAndCannotPassAsASandbox) {
  ContainerSpec victim;
  victim.id = id_for("victim", GetParam());
  victim.annotations = crio_pod("team-b", "victim", "uid-victim");
  victim.annotations["quanta.dev/weight"] = "2";
  victim.annotations["quanta.dev/memory-limit"] = "1Gi";
  victim.args = {"/bin/quanta-tenant", "--json", "batch", "--seconds", "6", "--kernel-ms", "2"};
  Child v = containers_->run(victim.id, bundle(victim));
  ASSERT_TRUE(eventually(20, [&] { return !registration_of(victim.id).is_null(); })) << v.err();

  ContainerSpec attacker;
  attacker.id = id_for("attacker", GetParam());
  attacker.annotations = crio_pod("team-a", "attacker", "uid-attacker");
  attacker.annotations["io.kubernetes.cri.sandbox-name"] = "victim";
  attacker.annotations["io.kubernetes.cri.sandbox-namespace"] = "team-b";
  attacker.annotations["io.kubernetes.cri.sandbox-uid"] = "uid-victim";
  attacker.annotations["quanta.dev/weight"] = "50";
  attacker.annotations["quanta.dev/memory-limit"] = "8Gi";
  attacker.args = {"/bin/quanta-tenant", "--json", "info"};
  std::string said;
  EXPECT_EQ(run(attacker, &said), 0) << said;
  const json reg = registration_of(attacker.id);
  // Registered as itself (and unregistered again by poststop), never as team-b/victim.
  if (!reg.is_null()) {
    EXPECT_EQ(reg["pod_name"], "attacker") << reg.dump();
  }
  const json victim_reg = registration_of(victim.id);
  ASSERT_FALSE(victim_reg.is_null());
  EXPECT_EQ(victim_reg["policy"]["weight"], "2") << "the victim's policy moved: " << victim_reg.dump();
  EXPECT_EQ(victim_reg["policy"]["memory-limit"], "1Gi") << victim_reg.dump();
  for (const json& t : tenants_of(status(*world_), "team-b/victim")) {
    EXPECT_EQ(t["weight"], 2) << t.dump();
    EXPECT_EQ(t["memory_cap"].get<uint64_t>(), 1ull << 30) << t.dump();
  }

  ContainerSpec sandbox = attacker;
  sandbox.id = id_for("fake-sandbox", GetParam());
  sandbox.annotations = crio_pod("team-a", "attacker", "uid-attacker");
  sandbox.annotations["io.kubernetes.cri.container-type"] = "sandbox";
  const int code = run(sandbox, &said);
  EXPECT_NE(code, 0) << "a CRI-O container claiming containerd's sandbox type started: " << said;
  EXPECT_NE(said.find("one of them came from the pod"), std::string::npos) << said;
  v.signal(SIGKILL);
  containers_->kill(victim.id);
}

// A pod granting itself what the node does not allow (the shape that took 96% of a GPU):
// each value is refused at creation with one line naming it, and nothing is registered.
TEST_P(HostileImageTest, SelfGrantedPolicyBeyondTheNodesBoundsIsRefusedWithOneLine) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> asks = {
      {{{"quanta.dev/weight", "1000"}, {"quanta.dev/memory-limit", "1Gi"}}, "annotation quanta.dev/weight = "},
      {{{"quanta.dev/priority", "interactive"}, {"quanta.dev/memory-limit", "1Gi"}}, "annotation quanta.dev/priority = "},
      {{{"quanta.dev/min-share", "100%"}, {"quanta.dev/memory-limit", "1Gi"}}, "annotation quanta.dev/min-share = "},
      {{{"quanta.dev/memory-limit", "none"}}, "annotation quanta.dev/memory-limit = "},
      {{{"quanta.dev/weight", "2"}}, "no quanta.dev/memory-limit annotation"}};
  int n = 0;
  for (const auto& [annotations, expected] : asks) {
    ContainerSpec c;
    c.id = id_for("greedy-" + std::to_string(n++), GetParam());
    c.annotations = crio_pod("team-a", "greedy", "uid-greedy");
    c.annotations.insert(annotations.begin(), annotations.end());
    c.args = {"/bin/quanta-tenant", "--json", "info"};
    std::string said;
    EXPECT_NE(run(c, &said), 0) << "started with " << expected;
    if (GetParam() == Runtime::kRunc || !said.empty()) {
      EXPECT_NE(said.find(expected), std::string::npos) << said;
      EXPECT_NE(said.find("beyond the node's bounds"), std::string::npos) << said;
    }
    EXPECT_TRUE(registration_of(c.id).is_null());
  }
}

// Annotation values with bidirectional overrides and C1 controls, in every annotation
// Quanta reads and in the name of one it does not know: each refusal stays one line that
// shows them escaped, and nothing is registered.
TEST_P(HostileImageTest, UnicodeTricksInAnnotationsAreRefusedEscaped) {
  const std::string tricks = "\xe2\x80\xae" "evitcaretni\xc2\x85\xc2\x9b" "2J";
  std::vector<std::pair<std::string, std::string>> asks;
  for (const char* key : {"weight", "priority", "min-share", "max-share", "memory-limit", "quantum"})
    asks.emplace_back(std::string("quanta.dev/") + key, "1" + tricks);
  asks.emplace_back("quanta.dev/wei" + tricks + "ght", "2");
  int n = 0;
  for (const auto& [key, value] : asks) {
    ContainerSpec c;
    c.id = id_for("unicode-" + std::to_string(n++), GetParam());
    c.annotations = {{key, value}};
    if (key != "quanta.dev/memory-limit") c.annotations["quanta.dev/memory-limit"] = "1Gi";
    c.args = {"/bin/quanta-tenant", "--json", "info"};
    std::string said;
    EXPECT_NE(run(c, &said), 0) << key << ": " << said;
    EXPECT_NE(said.find("quanta.dev/"), std::string::npos) << key << ": " << said;
    EXPECT_EQ(said.find("\xe2\x80\xae"), std::string::npos) << key << ": " << said;
    EXPECT_EQ(said.find("\xc2\x85"), std::string::npos) << key << ": " << said;
    EXPECT_EQ(said.find("\xc2\x9b"), std::string::npos) << key << ": " << said;
    EXPECT_TRUE(registration_of(c.id).is_null()) << key;
  }
}

// podman's hooks.d path (CRI-O's too), with the hooks.d files the installer wrote.
class HostilePodmanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "podman as root";
    if (!podman_available()) {
      if (getenv("QUANTA_REQUIRE_E2E") != nullptr) FAIL() << "podman or runc is not installed";
      GTEST_SKIP() << "podman or runc is not installed (scripts/install-deps.sh installs them)";
    }
    world_ = hostile_node();
    install_ = install_as_node(*world_);
    rootfs_ = assemble_rootfs(world_->dir().path());
  }

  std::unique_ptr<World> world_;
  NodeInstall install_;
  std::string rootfs_;
};

// An image's loader variables never run in podman's hooks.d hooks; and the creation then
// fails half way (podman's containers fail on rlimits on this machine, after the
// createRuntime hook registered them, and podman runs no poststop hook for them): the
// registration it leaves (with its min-share) is dropped once its cgroup is gone past the
// grace period.
TEST_F(HostilePodmanTest, HooksdHooksRunNoImageCodeAndAHalfMadeContainerIsForgotten) {
  const std::string mark = world_->file("ran-as-the-host-hook");
  fs::copy_file(QUANTA_HOSTILE_PRELOAD, rootfs_ + "/evil.so", fs::copy_options::overwrite_existing);
  PodmanRun run;
  run.global = {"--hooks-dir", install_.hooks_dir};
  run.annotations = {"quanta.dev/memory-limit=1Gi", "quanta.dev/min-share=25%"};
  run.env = {"LD_PRELOAD=/proc/self/cwd/evil.so", "LD_AUDIT=/proc/self/cwd/evil.so", "LD_LIBRARY_PATH=/proc/self/cwd",
             "GCONV_PATH=/proc/self/cwd", "GLIBC_TUNABLES=glibc.malloc.check=3", "HOSTILE_MARK=" + mark};
  const size_t before = registrations_logged(*world_);
  std::string said;
  run_podman(*world_, rootfs_, run, {"/bin/quanta-tenant", "--json", "info"}, &said);
  EXPECT_FALSE(fs::exists(mark)) << "the image's library ran on the host as the hook: "
                                 << read_file(mark);
  EXPECT_EQ(said.find("quanta-hook:"), std::string::npos) << "a hook stage failed: " << said;
  ASSERT_GT(registrations_logged(*world_), before) << "the createRuntime hook did not register the container:\n"
                                         << world_->arbiter_log();
  // Whatever podman left, the arbiter forgets it: 10 s of grace, then the next heartbeats.
  EXPECT_TRUE(eventually(30, [&] { return registrations(*world_).empty(); }))
      << "a half-made container's registration outlived its cgroup: " << registrations(*world_).dump();
  EXPECT_TRUE(world_->arbiter().running());
}

INSTANTIATE_TEST_SUITE_P(Runtimes, HostileImageTest, ::testing::Values(Runtime::kRunc, Runtime::kCrun),
                         [](const ::testing::TestParamInfo<Runtime>& info) { return std::string(runtime_name(info.param)); });

}  // namespace
}  // namespace quanta::e2e
