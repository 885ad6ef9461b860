// SipHash-2-4 as its authors specify it (Aumasson and Bernstein, 2012), and the owner words
// built on it.
#include "arbiter/state/slot_owner.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace quanta::arbiter {
namespace {

uint64_t rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  void absorb(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

uint64_t load_le(const unsigned char* p, size_t n) {
  uint64_t out = 0;
  for (size_t i = 0; i < n; ++i) out |= static_cast<uint64_t>(p[i]) << (8 * i);
  return out;
}

}  // namespace

uint64_t siphash24(const SlotKey& key, const void* bytes, size_t size) {
  const auto* in = static_cast<const unsigned char*>(bytes);
  SipState s{key[0] ^ 0x736f6d6570736575ull, key[1] ^ 0x646f72616e646f6dull,
             key[0] ^ 0x6c7967656e657261ull, key[1] ^ 0x7465646279746573ull};
  const size_t whole = size - size % 8;
  for (size_t at = 0; at < whole; at += 8) s.absorb(load_le(in + at, 8));
  s.absorb(load_le(in + whole, size % 8) | (static_cast<uint64_t>(size & 0xff) << 56));
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

SlotKey new_slot_key() {
  SlotKey key{};
  size_t got = 0;
  auto* out = reinterpret_cast<unsigned char*>(key.data());
  while (got < sizeof(key)) {
    const ssize_t n = getrandom(out + got, sizeof(key) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return key;
}

uint32_t slot_owner(const SlotKey& key, pid_t pid, uint32_t pod_index, uint32_t proc_index,
                    uint32_t gpu_index) {
  const uint32_t words[4] = {static_cast<uint32_t>(pid), pod_index, proc_index, gpu_index};
  const uint64_t hash = siphash24(key, words, sizeof(words));
  const auto owner = static_cast<uint32_t>(hash ^ (hash >> 32));
  return owner != 0 ? owner : 1;
}

std::string slot_key_text(const SlotKey& key) {
  char text[33];
  std::snprintf(text, sizeof(text), "%016llx%016llx", static_cast<unsigned long long>(key[0]),
                static_cast<unsigned long long>(key[1]));
  return text;
}

bool parse_slot_key(const std::string& text, SlotKey* key) {
  if (text.size() != 32 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  (*key)[0] = std::stoull(text.substr(0, 16), nullptr, 16);
  (*key)[1] = std::stoull(text.substr(16), nullptr, 16);
  return true;
}

}  // namespace quanta::arbiter
