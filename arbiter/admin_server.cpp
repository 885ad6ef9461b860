// The admin socket (root only): newline-delimited JSON requests and responses for
// quantactl and quanta-hook: status, set (live policy), register and unregister (drain and
// undrain live in admin_drain.cpp). The status schema is in docs/quantactl-status.md.
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "arbiter/arbiter.h"
#include "arbiter/unix_socket.h"
#include "common/clock.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

constexpr size_t kMaxRequestBytes = 64 * 1024;

json error(const std::string& text) {
  return json{{"ok", false}, {"error", text}};
}

// Policy values may come as strings or numbers; the parsers take text.
bool policy_text(const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
  } else if (v.is_number_integer()) {
    *out = std::to_string(v.get<int64_t>());
  } else if (v.is_number()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", v.get<double>());
    *out = buf;
  } else {
    return false;
  }
  return true;
}

bool policy_map(const json& j, std::map<std::string, std::string>* out, std::string* err) {
  if (j.is_null()) return true;
  if (!j.is_object()) {
    *err = "policy must be an object of key: value";
    return false;
  }
  for (const auto& [k, v] : j.items()) {
    std::string text;
    if (!policy_text(v, &text)) {
      *err = "policy value of " + k + " must be a string or a number";
      return false;
    }
    (*out)[k] = text;
  }
  return true;
}

bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, 1000) <= 0) return false;  // a client that does not read is dropped
      continue;
    }
    return false;
  }
  return true;
}

double ms(uint64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

}  // namespace

void Arbiter::on_admin_accept() {
  for (;;) {
    int fd = accept4(admin_listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    PeerCred cred = peer_cred(fd);
    if (cred.uid != 0) {
      std::string refusal =
          error("the admin socket serves root only (caller uid " + std::to_string(cred.uid) + ")")
              .dump() +
          "\n";
      send_all(fd, refusal);
      ::close(fd);
      continue;
    }
    AdminConnection& conn = admin_connections_[fd];
    conn.sock.reset(fd);
    loop_.add(fd, [this, fd](uint32_t) { on_admin_readable(fd); });
  }
}

void Arbiter::on_admin_readable(int fd) {
  auto it = admin_connections_.find(fd);
  if (it == admin_connections_.end()) return;
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    loop_.remove(fd);
    admin_connections_.erase(it);
    return;
  }
  std::string& inbox = it->second.inbox;
  inbox.append(buf, static_cast<size_t>(n));
  size_t nl;
  while ((nl = inbox.find('\n')) != std::string::npos) {
    std::string line = inbox.substr(0, nl);
    inbox.erase(0, nl + 1);
    json response;
    try {
      response = handle_admin(json::parse(line));
    } catch (const json::exception& e) {
      response = error(std::string("request is not valid JSON: ") + e.what());
    }
    if (!send_all(fd, response.dump() + "\n")) {
      loop_.remove(fd);
      admin_connections_.erase(fd);
      return;
    }
  }
  if (inbox.size() > kMaxRequestBytes) {
    send_all(fd, error("request longer than 64 KiB").dump() + "\n");
    loop_.remove(fd);
    admin_connections_.erase(fd);
  }
}

json Arbiter::handle_admin(const json& request) {
  if (!request.is_object() || !request.contains("cmd") || !request["cmd"].is_string()) {
    return error(
        "a request is an object with \"cmd\": status, set, register, unregister, drain or "
        "undrain");
  }
  const std::string cmd = request["cmd"].get<std::string>();
  try {
    if (cmd == "status") return status_json();
    if (cmd == "drain" || cmd == "undrain") return handle_drain(request, cmd == "drain");
    if (cmd == "set") {
      std::string pod = request.value("pod", "");
      std::map<std::string, std::string> values;
      std::string err;
      if (!policy_map(request.value("values", json::object()), &values, &err)) return error(err);
      err = pods_.set_override(pod, values);
      if (!err.empty()) return error(err);
      pods_.save_state();
      json out{{"ok", true}, {"pod", pod}};
      if (Pod* p = pods_.find_key(pod)) {
        apply_policy(*p);
        after_events();
      } else {
        out["note"] = "pod " + pod + " has no process now; the values apply when it starts";
      }
      spdlog::info("policy of pod {} set live: {}", pod,
                   request.value("values", json::object()).dump());
      return out;
    }
    if (cmd == "register") {
      Registration r;
      r.container_id = request.value("container_id", "");
      r.pod_uid = request.value("pod_uid", "");
      r.pod_name = request.value("pod_name", "");
      r.pod_namespace = request.value("pod_namespace", "");
      r.container_name = request.value("container_name", "");
      r.cgroup_path = request.value("cgroup_path", "");
      std::string err;
      if (request.contains("devices")) {
        const json& devices = request["devices"];
        if (!devices.is_array()) return error("devices must be an array of GPU/MIG UUIDs");
        for (const json& d : devices) {
          if (!d.is_string()) return error("devices must be an array of GPU/MIG UUIDs");
          r.devices.push_back(d.get<std::string>());
        }
      }
      if (!policy_map(request.value("policy", json::object()), &r.policy, &err)) return error(err);
      err = pods_.register_container(r);
      if (!err.empty()) return error(err);
      pods_.save_state();
      if (Pod* p = pods_.find_key(r.pod_key())) apply_policy(*p);
      spdlog::info("registered container {} of pod {} (cgroup {})", r.container_id, r.pod_key(),
                   r.cgroup_path);
      return json{{"ok", true}, {"pod", r.pod_key()}};
    }
    if (cmd == "unregister") {
      std::string id = request.value("container_id", "");
      if (!pods_.unregister_container(id)) return error("no registered container " + id);
      pods_.save_state();
      spdlog::info("unregistered container {}", id);
      return json{{"ok", true}};
    }
  } catch (const json::exception& e) {
    return error("bad " + cmd + " request: " + e.what());
  }
  return error("unknown cmd \"" + cmd +
               "\": use status, set, register, unregister, drain or undrain");
}

json Arbiter::status_json() {
  const uint64_t now = common::monotonic_ns();
  json gpus = json::array();
  for (auto& gpu : gpus_) {
    const common::ControlRegion& region = *gpu->region.get();
    json tenants = json::array();
    for (const TenantReport& r : gpu->sched->report(now)) {
      pid_t pid = gpu->slot_pids.at(r.slot);
      const Process& proc = processes_.at(pid);
      Pod& pod = *pods_.find(proc.pod_index);
      const common::GateChannel& ch = channel(proc, gpu->index);
      uint64_t gate_waits = ch.gate_waits.load();
      tenants.push_back({
          {"pid", pid},
          {"pod", pod.key},
          {"slot", r.slot},
          {"weight", pod.policy.weight},
          {"priority", common::priority_name(pod.policy.priority)},
          {"max_share", pod.policy.max_share_ppm / static_cast<double>(common::kShareScale)},
          {"quantum_ms", ms(r.quantum_ns)},
          {"target_share", r.target_share},
          {"achieved_share", r.achieved_share},
          {"wait_p99_ms", ms(r.wait_p99_ns)},
          {"gate_waits", gate_waits},
          {"gate_wait_avg_ms",
           gate_waits == 0 ? 0.0 : ms(ch.gate_wait_ns.load()) / static_cast<double>(gate_waits)},
          {"gate_wait_max_ms", ms(ch.gate_wait_max_ns.load())},
          {"launches", ch.launches.load()},
          {"memory_used", ch.memory_used.load()},
          {"pod_memory_used", pod.region->memory_used[gpu->index].load()},
          {"memory_cap", pod.policy.memory_limit},
          {"state", state_name(r.state)},
          {"grants", r.grants},
          {"revoke_timeouts", r.pass_overs},
          {"connected", proc.connection >= 0},
      });
    }
    uint32_t holder = region.header.holder.load();
    json holder_json = nullptr;
    if (holder != common::kNoSlot && gpu->slot_pids.count(holder) != 0) {
      pid_t pid = gpu->slot_pids.at(holder);
      holder_json = json{
          {"slot", holder}, {"pid", pid}, {"pod", pods_.find(processes_.at(pid).pod_index)->key}};
    }
    gpus.push_back({{"index", gpu->index},
                    {"uuid", gpu->uuid},
                    {"holder", holder_json},
                    {"waiting", region.header.waiters.load()},
                    {"draining", gpu->sched->drain_requested()},
                    {"idle", gpu->sched->idle()},
                    {"tenants", tenants}});
  }
  return json{{"ok", true},
              {"scope", config_.scope},
              {"generation", generation_},
              {"uptime_s", static_cast<double>(now - started_ns_) / 1e9},
              {"gpus", gpus}};
}

}  // namespace quanta::arbiter
