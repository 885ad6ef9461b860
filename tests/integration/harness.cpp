// The integration harness: processes, a private arbiter per test, and the independent
// readers (simgpu execution log, /dev/shm regions) the tests judge by.
#include "tests/integration/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "hosted/admin_client.h"

extern char** environ;

namespace quanta::integration {

namespace {

bool socket_accepts(const std::string& path, int type = SOCK_SEQPACKET) {
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
  const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return ok;
}

}  // namespace

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000ll + ts.tv_nsec;
}

std::string test_name() {
  return ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

std::string start_in(double ms) {
  return std::to_string(realtime_ns() + static_cast<int64_t>(ms * 1e6));
}

void sleep_ms(double ms) {
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(std::fmod(ms, 1000.0) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// ---------------------------------------------------------------------------------------


// ---------------------------------------------------------------------------------------

World::World(const std::string& test_name, ArbiterConfig config, WorldExtras extras)
    : name_(test_name), config_(std::move(config)), extras_(std::move(extras)) {
  static int worlds = 0;
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(worlds++);
  scope_ = "qi" + tag;
  sim_state_ = "quanta-it-" + tag;
  sim_log_ = dir_.file("simgpu.log");
  if (config_.sockets_in_run_dir) mkdir(dir_.file("run").c_str(), 0755);
  tenant_socket_ = dir_.file(config_.sockets_in_run_dir ? "run/tenant.sock" : "tenant.sock");
  // As on a node: the admin socket in a folder of its own, out of what containers mount.
  admin_socket_ = dir_.file(config_.sockets_in_run_dir ? "run-admin/admin.sock" : "admin.sock");
  config_path_ = dir_.file("quanta.toml");
  mkdir(dir_.file("state").c_str(), 0700);
  std::ofstream toml(config_path_);
  toml << "[node]\n"
       << "scope = \"" << scope_ << "\"\n"
       << "tenant_socket = \"" << tenant_socket_ << "\"\n"
       << "admin_socket = \"" << admin_socket_ << "\"\n"
       << "state_dir = \"" << dir_.file("state") << "\"\n"
       << "allow_unregistered = " << (config_.allow_unregistered ? "true" : "false") << "\n";
  if (!config_.nvml_interval.empty()) toml << "nvml_interval = \"" << config_.nvml_interval << "\"\n";
  toml << "[scheduler]\n"
       << "quantum = \"" << config_.quantum << "\"\n"
       << "revoke_timeout = \"" << config_.revoke_timeout << "\"\n"
       << "lease = \"" << config_.lease << "\"\n"
       << "idle_release = \"" << config_.idle_release << "\"\n";
  for (const PodConfig& pod : config_.pods) {
    toml << "[pod.\"" << pod.name << "\"]\n" << "weight = " << pod.weight << "\n";
    if (!pod.memory_limit.empty()) toml << "memory_limit = \"" << pod.memory_limit << "\"\n";
  }
  toml << config_.extra;
}

World::~World() {
  if (arbiter_.running()) {
    arbiter_.signal(SIGTERM);
    if (arbiter_.wait(2) < 0) arbiter_.signal(SIGKILL);
  }
  arbiter_ = Child();
  shm_unlink(("/" + sim_state_).c_str());
  // Regions of a killed arbiter stay behind; this scope is ours alone.
  if (DIR* shm = opendir("/dev/shm")) {
    const std::string prefix = scope_ + ".";
    while (dirent* entry = readdir(shm)) {
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) shm_unlink(("/" + std::string(entry->d_name)).c_str());
    }
    closedir(shm);
  }
}

Env World::tenant_env(const std::string& pod, bool preload) const {
  Env env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text = *entry;
    const auto equals = text.find('=');
    if (equals != std::string::npos) env[text.substr(0, equals)] = text.substr(equals + 1);
  }
  for (auto it = env.begin(); it != env.end();) {
    it = it->first.rfind("QUANTA_", 0) == 0 || it->first.rfind("SIMGPU_", 0) == 0 ? env.erase(it) : std::next(it);
  }
  env["LD_LIBRARY_PATH"] = QUANTA_SIMGPU_DIR;
  env["SIMGPU_STATE"] = sim_state_;
  env["SIMGPU_LOG"] = sim_log_;
  for (const auto& [key, value] : extras_.sim_env) env[key] = value;
  env["QUANTA_SOCKET"] = tenant_socket_;
  if (!pod.empty()) env["QUANTA_POD"] = pod;
  env.erase("LD_PRELOAD");
  if (preload) {
    env["LD_PRELOAD"] = QUANTA_SHIM_LIBRARY;
    // A sanitizer build instruments the tenant; the shim is built without sanitizers and
    // comes first in the library list, which ASan would otherwise refuse.
    env["ASAN_OPTIONS"] = "verify_asan_link_order=0:detect_leaks=0";
  }
  return env;
}

Child World::spawn(const std::vector<std::string>& argv, const Env& env) {
  const int n = spawned_++;
  return Child(argv, env, dir_.file("out." + std::to_string(n)), dir_.file("err." + std::to_string(n)));
}

Child World::spawn_on_node(const std::string& node_conf, const std::string& container_conf,
                           const std::vector<std::string>& argv, const Env& env) {
  const int n = spawned_;
  const std::string files = dir_.file("etc." + std::to_string(n));
  mkdir(files.c_str(), 0700);
  if (!node_conf.empty()) std::ofstream(files + "/node.conf") << node_conf;
  if (!container_conf.empty()) std::ofstream(files + "/container.conf") << container_conf;
  std::vector<std::string> wrapped = {QUANTA_ETC_RUNNER, files, dir_.file("scratch." + std::to_string(n)), "--"};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return spawn(wrapped, env);
}

bool World::node_files_supported() {
  static const int supported = [] {
    TempDir dir;
    const pid_t pid = fork();
    if (pid == 0) {
      execl(QUANTA_ETC_RUNNER, QUANTA_ETC_RUNNER, dir.path().c_str(), dir.file("scratch").c_str(), "--",
            "/bin/true", static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 1 : 0;
  }();
  return supported == 1;
}

Child World::spawn_tenant(const std::vector<std::string>& args, const std::string& pod, bool preload, Env extra) {
  std::vector<std::string> argv = {QUANTA_TENANT_BINARY, "--json"};
  argv.insert(argv.end(), args.begin(), args.end());
  Env env = tenant_env(pod, preload);
  for (auto& [key, value] : extra) env[key] = value;
  return spawn(argv, env);
}

void World::start_arbiter(const std::string& binary) {
  unlink(tenant_socket_.c_str());
  Env env = tenant_env("", false);
  env["QUANTA_LOG_LEVEL"] = "info";
  const int run = arbiter_runs_++;
  const char* other = getenv("QUANTA_TEST_ARBITER");  // an older build, to show a regression
  const std::string program = !binary.empty() ? binary : other != nullptr ? other : QUANTA_ARBITER_BINARY;
  arbiter_ = Child({program, "--foreground", "--config", config_path_}, env,
                   dir_.file("arbiter.out." + std::to_string(run)), dir_.file("arbiter.log." + std::to_string(run)));
  arbiter_pid_.store(arbiter_.pid());
  const bool up = eventually(10.0, [&] {
    if (!arbiter_.running()) return true;
    struct stat st {};
    // Up: both sockets accept (the tenant socket is bound first, the admin socket after it).
    return stat(tenant_socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && socket_accepts(tenant_socket_) &&
           socket_accepts(admin_socket_, SOCK_STREAM);
  });
  ASSERT_TRUE(up && arbiter_.running()) << "quanta-arbiter did not come up; its log:\n" << arbiter_log();
}

void World::kill_arbiter(int sig) {
  arbiter_.signal(sig);
  arbiter_.wait(10);
  arbiter_pid_.store(0);
}

std::set<pid_t> World::connected_pids() const {
  std::set<pid_t> out;
  const nlohmann::json status = admin({{"cmd", "status"}});
  for (const auto& gpu : status.value("gpus", nlohmann::json::array()))
    for (const auto& t : gpu.value("tenants", nlohmann::json::array()))
      if (t.value("connected", false)) out.insert(t.value("pid", 0));
  return out;
}

nlohmann::json World::admin(const nlohmann::json& request) const {
  // The client quantactl and the hook use: a refusal comes back as the arbiter's error
  // line, a broken or silent connection as an error naming it, never as SIGPIPE.
  const hosted::AdminReply reply =
      hosted::admin_request(admin_socket_, request, 5'000'000'000, hosted::kStatusAnswerBytes);
  if (reply.outcome != hosted::AdminOutcome::kUnreachable) return reply.response;
  return {{"ok", false}, {"error", "admin socket unreachable: " + reply.reason}};
}

std::string World::arbiter_log() const {
  std::string text;
  for (int run = 0; run < arbiter_runs_; ++run) text += read_file(dir_.file("arbiter.log." + std::to_string(run)));
  return text + read_file(dir_.file("state/quanta-arbiter.log"));
}

// ---------------------------------------------------------------------------------------

std::vector<Slice> read_sim_log(const std::string& path) {
  std::vector<Slice> slices;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string kind;
    Slice slice;
    unsigned long long context = 0, start = 0, end = 0;
    long pid = 0;
    if (!(fields >> kind) || kind != "slice") continue;
    if (!(fields >> slice.device >> context >> pid >> start >> end)) continue;
    slice.context = context;
    slice.pid = static_cast<pid_t>(pid);
    slice.start_ns = start;
    slice.end_ns = end;
    slices.push_back(slice);
  }
  std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) { return a.start_ns < b.start_ns; });
  return slices;
}

std::vector<Hold> holds_of(const std::vector<Slice>& slices) {
  std::vector<Hold> holds;
  for (const Slice& slice : slices) {
    if (slice.device != 0) continue;
    if (!holds.empty() && holds.back().pid == slice.pid) {
      holds.back().end_ns = std::max(holds.back().end_ns, slice.end_ns);
    } else {
      holds.push_back(Hold{slice.pid, slice.start_ns, slice.end_ns});
    }
  }
  return holds;
}

std::map<pid_t, uint64_t> busy_by_pid(const std::vector<Slice>& slices, uint64_t from, uint64_t to) {
  std::map<pid_t, uint64_t> busy;
  for (const Slice& slice : slices) {
    const uint64_t start = std::max(slice.start_ns, from);
    const uint64_t end = std::min(slice.end_ns, to);
    if (end > start) busy[slice.pid] += end - start;
  }
  return busy;
}

// ---------------------------------------------------------------------------------------

int open_arbiter_region(const World& world, const std::string& name, int flags, uint32_t layout) {
  const pid_t pid = world.arbiter_pid();
  if (pid <= 0) return -1;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  const std::string memfd = "/memfd:" + name + " (deleted)";
  const std::string named = "/dev/shm/" + name;  // arbiters before sealed memfds
  DIR* fds = opendir(dir.c_str());
  if (fds == nullptr) return -1;
  int out = -1;
  while (dirent* entry = readdir(fds)) {
    char link[512] = {};
    const std::string path = dir + "/" + entry->d_name;
    if (readlink(path.c_str(), link, sizeof link - 1) <= 0 || (memfd != link && named != link)) continue;
    out = open(path.c_str(), flags | O_CLOEXEC);
    uint32_t head[2] = {0, 0};
    if (out >= 0 && layout != 0 &&
        (pread(out, head, sizeof head, 0) != static_cast<ssize_t>(sizeof head) || head[1] != layout)) {
      close(out);
      out = -1;
      continue;
    }
    if (out >= 0) break;
  }
  closedir(fds);
  return out;
}

namespace {

template <typename T>
const T* map_region(const World& world, const std::string& name) {
  const int fd = open_arbiter_region(world, name, O_RDONLY, common::kLayoutVersion);
  if (fd < 0) return nullptr;
  struct stat st {};
  const T* region = nullptr;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(T)) {
    void* address = mmap(nullptr, sizeof(T), PROT_READ, MAP_SHARED, fd, 0);
    if (address != MAP_FAILED) region = static_cast<const T*>(address);
  }
  close(fd);
  return region;
}

}  // namespace

ControlView::ControlView(const World& world, uint32_t gpu_index)
    : world_(world), gpu_index_(gpu_index), region_(map_region<common::ControlRegion>(world, world.scope() + ".gpu." + std::to_string(gpu_index))) {}

ControlView::~ControlView() {
  if (region_) munmap(const_cast<common::ControlRegion*>(region_), sizeof(common::ControlRegion));
}

uint32_t ControlView::slot_of(pid_t pid) const {
  if (!region_) return common::kNoSlot;
  for (uint32_t index = 0; index < 256; ++index) {
    PodView view(world_, index);
    if (!view.ok()) continue;
    for (const common::ProcEntry& entry : view->procs) {
      if (entry.pid.load() != static_cast<uint32_t>(pid)) continue;
      const uint32_t slot = entry.limits[gpu_index_].slot.load();
      if (slot < common::kMaxSlotsPerGpu && region_->slots[slot].owner.load() != 0) return slot;
    }
  }
  return common::kNoSlot;
}

PodView::PodView(const World& world, uint32_t pod_index)
    : region_(map_region<common::PodRegion>(world, world.scope() + ".pod." + std::to_string(pod_index))) {}

PodView::~PodView() {
  if (region_) munmap(const_cast<common::PodRegion*>(region_), sizeof(common::PodRegion));
}

int find_pod_region(const World& world, const std::string& pod_key) {
  for (uint32_t index = 0; index < 256; ++index) {
    PodView view(world, index);
    if (!view.ok()) continue;
    const std::string key(view->header.pod_key, strnlen(view->header.pod_key, sizeof view->header.pod_key));
    if (key == pod_key || (key.size() > pod_key.size() && key.compare(key.size() - pod_key.size(), pod_key.size(), pod_key) == 0 &&
                           (key[key.size() - pod_key.size() - 1] == '/' || key[key.size() - pod_key.size() - 1] == ':')))
      return static_cast<int>(index);
  }
  return -1;
}

}  // namespace quanta::integration
