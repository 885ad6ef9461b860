// VirtualClock: charges, lifts and the per-lane floors. Every operation keeps the two
// invariants the tests check: a floor never decreases (renormalisation shifts a whole lane
// by the same amount), and a member's virtual time only decreases with its lane's shift.
#include "arbiter/scheduling/virtual_clock.h"

#include <algorithm>

namespace quanta::arbiter {
namespace {

uint64_t sat_sub(uint64_t a, uint64_t b) {
  return a > b ? a - b : 0;
}

}  // namespace

VirtualClock::VirtualClock(uint32_t lanes, uint64_t lag_ns)
    : lag_ns_(lag_ns), floors_(std::max<uint32_t>(lanes, 1), 0) {}

VirtualClock::Member& VirtualClock::at(Id id) {
  if (id >= members_.size()) members_.resize(static_cast<size_t>(id) + 1);
  return members_[id];
}

void VirtualClock::join(Id id, uint32_t lane, uint32_t weight) {
  Member& m = at(id);
  if (!m.present) present_.push_back(id);
  m.present = true;
  m.contending = false;
  m.lane = std::min<uint32_t>(lane, static_cast<uint32_t>(floors_.size()) - 1);
  m.weight = std::max<uint32_t>(weight, 1);
  m.vtime = floors_[m.lane];
  m.residue = 0;
}

void VirtualClock::leave(Id id) {
  if (!has(id)) return;
  members_[id] = Member{};
  present_.erase(std::find(present_.begin(), present_.end(), id));
}

void VirtualClock::set_weight(Id id, uint32_t weight) {
  // Virtual time earned stays and the new weight prices what comes next; but credit held
  // behind the floor is GPU time owed at the old weight, which a heavier weight would
  // multiply: the member keeps at most the lag of it, as when it wakes.
  Member& m = members_[id];
  m.weight = std::max<uint32_t>(weight, 1);
  m.residue = 0;
  lift(id);
}

void VirtualClock::set_lane(Id id, uint32_t lane) {
  Member& m = members_[id];
  lane = std::min<uint32_t>(lane, static_cast<uint32_t>(floors_.size()) - 1);
  if (m.lane == lane) return;
  m.lane = lane;
  m.vtime = sat_sub(floors_[lane], lag_of(id));
  m.residue = 0;
}

uint64_t VirtualClock::lag_of(Id id) const {
  return lag_ns_ * kScale / std::max<uint32_t>(members_[id].weight, 1);
}

void VirtualClock::lift(Id id) {
  Member& m = members_[id];
  m.vtime = std::max(m.vtime, sat_sub(floors_[m.lane], lag_of(id)));
}

void VirtualClock::settle_floors() {
  constexpr uint64_t kNone = UINT64_MAX;
  uint64_t least[8] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};
  std::vector<uint64_t> more;  // lanes past 8 (never, for the scheduler's three classes)
  if (floors_.size() > 8) more.assign(floors_.size() - 8, kNone);
  for (Id id : present_) {
    const Member& m = members_[id];
    if (!m.contending) continue;
    uint64_t& slot = m.lane < 8 ? least[m.lane] : more[m.lane - 8];
    slot = std::min(slot, m.vtime);
  }
  for (uint32_t lane = 0; lane < floors_.size(); ++lane) {
    const uint64_t l = lane < 8 ? least[lane] : more[lane - 8];
    if (l != kNone && l > floors_[lane]) floors_[lane] = l;
    if (floors_[lane] >= kRenormaliseAt) renormalise(lane);
  }
}

void VirtualClock::charge(Id id, uint64_t ns) {
  Member& m = members_[id];
  const uint64_t scaled = ns * kScale + m.residue;
  m.vtime += scaled / m.weight;
  m.residue = scaled % m.weight;
  if (m.vtime >= kRenormaliseAt) {
    // A member far ahead of its floor (charged, never contending) must not overflow either.
    if (floors_[m.lane] < kRenormaliseAt / 4) {
      m.vtime = floors_[m.lane] + kRenormaliseAt / 4;
    } else {
      renormalise(m.lane);
    }
  }
}

// Virtual times only grow; long before they could overflow, the lane shifts down so its
// floor sits at a quarter of the range. Order and differences within the lane are kept
// (members already below the shift, far behind the floor, stop at 0: still first).
void VirtualClock::renormalise(uint32_t lane) {
  const uint64_t shift = sat_sub(floors_[lane], kRenormaliseAt / 4);
  floors_[lane] -= shift;
  for (Id id : present_) {
    Member& m = members_[id];
    if (m.lane == lane) m.vtime = sat_sub(m.vtime, shift);
  }
}

}  // namespace quanta::arbiter
