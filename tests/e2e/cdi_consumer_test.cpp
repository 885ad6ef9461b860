// The generated specs loaded and applied by a real CDI consumer: podman (its CDI library,
// 0.5.x in Debian 12, the generation NVIDIA Container Toolkit 1.13 carries) resolves the
// devices, applies the edits and runs the hooks. podman's containers then fail on this
// machine's rlimits, after the createRuntime and createContainer hooks and before poststop,
// so each run still proves registration, the edits podman wrote into config.json (captured
// by a runtime wrapper) and unregistration. podman 4.3 reads specs only from /etc/cdi and
// /var/run/cdi: the tests hold a lock there and remove their files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/e2e/containers.h"

namespace quanta::e2e {
namespace {

namespace fs = std::filesystem;
using integration::ArbiterConfig;
using nlohmann::json;

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

// Serialises tests that write into the machine's CDI folders, across test processes.
class CdiFolders {
 public:
  CdiFolders() {
    fs::create_directories("/var/run/cdi");
    fs::create_directories("/etc/cdi");
    fd_ = ::open("/var/run/cdi/.quanta-e2e.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~CdiFolders() {
    std::error_code ec;
    for (const std::string& f : files_) fs::remove(f, ec);
    if (fd_ >= 0) ::close(fd_);
  }
  // Takes ownership of a file placed in a CDI folder.
  const std::string& own(const std::string& path) { return files_.emplace_back(path); }

 private:
  int fd_ = -1;
  std::vector<std::string> files_;
};

class CdiConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "podman as root";
    if (!podman_available()) {
      if (getenv("QUANTA_REQUIRE_E2E") != nullptr) FAIL() << "podman or runc is not installed";
      GTEST_SKIP() << "podman or runc is not installed (scripts/install-deps.sh installs them)";
    }
    ArbiterConfig c;
    c.allow_unregistered = false;
    c.sockets_in_run_dir = true;
    c.extra = "[hook]\ntimeout = \"2s\"\n";
    world_ = std::make_unique<World>(test_name(), c);
    world_->start_arbiter();
    rootfs_ = assemble_rootfs(world_->dir().path());
    // A runtime that keeps the config.json podman wrote (with the CDI edits applied).
    wrapper_ = world_->dir().file("capture-runtime");
    std::ofstream(wrapper_) << "#!/bin/sh\nfor a in \"$@\"; do\n  case \"$prev\" in --bundle|-b) cp \"$a/config.json\" "
                            << world_->dir().file("captured.json")
                            << ";; esac\n  prev=$a\ndone\nexec /usr/sbin/runc \"$@\"\n";
    fs::permissions(wrapper_, fs::perms::owner_all);
  }

  // podman run with the given --device and --annotation arguments (and podman's own
  // `global` options); returns its stderr.
  std::string podman(const std::vector<std::string>& devices, const std::vector<std::string>& annotations,
                     int* code = nullptr, const std::vector<std::string>& global = {}) {
    std::error_code ec;
    fs::remove(world_->dir().file("captured.json"), ec);
    PodmanRun run{.devices = devices, .annotations = annotations, .env = {}, .global = global, .runtime = wrapper_};
    std::string said;
    const int rc = run_podman(*world_, rootfs_, run, {"/bin/quanta-tenant", "--json", "info"}, &said);
    if (code != nullptr) *code = rc;
    return said;
  }

  json captured() const {
    return json::parse(read_file(world_->dir().file("captured.json")), nullptr, false);
  }

  // Quanta's edits in a config.json podman wrote, and the device's marker.
  void expect_quanta_edits(const json& config, const Install& install, const std::string& uuid) {
    ASSERT_TRUE(config.is_object()) << "podman never reached the runtime with a config.json";
    std::map<std::string, std::string> mounts;
    for (const json& m : config["mounts"]) mounts[m["destination"]] = m.value("source", "");
    EXPECT_EQ(mounts["/opt/quanta/lib/libquanta.so"], install.prefix + "/lib/libquanta.so");
    EXPECT_EQ(mounts["/etc/ld.so.preload"], install.prefix + "/etc/ld.so.preload");
    EXPECT_EQ(mounts["/etc/quanta"], install.prefix + "/etc");
    EXPECT_EQ(mounts["/run/quanta"], world_->dir().file("run"));
    for (const char* stage : {"createRuntime", "createContainer", "poststop"}) {
      ASSERT_TRUE(config["hooks"].contains(stage)) << config["hooks"].dump();
      bool ours = false;
      for (const json& h : config["hooks"][stage]) ours = ours || h.value("path", "") == install.prefix + "/bin/quanta-hook";
      EXPECT_TRUE(ours) << stage << ": " << config["hooks"][stage].dump();
    }
    bool marker = false;
    for (const json& e : config["process"]["env"]) marker = marker || e.get<std::string>().find("=" + uuid) != std::string::npos;
    EXPECT_TRUE(marker) << config["process"]["env"].dump();
  }

  // The hook registered a container and poststop unregistered it.
  void expect_registered_then_gone(size_t registered_before) {
    EXPECT_GT(registrations_logged(*world_), registered_before)
        << "the createRuntime hook did not register the container:\n" << world_->arbiter_log();
    EXPECT_TRUE(registrations(*world_).empty()) << "poststop left " << registrations(*world_).dump();
  }

  std::unique_ptr<World> world_;
  std::string rootfs_;
  std::string wrapper_;
};

TEST_F(CdiConsumerTest, PodmanLoadsAndAppliesTheQuantaGpuSpecInJsonAndYaml) {
  CdiFolders folders;
  const std::string uuid = gpu0_uuid(*world_);
  for (const char* ext : {"json", "yaml"}) {
    SCOPED_TRACE(ext);
    Install install = install_quanta(*world_, {}, std::string("quanta.") + ext);
    const std::string placed = folders.own("/var/run/cdi/quanta-e2e-" + std::to_string(getpid()) + "." + ext);
    fs::copy_file(install.spec_path, placed, fs::copy_options::overwrite_existing);
    const size_t before = registrations_logged(*world_);
    int code = 0;
    const std::string err = podman({"quanta.dev/gpu=0"}, {"quanta.dev/weight=3"}, &code);
    EXPECT_EQ(err.find("unresolvable CDI devices"), std::string::npos) << err;
    EXPECT_EQ(err.find("quanta-hook:"), std::string::npos) << "a hook stage failed: " << err;
    if (install.spec.is_null()) install.spec = json::object();
    expect_quanta_edits(captured(), install, uuid);
    expect_registered_then_gone(before);
    fs::remove(placed);
  }
}

TEST_F(CdiConsumerTest, PodmanResolvesTheVendorsDeviceToTheTakeOverWithBothEdits) {
  CdiFolders folders;
  const std::string kind = "quanta-e2e.nvidia.com/gpu";  // not NVIDIA's own kind on a real host
  const std::string vendor_path = folders.own("/etc/cdi/quanta-e2e-vendor-" + std::to_string(getpid()) + ".json");
  std::ofstream(vendor_path) << vendor_spec(*world_, kind).dump(2);
  const std::string takeover_path =
      folders.own("/var/run/cdi/quanta-e2e-takeover-" + std::to_string(getpid()) + ".yaml");
  Install install = install_quanta(
      *world_, {"--take-over", vendor_path, "--spec-dirs", "/etc/cdi," + world_->dir().path()}, "takeover.yaml");
  fs::copy_file(install.spec_path, takeover_path, fs::copy_options::overwrite_existing);

  const size_t before = registrations_logged(*world_);
  const std::string err = podman({kind + "=0"}, {"quanta.dev/weight=3"});
  EXPECT_EQ(err.find("unresolvable CDI devices"), std::string::npos) << err;
  const json config = captured();
  expect_quanta_edits(config, install, gpu0_uuid(*world_));
  // The vendor's own edits came along (its env and its driver mount).
  bool vendor_env = false;
  for (const json& e : config["process"]["env"]) vendor_env = vendor_env || e == "E2E_VENDOR_EDITS=1";
  EXPECT_TRUE(vendor_env) << config["process"]["env"].dump();
  bool driver = false;
  for (const json& m : config["mounts"]) driver = driver || m["destination"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
  EXPECT_TRUE(driver);
  expect_registered_then_gone(before);

  // The hook saw the annotations podman passed: a bad one refuses the container.
  int code = 0;
  const std::string refused = podman({kind + "=0"}, {"quanta.dev/weight=0"}, &code);
  EXPECT_NE(code, 0);
  std::string unquoted = refused;  // runc quotes the hook's stderr Go-style
  for (size_t at; (at = unquoted.find("\\\"")) != std::string::npos;) unquoted.erase(at, 1);
  EXPECT_NE(unquoted.find("quanta-hook: annotation quanta.dev/weight = \"0\" is refused"), std::string::npos) << refused;
}

TEST_F(CdiConsumerTest, TakeOverInTheVendorsOwnFolderWouldDropTheDevice) {
  // Why quanta-hook refuses to write the take-over beside the vendor's spec: the CDI
  // library drops a device two specs of one folder both define.
  CdiFolders folders;
  const std::string kind = "quanta-e2e.nvidia.com/gpu";
  const std::string vendor_path = folders.own("/etc/cdi/quanta-e2e-vendor-" + std::to_string(getpid()) + ".json");
  std::ofstream(vendor_path) << vendor_spec(*world_, kind).dump(2);
  Install install = install_quanta(
      *world_, {"--take-over", vendor_path, "--spec-dirs", "/etc/cdi," + world_->dir().path()}, "takeover.json");
  fs::copy_file(install.spec_path, folders.own("/etc/cdi/quanta-e2e-takeover-" + std::to_string(getpid()) + ".json"),
                fs::copy_options::overwrite_existing);
  const std::string err = podman({kind + "=0"}, {});
  EXPECT_NE(err.find("unresolvable CDI devices"), std::string::npos) << err;

  std::string out;
  std::vector<std::string> argv = {QUANTA_HOOK_BINARY, "cdi", "generate", "--config", world_->config_path(),
                                   "--prefix", install.prefix, "--take-over", vendor_path, "--spec-only",
                                   "--output", "/etc/cdi/quanta-e2e-refused.json"};
  integration::Env env{{"LD_LIBRARY_PATH", QUANTA_SIMGPU_DIR}, {"SIMGPU_STATE", world_->sim_state()}};
  Child g = world_->spawn(argv, env);
  EXPECT_EQ(g.wait(30), 1);
  EXPECT_NE(g.err().find("same CDI folder"), std::string::npos) << g.err();
  EXPECT_FALSE(fs::exists("/etc/cdi/quanta-e2e-refused.json"));
}

TEST_F(CdiConsumerTest, PodmanRunsTheHooksdFilesForAnnotatedContainersOnly) {
  // The hooks.d form (CRI-O, podman): no CDI device, the files match on quanta.dev/*.
  Install install = install_quanta(*world_);
  const std::string hooks_dir = world_->dir().file("hooks.d");
  // The installer's --hooks-dir command line.
  std::vector<std::string> argv = {install.prefix + "/bin/quanta-hook", "hooksd", "generate", "--config",
                                   world_->config_path(), "--prefix", install.prefix, "--output", hooks_dir};
  Child g = world_->spawn(argv, world_->tenant_env("", false));
  ASSERT_EQ(g.wait(30), 0) << g.err();
  for (const char* f : {"quanta-create-runtime.json", "quanta-create-container.json", "quanta-poststop.json"})
    ASSERT_TRUE(fs::exists(hooks_dir + "/" + f)) << f;
  const std::vector<std::string> global = {"--hooks-dir", hooks_dir};

  size_t before = registrations_logged(*world_);
  std::string err = podman({}, {"quanta.dev/weight=3"}, nullptr, global);
  EXPECT_EQ(err.find("quanta-hook:"), std::string::npos) << "a hook stage failed: " << err;
  EXPECT_GT(registrations_logged(*world_), before) << "the createRuntime hook did not register the container:\n"
                                            << world_->arbiter_log();
  // podman keeps hooks.d poststop hooks out of config.json and runs them itself; for a
  // container whose start failed (rlimits, here) it does not, so unregistration is not
  // checked in this form (the CDI form's poststop is, above).
  const json hooks = captured()["hooks"];
  EXPECT_TRUE(hooks.contains("createRuntime") && hooks.contains("createContainer")) << hooks.dump();

  // Not annotated: the files do not match, nothing is registered.
  before = registrations_logged(*world_);
  err = podman({}, {"example.com/other=1"}, nullptr, global);
  EXPECT_EQ(registrations_logged(*world_), before) << "a container without quanta.dev/* annotations was registered";

  // The stages see podman's annotations: a bad one refuses the container with the line.
  int code = 0;
  err = podman({}, {"quanta.dev/weight=0"}, &code, global);
  EXPECT_NE(code, 0);
  for (size_t at; (at = err.find("\\\"")) != std::string::npos;) err.erase(at, 1);
  EXPECT_NE(err.find("quanta-hook: annotation quanta.dev/weight = \"0\" is refused"), std::string::npos) << err;
}

}  // namespace
}  // namespace quanta::e2e
