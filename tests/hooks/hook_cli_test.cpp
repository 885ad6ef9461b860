// quanta-hook as the runtime and the installer run it: exit codes, one-line errors on
// stderr, the backstop behind [hook] timeout, and the files `cdi generate` and
// `hooksd generate` write (NVML is simgpu's).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/hooks/test_files.h"
#include "tests/support/temp_dir.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Result {
  int code = -1;
  std::string out, err;
  double seconds = 0;
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // a hook that stops reading an oversized state
    sim_state_ = "quanta-hook-cli-" + std::to_string(getpid());
    std::ofstream(dir_ + "/quanta.toml") << "[node]\ntenant_socket = \"" << dir_ << "/run/tenant.sock\"\n"
                                         << "admin_socket = \"" << dir_ << "/run/admin.sock\"\n"
                                         << "[hook]\ntimeout = \"300ms\"\n";
  }
  void TearDown() override {
    shm_unlink(("/" + sim_state_).c_str());
  }

  // Runs quanta-hook ARGS with `input` on stdin (closed after it unless keep_stdin_open).
  Result hook(const std::vector<std::string>& args, const std::string& input = "", bool keep_stdin_open = false) {
    int in[2];
    EXPECT_EQ(pipe(in), 0);
    std::vector<std::string> argv = {QUANTA_HOOK_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c;
    for (std::string& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    std::vector<std::string> env = {"LD_LIBRARY_PATH=" + std::string(QUANTA_SIM_DIR), "SIMGPU_STATE=" + sim_state_,
                                    "SIMGPU_DEVICES=2", "PATH=/usr/bin:/bin"};
    env.insert(env.end(), extra_env_.begin(), extra_env_.end());
    std::vector<char*> e;
    for (std::string& v : env) e.push_back(v.data());
    e.push_back(nullptr);
    const std::string out = dir_ + "/out", err = dir_ + "/err";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (!cwd_.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd_.c_str());
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    const double t0 = now_s();
    EXPECT_EQ(posix_spawn(&pid, c[0], &actions, nullptr, c.data(), e.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    for (size_t off = 0; off < input.size();) {
      const ssize_t n = write(in[1], input.data() + off, input.size() - off);
      if (n <= 0) break;  // the hook stopped reading
      off += static_cast<size_t>(n);
    }
    if (!keep_stdin_open) close(in[1]);
    int status = 0;
    Result r;
    for (;;) {
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      if (now_s() - t0 > 30) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      usleep(5000);
    }
    if (keep_stdin_open) close(in[1]);
    r.seconds = now_s() - t0;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read(out);
    r.err = read(err);
    return r;
  }

  std::string config() const { return dir_ + "/quanta.toml"; }

  quanta::test_support::TempDir scratch_{"quanta-hook-cli"};
  const std::string dir_ = scratch_.path();
  std::string sim_state_;
  std::vector<std::string> extra_env_;  // more of the hook's environment
  std::string cwd_;                     // its working directory ("" = the test's)
};

// Runs argv with exactly `env`; its exit code.
int run_with(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  std::vector<std::string> a = argv, e = env;
  std::vector<char*> ca, ce;
  for (std::string& x : a) ca.push_back(x.data());
  for (std::string& x : e) ce.push_back(x.data());
  ca.push_back(nullptr);
  ce.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, ca[0], nullptr, nullptr, ca.data(), ce.data()) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// runc runs a hook whose spec names no env in the container's environment, with the image's
// rootfs as working directory, as host root: whatever the runtime hands over, nothing from
// the image may run in the hook (bin/quanta-hook is a static launcher; hooks/launcher.c).
TEST_F(Cli, AStageRunsNothingAnImageNamesInItsEnvironmentOrWorkingDirectory) {
  const std::string rootfs = dir_ + "/rootfs", mark = dir_ + "/ran-as-the-hook";
  fs::create_directories(rootfs + "/gconv");
  fs::copy_file(QUANTA_HOSTILE_PRELOAD, rootfs + "/evil.so");
  // The library does run where a loader is told to load it: the mark below proves it.
  const std::string probe = dir_ + "/probe-mark";
  ASSERT_EQ(run_with({"/bin/true"}, {"LD_PRELOAD=" + rootfs + "/evil.so", "HOSTILE_MARK=" + probe}), 0);
  ASSERT_TRUE(fs::exists(probe)) << "the hostile library does not record where it runs";

  extra_env_ = {"LD_PRELOAD=/proc/self/cwd/evil.so", "LD_AUDIT=/proc/self/cwd/evil.so",
                "LD_LIBRARY_PATH=/proc/self/cwd", "GCONV_PATH=/proc/self/cwd/gconv",
                "GLIBC_TUNABLES=glibc.malloc.check=3", "MALLOC_CHECK_=3", "HOSTILE_MARK=" + mark};
  cwd_ = rootfs;
  const std::string state = json{{"ociVersion", "1.0.2"}, {"id", "c1"}, {"status", "creating"}, {"pid", getpid()},
                                 {"bundle", dir_ + "/no-bundle"}, {"annotations", json::object()}}
                                .dump();
  for (const char* stage : {"create-runtime", "create-container", "poststop"}) {
    Result r = hook({"oci", stage, "--config", config()}, state);
    EXPECT_EQ(r.err.find("uid"), std::string::npos) << stage << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists(mark)) << "the image's library ran in the hook: " << read(mark);
  // The operator's own commands keep the caller's environment (the installer's).
  // (A sanitizer build's program wants its runtime first; the preloaded library is first.)
  extra_env_ = {"LD_PRELOAD=/proc/self/cwd/evil.so", "HOSTILE_MARK=" + mark, "ASAN_OPTIONS=verify_asan_link_order=0"};
  Result r = hook({"cdi", "generate", "--config", config(), "--spec-only", "--output", "-"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(mark)) << "cdi generate runs with the caller's environment, loader variables included";
}

TEST_F(Cli, MalformedOrMissingStateIsOneLineNotACrash) {
  for (const std::string& input : {std::string("{not json"), std::string("[]"), std::string("{\"id\":\"x\"}"),
                                   std::string(1 << 21, 'x')}) {
    Result r = hook({"oci", "create-runtime", "--config", config()}, input);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("quanta-hook: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  Result r = hook({"oci", "poststop", "--config", config()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no OCI state on stdin"), std::string::npos) << r.err;
}

TEST_F(Cli, StuckStageGivesUpAtTwiceTheTimeout) {
  // A runtime that never closes stdin stands for anything the stage could hang on.
  Result r = hook({"oci", "create-runtime", "--config", config()}, "", /*keep_stdin_open=*/true);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("create-runtime gave up after 1s (twice [hook] timeout)"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_GE(r.seconds, 0.5);
}

TEST_F(Cli, BadConfigIsRefusedWithFileLineAndKey) {
  std::ofstream(dir_ + "/bad.toml") << "[hook]\ntimeout = \"forever\"\n";
  Result r = hook({"oci", "create-runtime", "--config", dir_ + "/bad.toml"}, "{}");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("bad.toml:2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hook.timeout"), std::string::npos) << r.err;
  r = hook({"oci", "create-runtime", "--config", dir_ + "/missing.toml"}, "{}");
  EXPECT_NE(r.err.find("cannot read the config file"), std::string::npos) << "a named config must exist: " << r.err;
}

TEST_F(Cli, CdiGenerateWritesTheSpecAndNodeFilesAtomically) {
  const std::string prefix = dir_ + "/prefix";
  Result r = hook({"cdi", "generate", "--config", config(), "--prefix", prefix, "--output", dir_ + "/cdi/quanta.json"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string& written : {dir_ + "/cdi/quanta.json", prefix + "/etc/node.conf"})
    EXPECT_NE(r.err.find("quanta-hook: wrote " + written + "\n"), std::string::npos) << r.err;
  json spec = json::parse(read(dir_ + "/cdi/quanta.json"));
  EXPECT_EQ(spec["kind"], "quanta.dev/gpu");
  EXPECT_EQ(spec["devices"].size(), 5u) << "two GPUs by index and UUID, and all";
  EXPECT_EQ(read(prefix + "/etc/ld.so.preload"), "/opt/quanta/lib/libquanta.so\n");
  const std::string node = read(prefix + "/etc/node.conf");
  EXPECT_NE(node.find("socket = /run/quanta/tenant.sock"), std::string::npos) << node;
  EXPECT_NE(node.find("unplaced = closed-if-capped"), std::string::npos) << node;
  EXPECT_TRUE(fs::exists(prefix + "/etc/container.conf"));
  for (const auto& folder : {dir_ + "/cdi", prefix + "/etc"})
    for (const auto& entry : fs::directory_iterator(folder))
      EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << "left behind: " << entry.path();

  r = hook({"cdi", "generate", "--config", config(), "--spec-only", "--output", "-", "--format", "yaml"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("---\ncdiVersion: \"0.5.0\"", 0), 0u) << r.out.substr(0, 80);

  r = hook({"cdi", "generate", "--config", config(), "--spec-only", "--output", dir_ + "/x.yaml", "--format", "json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("does not match the extension"), std::string::npos) << r.err;
  r = hook({"cdi", "generate", "--config", config(), "--spec-only", "--socket", "relative.sock", "--output", "-"});
  EXPECT_NE(r.err.find("use an absolute path"), std::string::npos) << r.err;
  r = hook({"cdi", "generate", "--config", config(), "--spec-only", "--hook-env", "LD_PRELOAD=/x.so", "--output", "-"});
  EXPECT_NE(r.code, 0) << "the hooks' environment is fixed: no option adds to it";
}

TEST_F(Cli, VersionNamesTheReleaseAndTheInterfacesItSpeaks) {
  const Result r = hook({"--version"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("quanta-hook [0-9]+\\.[0-9]+\\.[0-9]+ \\(shared-memory "
                                                 "layout [0-9]+, tenant protocol [0-9]+\\)\n")))
      << r.out;
  EXPECT_EQ(hook({"cdi", "generate", "--no-such-option"}).code, 2) << "a usage error exits 2";
}

TEST_F(Cli, HooksdGenerateWritesOneFilePerStageMatchingOurAnnotations) {
  Result r = hook({"hooksd", "generate", "--config", config(), "--prefix", dir_ + "/p", "--output", dir_ + "/hooks.d"});
  ASSERT_EQ(r.code, 0) << r.err;
  // It names every file it wrote, the node files under the prefix too.
  for (const std::string& written :
       {dir_ + "/hooks.d/quanta-create-runtime.json", dir_ + "/hooks.d/quanta-poststop.json",
        dir_ + "/p/etc/node.conf", dir_ + "/p/etc/ld.so.preload", dir_ + "/p/etc/container.conf"})
    EXPECT_NE(r.err.find("quanta-hook: wrote " + written + "\n"), std::string::npos) << r.err;
  for (const auto& [file, stage] : {std::pair{"quanta-create-runtime.json", "createRuntime"},
                                    std::pair{"quanta-create-container.json", "createContainer"},
                                    std::pair{"quanta-poststop.json", "poststop"}}) {
    json h = json::parse(read(dir_ + "/hooks.d/" + file));
    EXPECT_EQ(h["version"], "1.0.0");
    EXPECT_EQ(h["stages"], json::array({stage}));
    EXPECT_EQ(h["hook"]["path"], dir_ + "/p/bin/quanta-hook");
    EXPECT_EQ(h["when"]["annotations"].begin().key(), "^quanta\\.dev/");
  }
  r = hook({"hooksd", "generate", "--config", config(), "--format", "yaml", "--output", "-"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("hooks.d files are json"), std::string::npos);
}

}  // namespace
