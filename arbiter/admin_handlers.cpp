// What the admin requests do (the socket and its I/O are admin_server.cpp's): status, live
// policy changes, registrations (top and explain are admin_views.cpp's answers to a view of
// the node, drain admin_drain.cpp's). The status schema is documented in
// docs/quantactl-status.md; every text a tenant or runtime chose goes out as JSON strings
// (quantactl escapes them before printing).
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "arbiter/admin_views.h"
#include "arbiter/arbiter.h"
#include "common/clock.h"
#include "common/pod_key.h"
#include "common/version.h"
#include "hosted/names.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

json error(const std::string& text) {
  return json{{"ok", false}, {"error", text}};
}

double ms(uint64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

}  // namespace

json Arbiter::handle_admin(const json& request) {
  AdminRequest parsed;
  std::string err =
      parse_admin_request(request.dump(-1, ' ', false, json::error_handler_t::replace), &parsed);
  if (!err.empty()) return error(err);
  return handle(parsed);
}

json Arbiter::handle(const AdminRequest& request) {
  switch (request.command) {
    case AdminRequest::Command::kStatus:
      return status_json();
    case AdminRequest::Command::kTop:
      return top_answer(*take_figures(common::monotonic_ns()));
    case AdminRequest::Command::kExplain:
      return explain_answer(view_node(common::monotonic_ns()), request.pod, request.seconds);
    case AdminRequest::Command::kDrain:
    case AdminRequest::Command::kUndrain:
      return handle_drain(request, request.command == AdminRequest::Command::kDrain);
    case AdminRequest::Command::kSet:
      return set_policy(request);
    case AdminRequest::Command::kUnset:
      return unset_policy(request);
    case AdminRequest::Command::kPolicy:
      return policy_json(request);
    case AdminRequest::Command::kRegister:
      return register_container(request);
    case AdminRequest::Command::kUnregister:
      return unregister_container(request);
    case AdminRequest::Command::kDevices:
      return node_devices_json();
  }
  return error("unknown request");
}

// The node's GPUs by every name a runtime may give them, for quanta-hook: it resolves a
// container's devices through the arbiter and so never loads the driver's libraries itself.
json Arbiter::node_devices_json() const {
  json devices = json::array();
  for (const GpuInfo& g : node_gpus_)
    devices.push_back({{"name", g.name}, {"uuid", g.uuid}, {"minor", g.minor}, {"mig", !g.parent.empty() || g.uuid.rfind("MIG-", 0) == 0}});
  return json{{"ok", true}, {"devices", devices}};
}

// What the shims charge per context and where the figure came from.
json Arbiter::context_overhead_json() const {
  json measured = json::object();
  for (const auto& [model, bytes] : context_overheads_.bytes_by_model) measured[model] = bytes;
  json out{{"bytes", context_overhead_},
           {"source", config_.shim.measure_context_overhead ? "measured" : "config"}};
  if (config_.shim.measure_context_overhead) {
    out["measured"] = measured;
    if (!context_overheads_.errors.empty()) out["errors"] = context_overheads_.errors;
  }
  return out;
}

// The pod a request names, as every quantactl command names it (resolve_pod_name); an
// unknown name is left as it is, for the handler's own message.
std::string Arbiter::pod_named(const std::string& wanted, std::string* error) const {
  const std::string key = common::resolve_pod_name(pods_.known_keys(), wanted, error);
  return key.empty() ? wanted : key;
}

json Arbiter::set_policy(const AdminRequest& request) {
  std::string ambiguous;
  const std::string pod = pod_named(request.pod, &ambiguous);
  if (!ambiguous.empty()) return error(ambiguous);
  std::string err = pods_.set_override(pod, request.values);
  if (!err.empty()) return error(err);
  pods_.save_state();
  json out{{"ok", true}, {"pod", pod}};
  if (Pod* p = pods_.find_key(pod)) {
    apply_policy(*p);
    after_events();
  } else {
    out["note"] = "pod " + pod + " has no process now; the values apply when it starts";
  }
  std::string values;
  for (const auto& [k, v] : request.values) values += (values.empty() ? "" : " ") + k + "=" + v;
  spdlog::info("policy of pod {} set live: {}", hosted::printable(pod), hosted::printable(values));
  return out;
}

json Arbiter::unset_policy(const AdminRequest& request) {
  std::string ambiguous;
  const std::string pod = pod_named(request.pod, &ambiguous);
  if (!ambiguous.empty()) return error(ambiguous);
  std::string err = pods_.unset_override(pod, request.keys);
  if (!err.empty()) return error(err);
  pods_.save_state();
  if (Pod* p = pods_.find_key(pod)) {
    apply_policy(*p);
    after_events();
  }
  std::string keys;
  for (const std::string& k : request.keys) keys += (keys.empty() ? "" : " ") + k;
  spdlog::info("live policy override of pod {} removed: {}", hosted::printable(pod),
               keys.empty() ? std::string("all of it") : hosted::printable(keys));
  return json{{"ok", true}, {"pod", pod}};
}

// A pod's effective policy and where each value came from; without a pod, every live
// override.
json Arbiter::policy_json(const AdminRequest& request) const {
  if (request.pod.empty()) {
    json overrides = json::object();
    for (const auto& [pod, values] : pods_.overrides()) overrides[pod] = values;
    return json{{"ok", true}, {"overrides", overrides}};
  }
  std::string ambiguous;
  const std::string pod = pod_named(request.pod, &ambiguous);
  if (!ambiguous.empty()) return error(ambiguous);
  if (!pods_.known(pod))
    return error("pod " + hosted::printable(pod) +
                 " is not known to this arbiter (no registered container, no process and no "
                 "[pod] table): check its name with `quantactl status`");
  json values = json::array();
  for (const PodRegistry::PolicyValue& v : pods_.explain_policy(pod))
    values.push_back({{"key", v.key}, {"value", v.value}, {"source", v.source}});
  return json{{"ok", true}, {"pod", pod}, {"values", values}};
}

json Arbiter::register_container(const AdminRequest& request) {
  const Registration& r = request.registration;
  std::string err = pods_.register_container(r);
  if (!err.empty()) return error(err);
  pods_.save_state();
  if (Pod* p = pods_.find_key(r.pod_key())) apply_policy(*p);
  spdlog::info("registered container {} of pod {} (cgroup {})", hosted::printable(r.container_id),
               hosted::printable(r.pod_key()), hosted::printable(r.cgroup_path));
  return json{{"ok", true}, {"pod", r.pod_key()}};
}

json Arbiter::unregister_container(const AdminRequest& request) {
  const std::string& id = request.container_id;
  auto reg = pods_.registrations().find(id);
  const std::string key = reg == pods_.registrations().end() ? "" : reg->second.pod_key();
  if (!pods_.unregister_container(id))
    return error("no registered container " + hosted::printable(id));
  pods_.save_state();
  spdlog::info("unregistered container {}", hosted::printable(id));
  // The pod's policy is what its remaining registrations (or the node's tables) say now.
  if (Pod* p = pods_.find_key(key)) {
    apply_policy(*p);
    after_events();
  }
  return json{{"ok", true}};
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
      auto nvml = gpu->nvml_bytes.find(pid);
      auto denied = pod.denied_caps.find(gpu->index);
      tenants.push_back({
          {"pid", pid},
          {"pod", pod.key},
          {"slot", r.slot},
          {"weight", pod.policy.weight},
          {"priority", common::priority_name(pod.policy.priority)},
          {"min_share", pod.policy.min_share_ppm / static_cast<double>(common::kShareScale)},
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
          {"pod_memory_used", pod.region.memory_used(gpu->index).load()},
          {"shared_memory_layout", pod.region.layout()},
          {"memory_cap",
           denied != pod.denied_caps.end() ? denied->second : pod.policy.memory_limit},
          {"nvml_memory_used", nvml != gpu->nvml_bytes.end() ? json(nvml->second) : json(nullptr)},
          {"state", state_name(r.state)},
          {"grants", r.grants},
          {"revoke_timeouts", r.pass_overs},
          {"connected", proc.connected},
      });
    }
    json unmanaged = json::array();
    for (const UnmanagedProcess& u : gpu->unmanaged) {
      unmanaged.push_back({{"pid", u.pid},
                           {"memory_used", u.used_bytes},
                           {"pod", u.pod.empty() ? json(nullptr) : json(u.pod)},
                           {"command", u.command}});
    }
    json over = json::array();
    for (const std::string& key : gpu->over_cap) {
      auto bytes = gpu->pod_nvml_bytes.find(key);
      over.push_back({{"pod", key},
                      {"nvml_memory_used", bytes != gpu->pod_nvml_bytes.end() ? bytes->second : 0},
                      {"memory_cap", pods_.resolve_policy(key).memory_limit},
                      {"action", config::over_cap_name(config_.enforce.over_cap)}});
    }
    uint32_t holder = region.header.holder.load();
    json holder_json = nullptr;
    if (holder != common::kNoSlot && gpu->slot_pids.count(holder) != 0) {
      pid_t pid = gpu->slot_pids.at(holder);
      holder_json = json{
          {"slot", holder}, {"pid", pid}, {"pod", pods_.find(processes_.at(pid).pod_index)->key}};
    }
    json g{{"index", gpu->index},
           {"uuid", gpu->uuid},
           {"holder", holder_json},
           {"waiting", region.header.waiters.load()},
           {"draining", gpu->sched->drain_requested()},
           {"idle", gpu->sched->idle()},
           {"grants", gpu->grants},
           {"switches", gpu->switches},
           {"last_granted",
            gpu->last_granted == common::kNoSlot ? json(nullptr) : json(gpu->last_granted)},
           {"doorbells", gpu->doorbells},
           {"passes", gpu->passes},
           {"holder_looks", gpu->holder_looks},
           {"ended_by_holder", gpu->ended_by_holder},
           {"tenants", tenants},
           {"unmanaged", unmanaged},
           {"over_cap", over}};
    if (!gpu->nvml_error.empty()) g["nvml_error"] = gpu->nvml_error;
    gpus.push_back(std::move(g));
  }
  const auto interface = [](const common::InterfaceVersions& v) {
    return json{{"speaks", v.speaks}, {"accepts", json::array({v.oldest, v.newest})}};
  };
  return json{{"ok", true},
              {"scope", config_.scope},
              {"versions",
               {{"release", common::release()},
                {"tenant_protocol", interface(common::kTenantProtocol)},
                {"shared_memory_layout", interface(common::kSharedMemoryLayout)}}},
              {"generation", generation_},
              {"taken_ns", now},
              {"uptime_s", static_cast<double>(now - started_ns_) / 1e9},
              {"enforce",
               {{"enforce", config_.enforce.enforce},
                {"unplaced", config::unplaced_name(config_.enforce.unplaced)},
                {"over_cap", config::over_cap_name(config_.enforce.over_cap)}}},
              {"context_overhead", context_overhead_json()},
              {"tenant_connections", tenants_ ? tenants_->connections() : 0},
              {"metrics_listen", metrics_address()},
              {"gpus", gpus}};
}

}  // namespace quanta::arbiter
