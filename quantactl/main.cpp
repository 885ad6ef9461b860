// quantactl: the arbiter's admin client. `status` prints a table per GPU (or the raw JSON
// with --json, schema in docs/quantactl-status.md); `top` refreshes a contention view and
// `explain POD` tells a pod's last minute (views.h); `set POD key=value...` changes a
// pod's policy live, `unset` removes that, `policy [POD]` shows a pod's values and their
// sources (or every live override); `drain GPU` holds new grants back and waits until the
// GPU is idle, `undrain` resumes them. Talks newline-delimited JSON over the root-only admin
// socket, and waits at most 10 s for an answer.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/policy.h"
#include "common/version.h"
#include "hosted/admin_client.h"
#include "hosted/names.h"
#include "quantactl/text.h"
#include "quantactl/views.h"

namespace {

using nlohmann::json;
namespace hosted = quanta::hosted;

// Text a tenant or runtime chose (pod names, commands), escaped: never raw to a terminal.
std::string shown(const json& j, const char* field) {
  return hosted::printable(j.value(field, std::string("?")));
}

constexpr int kAnswerSeconds = 10;  // how long the arbiter may take to answer
constexpr uint64_t kNs = 1'000'000'000;
// Every command that takes a pod takes it the same way (the arbiter resolves it).
constexpr const char* kPodHelp =
    "the pod: namespace/name, or its name alone when no other pod has it (a QUANTA_POD process's "
    "pod is default/NAME)";

// Why the admin socket could not be reached, and what to check.
std::string unreachable(const std::string& socket_path, int err) {
  const std::string where = "cannot reach quanta-arbiter at " + socket_path + ": ";
  switch (err) {
    case ENOENT:
      return where +
             "no such socket. Is quanta-arbiter running on this node, and is this its [node] "
             "admin_socket? Give the path with --admin-socket or QUANTA_ADMIN_SOCKET (in the "
             "DaemonSet, run quantactl inside the arbiter's pod: kubectl -n quanta-system exec "
             "ds/quanta-node -- quantactl ...)";
    case EACCES:
    case EPERM:
      return where + "permission denied. The admin socket is root-only: run quantactl as root";
    case ECONNREFUSED:
      return where +
             "nothing listens there. The arbiter that made the socket has exited: see its log "
             "(<state_dir>/quanta-arbiter.log, or the pod's logs) and restart it";
    default:
      return where + std::strerror(err);
  }
}

// The arbiter's answer to `req` (ok or not); throws with what to check when there is none.
json request(const std::string& socket_path, const json& req) {
  if (socket_path.empty() || socket_path.size() >= sizeof(sockaddr_un{}.sun_path))
    throw std::runtime_error("--admin-socket \"" + hosted::printable(socket_path) +
                             "\": a path of 1 to " +
                             std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
  hosted::AdminReply reply = hosted::admin_request(
      socket_path, req, static_cast<uint64_t>(kAnswerSeconds) * kNs, hosted::kStatusAnswerBytes);
  if (reply.outcome != hosted::AdminOutcome::kUnreachable) return std::move(reply.response);
  if (reply.connect_error != 0)
    throw std::runtime_error(unreachable(socket_path, reply.connect_error));
  if (reply.timed_out)
    throw std::runtime_error("quanta-arbiter at " + socket_path + " did not answer within " +
                             std::to_string(kAnswerSeconds) +
                             " s: it may be stopped (SIGSTOP) or overloaded; see its log");
  throw std::runtime_error(reply.reason);
}

using quanta::ctl::bytes;

// An answer with "ok": false: its error, escaped, on stderr.
bool refused(const json& response) {
  if (response.value("ok", false)) return false;
  std::fprintf(stderr, "quantactl: %s\n",
               hosted::printable(response.value("error", std::string("request failed"))).c_str());
  return true;
}

// Every duration option: seconds ("60") or a number with a unit ("500ms", "30s", "5m"), the
// grammar of every Quanta tool, checked at parse time so a bad value is a usage error.
CLI::Validator duration_between(uint64_t min_ns, uint64_t max_ns, const std::string& range) {
  return CLI::Validator(
      [min_ns, max_ns, range](std::string& text) -> std::string {
        quanta::common::ParseError err;
        uint64_t ns = 0;
        if (!quanta::common::parse_command_duration(text, &ns, &err)) return err.text;
        if (ns < min_ns || ns > max_ns) return "\"" + text + "\" is outside " + range;
        return "";
      },
      "DURATION");
}

double seconds_of(const std::string& text) {
  quanta::common::ParseError err;
  uint64_t ns = 0;
  quanta::common::parse_command_duration(text, &ns, &err);  // checked by duration_between
  return static_cast<double>(ns) / 1e9;
}

const json* find_gpu(const json& status, uint32_t index) {
  for (const json& gpu : status["gpus"]) {
    if (gpu.value("index", UINT32_MAX) == index) return &gpu;
  }
  return nullptr;
}

std::string who(const json& tenant) {
  return "pid " + std::to_string(tenant.value("pid", 0)) + " (" + tenant.value("pod", "?") + ")";
}

// Waits until the drained GPU is idle; prints what holds it meanwhile and what is left.
int wait_until_idle(const std::string& socket_path, const json& drained, double timeout_s) {
  const uint32_t index = drained.value("gpu", 0u);
  const std::string name = "GPU " + std::to_string(index) + " " + drained.value("uuid", "?");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last_holder;
  std::string last_error;
  for (;;) {
    json status;
    try {
      status = request(socket_path, {{"cmd", "status"}});
      last_error.clear();
    } catch (const std::exception& e) {
      last_error = e.what();  // an arbiter restarting mid-drain: it keeps the drain
    }
    const json* gpu = status.is_object() ? find_gpu(status, index) : nullptr;
    if (gpu != nullptr && !gpu->value("draining", false)) {
      std::fprintf(stderr, "quantactl: %s was undrained while waiting\n", name.c_str());
      return 1;
    }
    if (gpu != nullptr && gpu->value("idle", false)) {
      size_t attached = 0;
      std::string passed_over;
      for (const json& t : (*gpu)["tenants"]) {
        ++attached;
        if (t.value("state", "") == "passed-over") {
          passed_over += (passed_over.empty() ? "" : ", ") + who(t);
        }
      }
      std::printf(
          "%s is idle: no tenant holds it and none will be granted it until "
          "`quantactl undrain %u`\n",
          name.c_str(), index);
      if (attached != 0) {
        std::printf(
            "  %zu tenant process(es) still attached (waiting at the gate): they must "
            "exit before the GPU is reset or re-partitioned\n",
            attached);
      }
      if (!passed_over.empty()) {
        std::printf(
            "  passed over for not releasing (stopped or hung), their queued work may "
            "still run: %s\n",
            passed_over.c_str());
      }
      return 0;
    }
    if (gpu != nullptr && !(*gpu)["holder"].is_null()) {
      const std::string holder = who((*gpu)["holder"]);
      if (holder != last_holder) {
        std::printf("%s draining: waiting for %s to release it\n", name.c_str(), holder.c_str());
        std::fflush(stdout);
        last_holder = holder;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "quantactl: %s is not idle after %.0f s (%s); it stays draining\n",
                   name.c_str(), timeout_s,
                   !last_error.empty()   ? last_error.c_str()
                   : last_holder.empty() ? "a holder is still releasing"
                                         : ("held by " + last_holder).c_str());
      return 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Processes NVML lists on the GPU that Quanta does not gate, and pods over their cap by
// NVML's count.
void print_unmanaged(const json& gpu) {
  if (gpu.contains("nvml_error")) std::printf("  NVML: %s\n", shown(gpu, "nvml_error").c_str());
  if (gpu.contains("unmanaged") && !gpu["unmanaged"].empty()) {
    std::printf("  not managed by Quanta:\n");
    for (const json& u : gpu["unmanaged"]) {
      std::string pod = u["pod"].is_string() ? hosted::printable(u["pod"].get<std::string>()) : "-";
      std::printf("    pid %-8d %-16s pod %-24s %s\n", u.value("pid", 0),
                  shown(u, "command").c_str(), pod.c_str(),
                  bytes(u.value("memory_used", 0ull)).c_str());
    }
  }
  if (gpu.contains("over_cap")) {
    for (const json& o : gpu["over_cap"]) {
      std::printf("  over its cap by NVML's count: pod %s uses %s of %s (%s)\n",
                  shown(o, "pod").c_str(), bytes(o.value("nvml_memory_used", 0ull)).c_str(),
                  bytes(o.value("memory_cap", 0ull)).c_str(), shown(o, "action").c_str());
    }
  }
}

// `quantactl policy`: a pod's values and their sources, or every live override.
void print_policy(const json& response) {
  if (response.contains("values")) {
    std::printf("pod %s\n  %-13s %-16s %s\n", shown(response, "pod").c_str(), "KEY", "VALUE",
                "FROM");
    for (const json& v : response["values"]) {
      std::printf("  %-13s %-16s %s\n", shown(v, "key").c_str(), shown(v, "value").c_str(),
                  shown(v, "source").c_str());
    }
    return;
  }
  const json& overrides = response.value("overrides", json::object());
  if (overrides.empty()) {
    std::printf("no live overrides (`quantactl set POD key=value` makes one)\n");
    return;
  }
  for (const auto& [pod, values] : overrides.items()) {
    std::string text;
    for (const auto& [k, v] : values.items())
      text += " " + hosted::printable(k) + "=" +
              hosted::printable(v.is_string() ? v.get<std::string>() : v.dump());
    std::printf("%s%s\n", hosted::printable(pod).c_str(), text.c_str());
  }
}

// "tenant protocol 3 (accepts 2 to 3)" from status JSON's versions.
std::string interface_text(const json& versions, const char* key, const char* name) {
  const json& v = versions.value(key, json::object());
  const json& accepts = v.value("accepts", json::array());
  std::string text = std::string(name) + " " + std::to_string(v.value("speaks", 0u));
  if (accepts.size() == 2 && accepts[0].is_number_unsigned() && accepts[1].is_number_unsigned()) {
    const unsigned oldest = accepts[0].get<unsigned>(), newest = accepts[1].get<unsigned>();
    text += " (accepts " + std::to_string(oldest) +
            (oldest == newest ? "" : " to " + std::to_string(newest)) + ")";
  }
  return text;
}

void print_table(const json& status) {
  std::printf("quanta-arbiter scope %s, generation %llu, up %.0f s\n",
              shown(status, "scope").c_str(), status.value("generation", 0ull),
              status.value("uptime_s", 0.0));
  if (status.contains("versions") && status["versions"].is_object()) {
    const json& v = status["versions"];
    std::printf("release %s: %s, %s\n", shown(v, "release").c_str(),
                interface_text(v, "tenant_protocol", "tenant protocol").c_str(),
                interface_text(v, "shared_memory_layout", "shared-memory layout").c_str());
  }
  for (const json& gpu : status["gpus"]) {
    std::string holder = "none";
    if (!gpu["holder"].is_null()) {
      holder = "pid " + std::to_string(gpu["holder"].value("pid", 0)) + " (" +
               shown(gpu["holder"], "pod") + ")";
    }
    std::printf("\nGPU %u %s  holder: %s  waiting: %u%s\n", gpu.value("index", 0u),
                shown(gpu, "uuid").c_str(), holder.c_str(), gpu.value("waiting", 0u),
                !gpu.value("draining", false) ? ""
                : gpu.value("idle", false)    ? "  DRAINED (idle)"
                                              : "  DRAINING");
    print_unmanaged(gpu);
    if (gpu["tenants"].empty()) {
      std::printf("  (no tenants)\n");
      continue;
    }
    std::printf("  %-8s %-24s %6s %-11s %7s %8s %9s %19s %-11s %8s\n", "PID", "POD", "WEIGHT",
                "PRIORITY", "TARGET", "ACHIEVED", "WAIT p99", "MEMORY USED/CAP", "STATE",
                "TIMEOUTS");
    for (const json& t : gpu["tenants"]) {
      uint64_t cap = t.value("memory_cap", 0ull);
      std::string mem = bytes(t.value("pod_memory_used", 0ull)) + "/" +
                        (cap == 0 ? std::string("-") : bytes(cap));
      const std::string pod = quanta::ctl::column(t.value("pod", "?"), 24);
      std::printf("  %-8d %s %6u %-11s %6.1f%% %7.1f%% %6.1f ms %19s %-11s %8llu\n",
                  t.value("pid", 0), pod.c_str(), t.value("weight", 0u),
                  shown(t, "priority").c_str(), 100.0 * t.value("target_share", 0.0),
                  100.0 * t.value("achieved_share", 0.0), t.value("wait_p99_ms", 0.0), mem.c_str(),
                  shown(t, "state").c_str(), t.value("revoke_timeouts", 0ull));
    }
  }
}

void print_json(const json& response) {
  std::printf("%s\n", response.dump(2, ' ', false, json::error_handler_t::replace).c_str());
}

// A subcommand: the options CLI11 parses into it (held by `run`), and what it asks of the
// arbiter at `socket` and prints. `run` returns the exit status.
struct Command {
  CLI::App* cli = nullptr;
  std::function<int(const std::string& socket)> run;
};

Command add_status(CLI::App& app) {
  auto* cli = app.add_subcommand(
      "status", "per GPU: holder and each tenant's pod, shares, wait, memory, state");
  auto as_json = std::make_shared<bool>(false);
  cli->add_flag("--json", *as_json, "print the status JSON (schema: docs/quantactl-status.md)");
  return {cli, [as_json](const std::string& socket) {
            const json response = request(socket, {{"cmd", "status"}});
            if (refused(response)) return 1;
            *as_json ? print_json(response) : print_table(response);
            return 0;
          }};
}

Command add_set(CLI::App& app) {
  auto* cli = app.add_subcommand(
      "set",
      "change a running or registered pod's policy live (applies at the next decision; "
      "lasts as long as the pod)");
  struct Options {
    std::string pod;
    std::vector<std::string> pairs;
  };
  auto o = std::make_shared<Options>();
  cli->add_option("POD", o->pod, kPodHelp)->required();
  cli->add_option("VALUES", o->pairs,
                  "weight=1..1000 priority=interactive|batch|best-effort min-share=SHARE "
                  "max-share=SHARE memory-limit=BYTES quantum=DURATION (SHARE: 0.3 or 30%; "
                  "BYTES: 512Mi, 10Gi; DURATION: 500us, 20ms)")
      ->required();
  return {cli, [o](const std::string& socket) {
            json values = json::object();
            for (const std::string& p : o->pairs) {
              auto eq = p.find('=');
              if (eq == std::string::npos || eq == 0) {
                throw std::runtime_error("\"" + hosted::printable(p) +
                                         "\" is not key=value (keys: weight, priority, min-share, "
                                         "max-share, memory-limit, quantum)");
              }
              values[p.substr(0, eq)] = p.substr(eq + 1);
            }
            const json response =
                request(socket, {{"cmd", "set"}, {"pod", o->pod}, {"values", values}});
            if (refused(response)) return 1;
            std::printf("pod %s updated%s%s\n", hosted::printable(o->pod).c_str(),
                        response.contains("note") ? ": " : "",
                        hosted::printable(response.value("note", "")).c_str());
            return 0;
          }};
}

Command add_unset(CLI::App& app) {
  auto* cli = app.add_subcommand(
      "unset",
      "remove a pod's live override (some keys, or all of it): its annotations or the "
      "node's tables apply again");
  struct Options {
    std::string pod;
    std::vector<std::string> keys;
  };
  auto o = std::make_shared<Options>();
  cli->add_option("POD", o->pod, kPodHelp)->required();
  cli->add_option("KEYS", o->keys,
                  "weight, priority, min-share, max-share, memory-limit, "
                  "quantum (default: every key it overrides)");
  return {cli, [o](const std::string& socket) {
            const json response =
                request(socket, {{"cmd", "unset"}, {"pod", o->pod}, {"keys", o->keys}});
            if (refused(response)) return 1;
            std::printf("pod %s: live override removed (%s)\n", hosted::printable(o->pod).c_str(),
                        o->keys.empty() ? "all of it" : "the keys named");
            return 0;
          }};
}

Command add_policy(CLI::App& app) {
  auto* cli =
      app.add_subcommand("policy",
                         "a pod's effective policy and where each value comes from (default, node "
                         "table, annotation, override); without POD, every live override");
  struct Options {
    std::string pod;
    bool as_json = false;
  };
  auto o = std::make_shared<Options>();
  cli->add_option("POD", o->pod, kPodHelp);
  cli->add_flag("--json", o->as_json, "print the arbiter's policy JSON");
  return {cli, [o](const std::string& socket) {
            json req{{"cmd", "policy"}};
            if (!o->pod.empty()) req["pod"] = o->pod;
            const json response = request(socket, req);
            if (refused(response)) return 1;
            o->as_json ? print_json(response) : print_policy(response);
            return 0;
          }};
}

constexpr const char* kGpuHelp = "the GPU's index or UUID (GPU-… or MIG-…)";

Command add_drain(CLI::App& app) {
  auto* cli = app.add_subcommand(
      "drain", "stop new grants on a GPU or MIG instance and wait until no tenant holds it");
  struct Options {
    std::string gpu;
    std::string timeout = "60s";
    bool no_wait = false;
  };
  auto o = std::make_shared<Options>();
  cli->add_option("GPU", o->gpu, kGpuHelp)->required();
  cli->add_option("--timeout", o->timeout,
                  "how long to wait for the holder to release (default 60s)")
      ->check(duration_between(0, 24 * 3600 * kNs, "0s to 24h"));
  cli->add_flag("--no-wait", o->no_wait, "return once the drain is set");
  return {cli, [o](const std::string& socket) {
            const json response = request(socket, {{"cmd", "drain"}, {"gpu", o->gpu}});
            if (refused(response)) return 1;
            if (o->no_wait) {
              std::printf("GPU %u %s draining (%s)\n", response.value("gpu", 0u),
                          response.value("uuid", "?").c_str(),
                          response.value("idle", false) ? "idle" : "a holder is releasing");
              return 0;
            }
            return wait_until_idle(socket, response, seconds_of(o->timeout));
          }};
}

Command add_undrain(CLI::App& app) {
  auto* cli = app.add_subcommand("undrain", "let a drained GPU be granted again");
  auto gpu = std::make_shared<std::string>();
  cli->add_option("GPU", *gpu, kGpuHelp)->required();
  return {cli, [gpu](const std::string& socket) {
            const json response = request(socket, {{"cmd", "undrain"}, {"gpu", *gpu}});
            if (refused(response)) return 1;
            std::printf("GPU %u %s undrained: grants resume\n", response.value("gpu", 0u),
                        response.value("uuid", "?").c_str());
            return 0;
          }};
}

Command add_top(CLI::App& app) {
  auto* cli = app.add_subcommand("top",
                                 "refreshing view per GPU: each pod's share, target, utilisation, "
                                 "waits and who delayed it, and capacity left");
  struct Options {
    std::string interval = "1s";
    bool once = false;
  };
  auto o = std::make_shared<Options>();
  cli->add_option("--interval", o->interval, "refresh period, 100ms to 60s (default 1s)")
      ->check(duration_between(kNs / 10, 60 * kNs, "100ms to 60s"));
  cli->add_flag("--once", o->once, "print one frame and exit (no screen control)");
  cli->footer(
      "When standard output is not a terminal, frames are printed one after another "
      "without screen control, separated by a blank line.");
  return {cli, [o](const std::string& socket) {
            auto fetch = [&socket] {
              json r = request(socket, {{"cmd", "top"}});
              if (!r.value("ok", false))
                throw std::runtime_error(r.value("error", std::string("top failed")));
              return r;
            };
            return quanta::ctl::run_top(
                fetch, static_cast<uint64_t>(seconds_of(o->interval) * 1000 + 0.5), o->once);
          }};
}

Command add_explain(CLI::App& app) {
  auto* cli = app.add_subcommand("explain",
                                 "a pod's last minute in words and figures: its share against "
                                 "its target, who delayed it, by how much");
  struct Options {
    std::string pod;
    std::string last = "60s";
    bool as_json = false;
  };
  auto o = std::make_shared<Options>();
  cli->add_option("POD", o->pod, kPodHelp)->required();
  cli->add_option("--last", o->last, "how far back to look, 1s to 60s (default 60s)")
      ->check(duration_between(kNs, 60 * kNs, "1s to 60s"));
  cli->add_flag("--json", o->as_json,
                "print the arbiter's explain JSON (docs/quantactl-status.md)");
  return {cli, [o](const std::string& socket) {
            const json response = request(
                socket, {{"cmd", "explain"}, {"pod", o->pod}, {"seconds", seconds_of(o->last)}});
            if (refused(response)) return 1;
            if (o->as_json) {
              print_json(response);
            } else {
              std::fputs(quanta::ctl::render_explain(response).c_str(), stdout);
            }
            return 0;
          }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quantactl: inspect and steer quanta-arbiter"};
  app.set_version_flag("--version", quanta::common::version_line("quantactl"));
  const char* env_socket = std::getenv("QUANTA_ADMIN_SOCKET");
  std::string socket_path = env_socket != nullptr ? env_socket : "/run/quanta-admin/admin.sock";
  app.add_option("--admin-socket", socket_path,
                 "the arbiter's admin socket (env QUANTA_ADMIN_SOCKET)");
  app.require_subcommand(1);
  // In the order `quantactl --help` lists them.
  const Command commands[] = {add_status(app), add_set(app),     add_unset(app), add_policy(app),
                              add_drain(app),  add_undrain(app), add_top(app),   add_explain(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // a usage error exits 2, as other tools' do
  }
  try {
    for (const Command& command : commands) {
      if (command.cli->parsed()) return command.run(socket_path);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quantactl: %s\n", hosted::printable(e.what()).c_str());
    return 1;
  }
  return 0;
}
