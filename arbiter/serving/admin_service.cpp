// AdminService (admin_service.h): what each admin request does. Drains are admin_drain.cpp's;
// status, top and explain are the Observer's answers (admin_views.cpp renders them). The
// status schema is documented in docs/quantactl-status.md; every text a tenant or runtime
// chose goes out as JSON strings (quantactl escapes them before printing).
#include "arbiter/serving/admin_service.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "arbiter/observing/admin_views.h"
#include "arbiter/observing/figures.h"
#include "arbiter/observing/observer.h"
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

AdminService::AdminService(const config::NodeConfig& config, PodRegistry& pods,
                           const std::vector<std::unique_ptr<Gpu>>& gpus,
                           const std::vector<GpuInfo>& node_gpus, Observer& observer,
                           NodeControl& control)
    : config_(config),
      pods_(pods),
      gpus_(gpus),
      node_gpus_(node_gpus),
      observer_(observer),
      control_(control) {}

json AdminService::handle_admin(const json& request) {
  AdminRequest parsed;
  std::string err =
      parse_admin_request(request.dump(-1, ' ', false, json::error_handler_t::replace), &parsed);
  if (!err.empty()) return error(err);
  return handle(parsed);
}

json AdminService::handle(const AdminRequest& request) {
  switch (request.command) {
    case AdminRequest::Command::kStatus:
      return status_answer(observer_.status(common::monotonic_ns()));
    case AdminRequest::Command::kTop:
      return top_answer(*observer_.figures(common::monotonic_ns()));
    case AdminRequest::Command::kExplain:
      return explain_answer(observer_.view(common::monotonic_ns()), request.pod, request.seconds);
    case AdminRequest::Command::kDrain:
    case AdminRequest::Command::kUndrain:
      return drain(request, request.command == AdminRequest::Command::kDrain);
    case AdminRequest::Command::kSet:
    case AdminRequest::Command::kUnset:
      return change_policy(request);
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
json AdminService::node_devices_json() const {
  json devices = json::array();
  for (const GpuInfo& g : node_gpus_)
    devices.push_back({{"name", g.name},
                       {"uuid", g.uuid},
                       {"minor", g.minor},
                       {"mig", !g.parent.empty() || g.uuid.rfind("MIG-", 0) == 0}});
  return json{{"ok", true}, {"devices", devices}};
}

std::string AdminService::pod_named(const std::string& wanted, std::string* error) const {
  const std::string key = common::resolve_pod_name(pods_.known_keys(), wanted, error);
  return key.empty() ? wanted : key;
}

// set and unset: the pod the request names, its override changed and saved, and the core
// asked to apply the pod's policy when the pod has a process.
json AdminService::change_policy(const AdminRequest& request) {
  const bool set = request.command == AdminRequest::Command::kSet;
  std::string refusal;
  const std::string pod = pod_named(request.pod, &refusal);
  if (refusal.empty())
    refusal = set ? pods_.set_override(pod, request.values)
                  : pods_.unset_override(pod, request.keys);
  if (!refusal.empty()) return error(refusal);
  pods_.save_state();
  const bool running = pods_.find_key(pod) != nullptr;
  if (running) control_.policy_changed(pod);
  json out{{"ok", true}, {"pod", pod}};
  std::string changed;
  if (set) {
    if (!running)
      out["note"] = "pod " + pod + " has no process now; the values apply when it starts";
    for (const auto& [k, v] : request.values)
      changed += (changed.empty() ? "" : " ") + k + "=" + v;
    spdlog::info("policy of pod {} set live: {}", hosted::printable(pod),
                 hosted::printable(changed));
  } else {
    for (const std::string& k : request.keys) changed += (changed.empty() ? "" : " ") + k;
    spdlog::info("live policy override of pod {} removed: {}", hosted::printable(pod),
                 changed.empty() ? std::string("all of it") : hosted::printable(changed));
  }
  return out;
}

// A pod's effective policy and where each value came from; without a pod, every live
// override.
json AdminService::policy_json(const AdminRequest& request) const {
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

json AdminService::register_container(const AdminRequest& request) {
  const Registration& r = request.registration;
  std::string err = pods_.register_container(r);
  if (!err.empty()) return error(err);
  pods_.save_state();
  if (pods_.find_key(r.pod_key()) != nullptr) control_.policy_changed(r.pod_key());
  spdlog::info("registered container {} of pod {} (cgroup {})", hosted::printable(r.container_id),
               hosted::printable(r.pod_key()), hosted::printable(r.cgroup_path));
  return json{{"ok", true}, {"pod", r.pod_key()}};
}

json AdminService::unregister_container(const AdminRequest& request) {
  const std::string& id = request.container_id;
  auto reg = pods_.registrations().find(id);
  const std::string key = reg == pods_.registrations().end() ? "" : reg->second.pod_key();
  if (!pods_.unregister_container(id))
    return error("no registered container " + hosted::printable(id));
  pods_.save_state();
  spdlog::info("unregistered container {}", hosted::printable(id));
  // The pod's policy is what its remaining registrations (or the node's tables) say now.
  if (pods_.find_key(key) != nullptr) control_.policy_changed(key);
  return json{{"ok", true}};
}

}  // namespace quanta::arbiter
