// Weighted virtual time: the order in which one GPU's pods (or one pod's processes) are
// served. Members of a lane compete by virtual time, which grows by the GPU time they are
// charged divided by their weight. Each lane keeps a floor: the least virtual time among
// its contending members (those competing by virtual time now: wanting the GPU, not held
// back by a ceiling), never lowered. Members that arrive start at the floor and members
// that wake are lifted to the floor less the lag, so idle time banks at most the lag of
// credit; members that are active but not contending (outranked by a higher lane, held
// back by a ceiling) can never hold the floor back for everyone else.
#pragma once

#include <cstdint>
#include <vector>

namespace quanta::arbiter {

class VirtualClock {
 public:
  using Id = uint32_t;
  // Virtual time advances by charged_ns * kScale / weight.
  static constexpr uint64_t kScale = 1000;
  // Floors are kept below this; past it every member of the lane shifts down together.
  static constexpr uint64_t kRenormaliseAt = 1ull << 62;

  // `lanes` independent orders (priority classes); `lag_ns` of GPU time is the most idle
  // credit a waking member keeps.
  VirtualClock(uint32_t lanes, uint64_t lag_ns);

  // A new member starts at its lane's floor: neither owed nor owing.
  void join(Id id, uint32_t lane, uint32_t weight);
  void leave(Id id);
  bool has(Id id) const { return id < members_.size() && members_[id].present; }

  void set_weight(Id id, uint32_t weight);
  // Moves to another lane, lifted there like a waking member: what it was owed or owed in
  // the old lane means nothing against the new lane's members.
  void set_lane(Id id, uint32_t lane);

  // Back from idle, or passed by for a reason other than its virtual time (a ceiling):
  // lifted to the floor less the lag. Never lowers.
  void lift(Id id);
  void charge(Id id, uint64_t ns);
  // Whether the member competes by virtual time now; only contending members set floors.
  void set_contending(Id id, bool contending) { members_[id].contending = contending; }
  bool contending(Id id) const { return members_[id].contending; }
  // Raises each lane's floor to the least virtual time of its contending members (a lane
  // with none keeps its floor). Call after charges and before lifts.
  void settle_floors();

  uint64_t vtime(Id id) const { return members_[id].vtime; }
  uint32_t lane(Id id) const { return members_[id].lane; }
  uint32_t weight(Id id) const { return members_[id].weight; }
  uint64_t floor(uint32_t lane) const { return floors_[lane]; }
  uint64_t lag_ns() const { return lag_ns_; }
  // The lag in this member's virtual-time units (a light member's lag is worth more).
  uint64_t lag_of(Id id) const;

 private:
  struct Member {
    bool present = false;
    bool contending = false;
    uint32_t lane = 0;
    uint32_t weight = 1;
    uint64_t vtime = 0;
    uint64_t residue = 0;  // charged_ns * kScale not yet divided into vtime (so sums are exact)
  };
  Member& at(Id id);
  void renormalise(uint32_t lane);

  uint64_t lag_ns_;
  std::vector<uint64_t> floors_;
  std::vector<Member> members_;
  std::vector<Id> present_;  // ids with a member, so walks skip the gaps
};

}  // namespace quanta::arbiter
