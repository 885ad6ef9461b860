// The hook stages against a fake arbiter (a unix socket that answers, refuses or stays
// silent) and temp bundles: what create-runtime registers and writes, the [hook] timeout and
// [enforce] unplaced, poststop, and create-container's read-only mounts (in a child in a
// private mount namespace, root only: an image's symlinks must not lead a mount outside).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "hooks/error.h"
#include "hooks/layout.h"
#include "hooks/stages.h"
#include "tests/hooks/test_files.h"
#include "tests/support/temp_dir.h"

namespace quanta::hooks {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test_support::TempDir;

// An admin socket that answers `register`/`unregister` as told and keeps the requests.
class FakeArbiter {
 public:
  enum class Mode { kAnswer, kRefuse, kSilent };
  FakeArbiter(const std::string& path, Mode mode) : mode_(mode) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 8);
    if (mode_ != Mode::kSilent) thread_ = std::thread([this] { serve(); });
  }
  ~FakeArbiter() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    if (thread_.joinable()) thread_.join();
  }
  std::vector<json> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  void serve() {
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      char buf[4096];
      ssize_t n;
      while (in.find('\n') == std::string::npos && (n = ::read(c, buf, sizeof buf)) > 0) in.append(buf, n);
      json req = json::parse(in.substr(0, in.find('\n')), nullptr, false);
      {
        std::lock_guard lock(mu_);
        requests_.push_back(req);
      }
      json answer = mode_ == Mode::kAnswer ? json{{"ok", true}, {"pod", "answered/pod"}}
                                           : json{{"ok", false}, {"error", "pod key uid:x is too long"}};
      const std::string line = answer.dump() + "\n";
      ssize_t ignored = ::write(c, line.data(), line.size());
      (void)ignored;
      ::close(c);
    }
  }

  int fd_ = -1;
  Mode mode_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<json> requests_;
};

struct Fixture {
  TempDir dir{"quanta-hook-test"};
  std::string bundle = dir.file("bundle");

  StageContext context(const json& annotations, const std::vector<std::string>& env = {}) {
    fs::create_directories(bundle + "/rootfs");
    json config{{"ociVersion", "1.0.2"},
                {"root", {{"path", "rootfs"}}},
                {"process", {{"env", env}}},
                {"annotations", annotations}};
    std::ofstream(bundle + "/config.json") << config.dump();
    StageContext ctx;
    ctx.config.admin_socket = dir.file("admin.sock");
    ctx.config.hook.timeout_ns = 300'000'000;
    ctx.state.id = "c1";
    ctx.state.pid = 4242;
    ctx.state.bundle = bundle;
    ctx.cgroup = [](pid_t pid) { return "/kubepods/pod-u1/c" + std::to_string(pid); };
    ctx.devices = [] {
      DeviceTable t;
      t.entries = {{"0", "GPU-aaaaaaaa-0000-0000-0000-000000000000", 0, false}};
      return t;
    };
    return ctx;
  }
};

const json kPod = {{"io.kubernetes.cri.container-type", "container"},
                   {"io.kubernetes.cri.sandbox-name", "web"},
                   {"io.kubernetes.cri.sandbox-namespace", "prod"},
                   {"io.kubernetes.cri.sandbox-uid", "u1"},
                   {"io.kubernetes.cri.container-name", "server"}};

json with(json base, const json& more) {
  for (const auto& [k, v] : more.items()) base[k] = v;
  return base;
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const HookError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CreateRuntime, RegistersEveryFieldAndWritesContainerConf) {
  Fixture f;
  FakeArbiter arbiter(f.dir.file("admin.sock"), FakeArbiter::Mode::kAnswer);
  StageContext ctx = f.context(with(kPod, {{"quanta.dev/weight", "3"}, {"quanta.dev/memory-limit", "2Gi"}}),
                               {"NVIDIA_VISIBLE_DEVICES=0"});
  create_runtime(ctx);
  const auto requests = arbiter.requests();
  ASSERT_EQ(requests.size(), 1u);
  const json& r = requests[0];
  EXPECT_EQ(r["cmd"], "register");
  EXPECT_EQ(r["container_id"], "c1");
  EXPECT_EQ(r["pod_uid"], "u1");
  EXPECT_EQ(r["pod_name"], "web");
  EXPECT_EQ(r["pod_namespace"], "prod");
  EXPECT_EQ(r["container_name"], "server");
  EXPECT_EQ(r["cgroup_path"], "/kubepods/pod-u1/c4242");
  EXPECT_EQ(r["devices"], json::array({"GPU-aaaaaaaa-0000-0000-0000-000000000000"}));
  EXPECT_EQ(r["policy"], (json{{"weight", "3"}, {"memory-limit", "2Gi"}}));
  const std::string conf = read(f.bundle + "/" + kBundleContainerConf);
  EXPECT_NE(conf.find("\npod = answered/pod\nmemory_limit = 1\nunplaced = closed\n"), std::string::npos)
      << "the arbiter's pod key, the cap, the default rule resolved for a capped pod: " << conf;
  EXPECT_EQ(fs::status(f.bundle + "/" + kBundleContainerConf).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
}

TEST(CreateRuntime, SilentArbiterTimesOutAndUnplacedDecides) {
  Fixture f;
  FakeArbiter silent(f.dir.file("admin.sock"), FakeArbiter::Mode::kSilent);
  // Uncapped under closed-if-capped: starts ungated, says so, within the timeout.
  StageContext ctx = f.context(with(kPod, {{"quanta.dev/weight", "2"}}));
  double t0 = now_s();
  create_runtime(ctx);
  EXPECT_LT(now_s() - t0, 2.0) << "the 300ms timeout did not bound the wait";
  EXPECT_GE(now_s() - t0, 0.25);
  ASSERT_EQ(ctx.notes.size(), 1u);
  EXPECT_NE(ctx.notes[0].find("starts ungated and uncapped"), std::string::npos) << ctx.notes[0];
  EXPECT_NE(ctx.notes[0].find("did not answer within 0.3s"), std::string::npos) << ctx.notes[0];
  EXPECT_NE(read(f.bundle + "/" + kBundleContainerConf).find("unplaced = open"), std::string::npos);

  // Capped: refused.
  ctx = f.context(with(kPod, {{"quanta.dev/memory-limit", "1Gi"}}));
  t0 = now_s();
  std::string e = error_of([&] { create_runtime(ctx); });
  EXPECT_LT(now_s() - t0, 2.0);
  EXPECT_NE(e.find("[enforce] unplaced = closed-if-capped (the pod asked for a memory limit)"), std::string::npos) << e;
  EXPECT_NE(e.find("refusing container c1 of pod prod/web"), std::string::npos) << e;

  // closed refuses every pod; open lets a capped one start.
  ctx = f.context(kPod);
  ctx.config.enforce.unplaced = config::UnplacedAction::kClosed;
  EXPECT_NE(error_of([&] { create_runtime(ctx); }).find("unplaced = closed"), std::string::npos);
  ctx = f.context(with(kPod, {{"quanta.dev/memory-limit", "1Gi"}}));
  ctx.config.enforce.unplaced = config::UnplacedAction::kOpen;
  EXPECT_EQ(error_of([&] { create_runtime(ctx); }), "(no error)");
}

TEST(CreateRuntime, NoArbiterAtAllIsUnreachable) {
  Fixture f;
  StageContext ctx = f.context(kPod);
  create_runtime(ctx);
  ASSERT_EQ(ctx.notes.size(), 1u);
  EXPECT_NE(ctx.notes[0].find("cannot connect to the arbiter's admin socket"), std::string::npos) << ctx.notes[0];
}

TEST(CreateRuntime, ArbitersRefusalFailsTheContainer) {
  Fixture f;
  FakeArbiter arbiter(f.dir.file("admin.sock"), FakeArbiter::Mode::kRefuse);
  StageContext ctx = f.context(kPod);
  EXPECT_EQ(error_of([&] { create_runtime(ctx); }),
            "the arbiter refused container c1 of pod prod/web: pod key uid:x is too long");
  EXPECT_FALSE(fs::exists(f.bundle + "/" + kBundleContainerConf));
}

TEST(CreateRuntime, RefusedAnnotationOrSandboxRegistersNothing) {
  Fixture f;
  FakeArbiter arbiter(f.dir.file("admin.sock"), FakeArbiter::Mode::kAnswer);
  StageContext bad = f.context(with(kPod, {{"quanta.dev/priority", "urgent"}}));
  EXPECT_NE(error_of([&] { create_runtime(bad); }).find("annotation quanta.dev/priority = \"urgent\" is refused"),
            std::string::npos);
  StageContext sandbox = f.context(with(kPod, {{"io.kubernetes.cri.container-type", "sandbox"}}));
  create_runtime(sandbox);
  EXPECT_TRUE(arbiter.requests().empty());
  EXPECT_FALSE(fs::exists(f.bundle + "/" + kBundleContainerConf));
}

TEST(Poststop, UnregistersAndCleansUp) {
  Fixture f;
  StageContext ctx = f.context(kPod);
  std::ofstream(f.bundle + "/" + kBundleContainerConf) << "pod = x\n";
  {
    FakeArbiter arbiter(f.dir.file("admin.sock"), FakeArbiter::Mode::kAnswer);
    poststop(ctx);
    ASSERT_EQ(arbiter.requests().size(), 1u);
    EXPECT_EQ(arbiter.requests()[0], (json{{"cmd", "unregister"}, {"container_id", "c1"}}));
  }
  EXPECT_FALSE(fs::exists(f.bundle + "/" + kBundleContainerConf));
  // No arbiter: a note, not a failure (the container is gone either way).
  unlink(f.dir.file("admin.sock").c_str());
  StageContext later = f.context(kPod);
  poststop(later);
  ASSERT_EQ(later.notes.size(), 1u);
  EXPECT_NE(later.notes[0].find("could not be unregistered"), std::string::npos);
  // A bundle already gone still unregisters by id.
  fs::remove_all(f.bundle);
  StageContext gone = f.context(kPod);
  fs::remove(f.bundle + "/config.json");
  FakeArbiter arbiter(f.dir.file("admin.sock"), FakeArbiter::Mode::kAnswer);
  poststop(gone);
  EXPECT_EQ(arbiter.requests().size(), 1u);
}

// Runs `body` in a child with a private mount namespace; its exit code is the failures.
int in_private_mount_namespace(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(100);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200;
}

TEST(CreateContainer, MountsQuantasFilesReadOnlyInsideTheImageOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting needs root";
  Fixture f;
  // The host side of an installation, and a tenant socket folder.
  const std::string prefix = f.dir.file("prefix");
  fs::create_directories(prefix + "/lib");
  fs::create_directories(prefix + "/etc");
  std::ofstream(prefix + "/lib/libquanta.so") << "ELF";
  std::ofstream(prefix + "/etc/ld.so.preload") << "/opt/quanta/lib/libquanta.so\n";
  std::ofstream(prefix + "/etc/node.conf") << "enforce = on\n";
  std::ofstream(prefix + "/etc/container.conf") << "# placeholder\n";
  fs::create_directories(f.dir.file("run"));
  // An image whose /opt points outside it: the hook must stay inside.
  const std::string outside = f.dir.file("outside");
  fs::create_directories(outside);
  StageContext ctx = f.context(kPod);
  const std::string rootfs = f.bundle + "/rootfs";
  fs::create_directories(rootfs + "/etc");
  fs::create_symlink(outside, rootfs + "/opt");
  std::ofstream(f.bundle + "/" + kBundleContainerConf) << "pod = prod/web\nmemory_limit = 0\nunplaced = open\n";
  ctx.layout.prefix = prefix;
  ctx.layout.host_socket = f.dir.file("run/tenant.sock");

  const int failures = in_private_mount_namespace([&] {
    // A read-only image, as crun leaves it before createContainer hooks.
    if (mount(rootfs.c_str(), rootfs.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        mount(nullptr, rootfs.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0)
      return 90;
    int bad = 0;
    try {
      create_container(ctx);
    } catch (const HookError& e) {
      std::fprintf(stderr, "create_container: %s\n", e.what());
      return 91;
    }
    auto expect = [&bad](bool ok, const char* what) {
      if (!ok) {
        std::fprintf(stderr, "expected: %s\n", what);
        ++bad;
      }
    };
    expect(read(rootfs + "/etc/quanta/container.conf").find("pod = prod/web") == 0, "container.conf is this container's");
    expect(read(rootfs + "/etc/quanta/node.conf") == "enforce = on\n", "node.conf through /etc/quanta");
    expect(read(rootfs + "/etc/ld.so.preload") == "/opt/quanta/lib/libquanta.so\n", "the preload list");
    expect(read(rootfs + outside + "/quanta/lib/libquanta.so") == "ELF",
           "the library where the image's /opt symlink leads, resolved inside the image");
    expect(fs::is_empty(outside), "nothing created outside the image");
    std::ofstream w(rootfs + "/etc/quanta/container.conf");
    w << "tampered";
    w.flush();
    expect(!w, "container.conf is read-only");
    expect(access((rootfs + "/etc/quanta/node.conf").c_str(), W_OK) != 0 && errno == EROFS, "node.conf is read-only");
    std::ofstream probe(rootfs + "/newfile");
    expect(!probe, "the image is read-only again after the mount points were made");
    return bad;
  });
  EXPECT_EQ(failures, 0);
  EXPECT_TRUE(fs::is_empty(outside)) << "the host folder the image's symlink names was written";
  EXPECT_EQ(read(prefix + "/etc/container.conf"), "# placeholder\n") << "the placeholder itself never changes";
}

TEST(CreateContainer, WithoutCreateRuntimeItSaysSo) {
  Fixture f;
  StageContext ctx = f.context(kPod);
  EXPECT_NE(error_of([&] { create_container(ctx); }).find("the createRuntime stage (quanta-hook oci create-runtime) did not run"),
            std::string::npos);
}

}  // namespace
}  // namespace quanta::hooks
