// What the admin requests do (the socket and its I/O are admin_server.cpp's): live policy
// changes, registrations, and the gathering of what status tells (status, top and explain
// are admin_views.cpp's answers to what is gathered here and in observe.cpp, drain
// admin_drain.cpp's). The status schema is documented in
// docs/quantactl-status.md; every text a tenant or runtime chose goes out as JSON strings
// (quantactl escapes them before printing).
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "arbiter/arbiter.h"
#include "arbiter/observing/admin_views.h"
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
    devices.push_back({{"name", g.name},
                       {"uuid", g.uuid},
                       {"minor", g.minor},
                       {"mig", !g.parent.empty() || g.uuid.rfind("MIG-", 0) == 0}});
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
  return status_answer(status_of_node(common::monotonic_ns()));
}

// What `status` tells, read from the live state at `now`; nothing else is computed here.
NodeStatus Arbiter::status_of_node(uint64_t now) const {
  NodeStatus node;
  node.scope = config_.scope;
  node.generation = generation_;
  node.taken_ns = now;
  node.started_ns = started_ns_;
  node.enforce = config_.enforce;
  node.context_overhead = context_overhead_json();
  node.tenant_connections = tenants_ ? tenants_->connections() : 0;
  node.metrics_listen = metrics_address();
  for (const auto& gpu : gpus_) node.gpus.push_back(status_of_gpu(*gpu, now));
  return node;
}

GpuStatus Arbiter::status_of_gpu(const Gpu& gpu, uint64_t now) const {
  const common::ControlHeader& header = gpu.region->header;
  GpuStatus out;
  out.index = gpu.index;
  out.uuid = gpu.uuid;
  for (const TenantReport& r : gpu.sched->report(now)) {
    const pid_t pid = gpu.slot_pids.at(r.slot);
    const Process& proc = processes_.at(pid);
    const Pod& pod = pods_.pods().at(proc.pod_index);
    const common::GateChannel& ch = pod.region.channel(proc.proc_index, gpu.index);
    TenantStatus t;
    t.report = r;
    t.pid = pid;
    t.pod = pod.key;
    t.policy = pod.policy;
    t.gate_waits = ch.gate_waits.load();
    t.gate_wait_ns = ch.gate_wait_ns.load();
    t.gate_wait_max_ns = ch.gate_wait_max_ns.load();
    t.launches = ch.launches.load();
    t.memory_used = ch.memory_used.load();
    t.pod_memory_used = pod.region.memory_used(gpu.index).load();
    t.layout = pod.region.layout();
    auto denied = pod.denied_caps.find(gpu.index);
    t.memory_cap = denied != pod.denied_caps.end() ? denied->second : pod.policy.memory_limit;
    if (auto nvml = gpu.nvml_bytes.find(pid); nvml != gpu.nvml_bytes.end())
      t.nvml_memory_used = nvml->second;
    t.connected = proc.connected;
    out.tenants.push_back(std::move(t));
  }
  out.unmanaged = gpu.unmanaged;
  for (const std::string& key : gpu.over_cap) {
    auto bytes = gpu.pod_nvml_bytes.find(key);
    out.over_cap.push_back({key, bytes != gpu.pod_nvml_bytes.end() ? bytes->second : 0,
                            pods_.resolve_policy(key).memory_limit});
  }
  const uint32_t holder = header.holder.load();
  if (holder != common::kNoSlot && gpu.slot_pids.count(holder) != 0) {
    const pid_t pid = gpu.slot_pids.at(holder);
    out.holder = HolderStatus{holder, pid, pods_.pods().at(processes_.at(pid).pod_index).key};
  }
  out.waiting = header.waiters.load();
  out.draining = gpu.sched->drain_requested();
  out.idle = gpu.sched->idle();
  out.grants = gpu.grants;
  out.switches = gpu.switches;
  if (gpu.last_granted != common::kNoSlot) out.last_granted = gpu.last_granted;
  out.doorbells = gpu.doorbells;
  out.passes = gpu.passes;
  out.holder_looks = gpu.holder_looks;
  out.ended_by_holder = gpu.ended_by_holder;
  out.nvml_error = gpu.nvml_error;
  return out;
}

}  // namespace quanta::arbiter
