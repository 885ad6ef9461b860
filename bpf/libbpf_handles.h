// What the quanta-trace tools hold of libbpf besides their skeletons: owning pointers for
// links and ring buffers, and a walk over a BPF map's entries.
#pragma once

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include <memory>

namespace quanta::bpf {

struct LinkDeleter {
  void operator()(bpf_link* link) const { bpf_link__destroy(link); }
};
struct RingBufferDeleter {
  void operator()(ring_buffer* rb) const { ring_buffer__free(rb); }
};
using UniqueLink = std::unique_ptr<bpf_link, LinkDeleter>;
using UniqueRingBuffer = std::unique_ptr<ring_buffer, RingBufferDeleter>;

// Calls fn(key, value) for each entry of the map behind `fd` that can still be read (an
// entry deleted during the walk is passed over).
template <typename Key, typename Value, typename Fn>
void for_each_entry(int fd, Fn&& fn) {
  Key key{};
  Key next{};
  Key* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    Value value{};
    if (bpf_map_lookup_elem(fd, &next, &value) == 0) fn(next, value);
    key = next;
    prev = &key;
  }
}

}  // namespace quanta::bpf
