// What admin requests do (the socket and its I/O are admin_server.h's): live policy changes,
// registrations, drains, the node's devices, and the answers the Observer gives (status, top,
// explain). The service changes the registry itself; what a change means for scheduling it
// asks of the core through NodeControl, the only calls it makes into it. Errors: each request
// gets one response, {"ok": false, "error": "…"} naming what was wrong and what is allowed.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "arbiter/node_state.h"
#include "arbiter/observing/gpu_inventory.h"
#include "arbiter/serving/admin_protocol.h"
#include "arbiter/serving/admin_server.h"
#include "arbiter/state/pod_registry.h"
#include "config/node_config.h"

namespace quanta::arbiter {

class Observer;

// The core's side of an admin change: what it does to the GPUs' schedulers and slots.
class NodeControl {
 public:
  virtual ~NodeControl() = default;
  // The registry's policy for `pod_key`, a pod with a region, changed: the pod takes it on
  // every GPU (scheduler and slots) from the next decision. (A pod without a region needs no
  // call: its processes start with the registry's policy.)
  virtual void policy_changed(const std::string& pod_key) = 0;
  // Hold back new grants on managed GPU `gpu_index` (its holder is revoked), or resume them.
  virtual void set_draining(uint32_t gpu_index, bool on) = 0;
};

// UUIDs that `quantactl drain` left drained (admin_drain.cpp), re-applied at start.
std::set<std::string> load_drained(const config::NodeConfig& config);

class AdminService final : public AdminApi {
 public:
  // `gpus` are the managed GPUs (read: drain finds one by index or UUID and tells its state);
  // `node_gpus` every GPU NVML lists, for the hook's device names.
  AdminService(const config::NodeConfig& config, PodRegistry& pods,
               const std::vector<std::unique_ptr<Gpu>>& gpus,
               const std::vector<GpuInfo>& node_gpus, Observer& observer,
               NodeControl& control);

  // One parsed request, one response.
  nlohmann::json handle(const AdminRequest& request) override;
  // The admin protocol from raw JSON, as a client sends it: parsed, then handle().
  nlohmann::json handle_admin(const nlohmann::json& request);

 private:
  // set and unset.
  nlohmann::json change_policy(const AdminRequest& request);
  nlohmann::json policy_json(const AdminRequest& request) const;
  // The pod a request names, as every quantactl command names it (resolve_pod_name); an
  // unknown name is left as it is, for the handler's own message.
  std::string pod_named(const std::string& wanted, std::string* error) const;
  nlohmann::json register_container(const AdminRequest& request);
  nlohmann::json unregister_container(const AdminRequest& request);
  nlohmann::json node_devices_json() const;
  // admin_drain.cpp
  nlohmann::json drain(const AdminRequest& request, bool on);
  void save_drained() const;

  const config::NodeConfig& config_;
  PodRegistry& pods_;
  const std::vector<std::unique_ptr<Gpu>>& gpus_;
  const std::vector<GpuInfo>& node_gpus_;
  Observer& observer_;
  NodeControl& control_;
};

}  // namespace quanta::arbiter
