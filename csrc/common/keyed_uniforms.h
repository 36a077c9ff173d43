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

// The key of (seed, epoch, stream), all taken modulo 2^64; stream 0 is the crop samplers'.
inline uint64_t keyed_stream_key(uint64_t seed, uint64_t epoch, uint64_t stream) {
  uint64_t key = splitmix_mix(seed + kGolden);
  key = splitmix_mix(key ^ (epoch * kGolden));
  if (stream != 0) key = splitmix_mix(key ^ splitmix_mix(stream + kGolden));
  return key;
}

// One sample's key, then its draw k (uniform in [0, 1) with 53 random bits): a draw is computed
// alone, so a sampler draws only what it uses.
inline uint64_t keyed_sample_key(uint64_t stream_key, int64_t index) {
  return splitmix_mix(stream_key ^ splitmix_mix(static_cast<uint64_t>(index) + kGolden));
}
inline double keyed_draw(uint64_t sample_key, int64_t k) {
  return static_cast<double>(splitmix_mix(sample_key + static_cast<uint64_t>(k + 1) * kGolden) >> 11) * 0x1p-53;
}

// out[i * count + k]: draw k of sample indices[i].
inline void keyed_uniforms(uint64_t seed, uint64_t epoch, uint64_t stream, const int64_t* indices, int64_t n,
                           int64_t count, double* out) {
  const uint64_t key = keyed_stream_key(seed, epoch, stream);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t sample = keyed_sample_key(key, indices[i]);
    for (int64_t k = 0; k < count; ++k) out[i * count + k] = keyed_draw(sample, k);
  }
}

}  // namespace gpupipe
