// The owner word of a control slot (common::ControlSlot::owner). Every tenant on a GPU can
// read every slot, so the word must name its process to the arbiter alone: it is a keyed
// hash (SipHash-2-4, truncated to 32 bits) of the process's pid, pod region and entry and
// the GPU, under a key only the arbiter knows (random at its first start, kept in its
// root-only state file). The process learns its own word from its Attached reply; others
// learn that the slot is in use. A restarted arbiter finds each re-adopted process's slot
// in the previous control region by computing its word, so no tenant can steer which slot
// it inherits.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>

namespace quanta::arbiter {

using SlotKey = std::array<uint64_t, 2>;

// SipHash-2-4 of `bytes` under `key` (k0 = key[0], k1 = key[1], little-endian words).
uint64_t siphash24(const SlotKey& key, const void* bytes, size_t size);

// A fresh random key (getrandom); throws std::runtime_error when the kernel gives none.
SlotKey new_slot_key();

// The owner word for process `pid` (pod region `pod_index`, entry `proc_index`) on GPU
// `gpu_index`; never 0 (0 marks a free slot).
uint32_t slot_owner(const SlotKey& key, pid_t pid, uint32_t pod_index, uint32_t proc_index,
                    uint32_t gpu_index);

// The key as the state file holds it (32 hex digits) and back; false for anything else.
std::string slot_key_text(const SlotKey& key);
bool parse_slot_key(const std::string& text, SlotKey* key);

}  // namespace quanta::arbiter
