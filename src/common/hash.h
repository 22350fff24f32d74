// 64-bit hashing used for verification fills and plan fingerprints.
//
// Fill values must be strong (a stale or misplaced element must not match by accident), so
// they come from a full 64-bit mix of (tensor key, global index, epoch), never `index % 256`.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace reshard {

// splitmix64 finalizer: a bijective, well-mixed 64-bit permutation.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a over bytes followed by a final mix; stable across platforms and runs.
inline uint64_t HashBytes(const void* data, size_t size, uint64_t seed = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ULL ^ Mix64(seed);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

inline uint64_t HashString(std::string_view s, uint64_t seed = 0) {
  return HashBytes(s.data(), s.size(), seed);
}

// The value every verification fill writes for element `global_index` of a tensor whose name
// hashes to `tensor_key`, in refit `epoch`.
inline uint64_t FillValue(uint64_t tensor_key, uint64_t global_index, uint64_t epoch) {
  return Mix64(tensor_key ^ Mix64(global_index + 0x632be59bd9b4e019ULL * (epoch + 1)));
}

// Incremental fingerprint: feed fixed-width integers in a fixed order. Plans feed it tens of
// millions of words, so each word costs one multiply-xorshift round and value() finishes with
// Mix64. Every step is a bijection of the state for a given word and position (xor, odd
// multiply, xorshift), so a single differing word always changes the value.
class Fingerprint {
 public:
  void Add(uint64_t v) {
    state_ = (state_ ^ (v + 0x9e3779b97f4a7c15ULL * ++count_)) * 0xd6e8feb86659fd93ULL;
    state_ ^= state_ >> 32;
  }
  void Add(std::string_view s) {
    Add(s.size());
    Add(HashString(s));
  }
  uint64_t value() const { return Mix64(state_); }

 private:
  uint64_t state_ = 0x5265736861726421ULL;  // "Reshard!"
  uint64_t count_ = 0;
};

}  // namespace reshard
