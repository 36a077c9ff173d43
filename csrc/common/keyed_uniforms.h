// gpupipe.keyed.uniforms in native code: every random draw of gpupipe (crop boxes, augmentation
// parameters) is a SplitMix64 hash of (seed, epoch, stream, sample index, draw number), so a sample's
// draws never depend on its batch, the thread count or what ran before. The same integer arithmetic
// as the numpy definition in gpupipe/keyed.py (tests/test_keyed.py holds the two equal, bit for bit).
#pragma once

#include <cstdint>

namespace gpupipe {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// SplitMix64's finaliser.
inline uint64_t splitmix_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// out[i * count + k]: draw k of sample indices[i], uniform in [0, 1) with 53 random bits.
// seed, epoch and stream are taken modulo 2^64; stream 0 is the crop samplers'.
inline void keyed_uniforms(uint64_t seed, uint64_t epoch, uint64_t stream, const int64_t* indices, int64_t n,
                           int64_t count, double* out) {
  uint64_t key = splitmix_mix(seed + kGolden);
  key = splitmix_mix(key ^ (epoch * kGolden));
  if (stream != 0) key = splitmix_mix(key ^ splitmix_mix(stream + kGolden));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t sample = splitmix_mix(key ^ splitmix_mix(static_cast<uint64_t>(indices[i]) + kGolden));
    for (int64_t k = 0; k < count; ++k) {
      const uint64_t bits = splitmix_mix(sample + static_cast<uint64_t>(k + 1) * kGolden) >> 11;
      out[i * count + k] = static_cast<double>(bits) * 0x1p-53;
    }
  }
}

}  // namespace gpupipe
