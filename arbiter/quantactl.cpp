// quantactl: the arbiter's admin client. `status` prints a table per GPU (or the raw JSON
// with --json, schema in docs/quantactl-status.md); `set POD key=value...` changes a pod's
// policy live. Talks newline-delimited JSON over the root-only admin socket.
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "arbiter/unix_socket.h"

namespace {

using nlohmann::json;

json request(const std::string& socket_path, const json& req) {
  quanta::arbiter::UniqueFd fd = quanta::arbiter::connect_unix(socket_path, SOCK_STREAM);
  std::string line = req.dump() + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    throw std::runtime_error("cannot send the request to " + socket_path);
  }
  std::string in;
  char buf[8192];
  while (in.find('\n') == std::string::npos) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n <= 0)
      throw std::runtime_error("the arbiter closed " + socket_path + " without answering");
    in.append(buf, static_cast<size_t>(n));
  }
  return json::parse(in.substr(0, in.find('\n')));
}

std::string bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1fGi", static_cast<double>(b) / (1ull << 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1fMi", static_cast<double>(b) / (1ull << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1fKi", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(b));
  }
  return buf;
}

void print_table(const json& status) {
  std::printf("quanta-arbiter scope %s, generation %llu, up %.0f s\n",
              status.value("scope", "?").c_str(), status.value("generation", 0ull),
              status.value("uptime_s", 0.0));
  for (const json& gpu : status["gpus"]) {
    std::string holder = "none";
    if (!gpu["holder"].is_null()) {
      holder = "pid " + std::to_string(gpu["holder"].value("pid", 0)) + " (" +
               gpu["holder"].value("pod", "?") + ")";
    }
    std::printf("\nGPU %u %s  holder: %s  waiting: %u\n", gpu.value("index", 0u),
                gpu.value("uuid", "?").c_str(), holder.c_str(), gpu.value("waiting", 0u));
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
      std::string pod = t.value("pod", "?");
      if (pod.size() > 24) pod = pod.substr(0, 23) + "~";
      std::printf("  %-8d %-24s %6u %-11s %6.1f%% %7.1f%% %6.1f ms %19s %-11s %8llu\n",
                  t.value("pid", 0), pod.c_str(), t.value("weight", 0u),
                  t.value("priority", "?").c_str(), 100.0 * t.value("target_share", 0.0),
                  100.0 * t.value("achieved_share", 0.0), t.value("wait_p99_ms", 0.0), mem.c_str(),
                  t.value("state", "?").c_str(), t.value("revoke_timeouts", 0ull));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quantactl: inspect and steer quanta-arbiter"};
  const char* env_socket = std::getenv("QUANTA_ADMIN_SOCKET");
  std::string socket_path = env_socket != nullptr ? env_socket : "/run/quanta/admin.sock";
  app.add_option("--admin-socket", socket_path,
                 "the arbiter's admin socket (env QUANTA_ADMIN_SOCKET)");
  app.require_subcommand(1);

  auto* status = app.add_subcommand(
      "status", "per GPU: holder and each tenant's pod, shares, wait, memory, state");
  bool as_json = false;
  status->add_flag("--json", as_json, "print the status JSON (schema: docs/quantactl-status.md)");

  auto* set =
      app.add_subcommand("set", "change a pod's policy live (applies at the next decision)");
  std::string pod;
  std::vector<std::string> pairs;
  set->add_option("POD", pod, "the pod (namespace/name, or the QUANTA_POD name)")->required();
  set->add_option("VALUES", pairs,
                  "weight=N priority=P max-share=F memory-limit=BYTES quantum=DURATION")
      ->required();

  CLI11_PARSE(app, argc, argv);
  try {
    json response;
    if (status->parsed()) {
      response = request(socket_path, {{"cmd", "status"}});
    } else {
      json values = json::object();
      for (const std::string& p : pairs) {
        auto eq = p.find('=');
        if (eq == std::string::npos || eq == 0) {
          throw std::runtime_error("\"" + p +
                                   "\" is not key=value (keys: weight, priority, max-share, "
                                   "memory-limit, quantum)");
        }
        values[p.substr(0, eq)] = p.substr(eq + 1);
      }
      response = request(socket_path, {{"cmd", "set"}, {"pod", pod}, {"values", values}});
    }
    if (!response.value("ok", false)) {
      std::fprintf(stderr, "quantactl: %s\n",
                   response.value("error", std::string("request failed")).c_str());
      return 1;
    }
    if (status->parsed()) {
      if (as_json) {
        std::printf("%s\n", response.dump(2).c_str());
      } else {
        print_table(response);
      }
    } else {
      std::printf("pod %s updated%s%s\n", pod.c_str(), response.contains("note") ? ": " : "",
                  response.value("note", "").c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quantactl: %s\n", e.what());
    return 1;
  }
  return 0;
}
