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
#include <sstream>

#include "test_files.h"

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
    char p[] = "/tmp/quanta-hook-cli-XXXXXX";
    dir_ = mkdtemp(p);
    sim_state_ = "quanta-hook-cli-" + std::to_string(getpid());
    std::ofstream(dir_ + "/quanta.toml") << "[node]\ntenant_socket = \"" << dir_ << "/run/tenant.sock\"\n"
                                         << "admin_socket = \"" << dir_ << "/run/admin.sock\"\n"
                                         << "[hook]\ntimeout = \"300ms\"\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
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
    std::vector<char*> e;
    for (std::string& v : env) e.push_back(v.data());
    e.push_back(nullptr);
    const std::string out = dir_ + "/out", err = dir_ + "/err";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
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

  std::string dir_;
  std::string sim_state_;
};

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
  r = hook({"cdi", "generate", "--config", config(), "--spec-only", "--hook-env", "NOEQUALS", "--output", "-"});
  EXPECT_NE(r.err.find("use KEY=VALUE"), std::string::npos) << r.err;
}

TEST_F(Cli, HooksdGenerateWritesOneFilePerStageMatchingOurAnnotations) {
  Result r = hook({"hooksd", "generate", "--config", config(), "--prefix", dir_ + "/p", "--output", dir_ + "/hooks.d"});
  ASSERT_EQ(r.code, 0) << r.err;
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
