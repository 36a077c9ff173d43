// AVX-512 row kernels of the policies (policy_cpu.cpp), where the compiler's own vectorisation of
// the portable loops does not reach: byte tables and pixel gathers. Each gives the bytes of the
// portable loop it replaces; the tests run both (gpupipe.set_cpu_capability). (The one-pass
// augmentation's bilinear neighbours stay scalar loads: two 8-byte gathers per 8 pixels took 1.25x
// the time of its rotation chain on Zen 4, a branch-free load loop 1.1x.)
#pragma once

#include <stdint.h>

#include "common/multiversion.h"

#if GPUPIPE_X86_LEVELS
#include <immintrin.h>

namespace gpupipe {
namespace simd {

// Byte v of a 256-byte table held in 4 registers: vpermi2b looks 128 entries up by the low 7 bits,
// bit 7 picks the half.
GPUPIPE_TARGET_AVX512_VBMI inline __m512i lookup256(const __m512i t[4], __m512i v, __mmask64 high) {
  return _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(t[0], v, t[1]), _mm512_permutex2var_epi8(t[2], v, t[3]));
}

GPUPIPE_TARGET_AVX512_VBMI inline void load_table(const uint8_t* table, __m512i t[4]) {
  for (int k = 0; k < 4; ++k) t[k] = _mm512_loadu_si512(table + 64 * k);
}

// out[o] = table[in[o]] for o in [0, n): one table for every byte.
GPUPIPE_TARGET_AVX512_VBMI inline void lut_bytes_vbmi(const uint8_t* in, uint8_t* out, int64_t n,
                                                      const uint8_t* table) {
  __m512i t[4];
  load_table(table, t);
  for (int64_t o = 0; o < n; o += 64) {
    const __mmask64 m = n - o >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - o)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi8(m, in + o);
    _mm512_mask_storeu_epi8(out + o, m, lookup256(t, v, _mm512_movepi8_mask(v)));
  }
}

// Channels-last bytes [0, n) of a row (byte o is channel o % 3) through the channel's table
// (lut: 3 x 256 bytes): each 64-byte block looked up in the three tables and merged by channel.
// 64 = 1 (mod 3), so block k's first byte is channel k % 3: three merge patterns, in turn.
GPUPIPE_TARGET_AVX512_VBMI inline void lut_channels_vbmi(const uint8_t* in, uint8_t* out, int64_t n,
                                                         const uint8_t* lut) {
  __m512i t0[4], t1[4], t2[4];
  load_table(lut, t0);
  load_table(lut + 256, t1);
  load_table(lut + 512, t2);
  // Lanes j with j % 3 == 0, 1, 2; in a block of phase p, channel c is at j % 3 == (c - p) mod 3.
  constexpr __mmask64 kLanes[3] = {0x9249249249249249ull, 0x2492492492492492ull, 0x4924924924924924ull};
  const __mmask64 of1[3] = {kLanes[1], kLanes[0], kLanes[2]};  // [phase]: lanes of channel 1
  const __mmask64 of2[3] = {kLanes[2], kLanes[1], kLanes[0]};  // lanes of channel 2
  int phase = 0;
  for (int64_t o = 0; o < n; o += 64) {
    const __mmask64 m = n - o >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - o)) - 1;
    const __m512i v = _mm512_maskz_loadu_epi8(m, in + o);
    const __mmask64 high = _mm512_movepi8_mask(v);
    __m512i r = lookup256(t0, v, high);
    r = _mm512_mask_blend_epi8(of1[phase], r, lookup256(t1, v, high));
    r = _mm512_mask_blend_epi8(of2[phase], r, lookup256(t2, v, high));
    _mm512_mask_storeu_epi8(out + o, m, r);
    phase = phase == 2 ? 0 : phase + 1;
  }
}

// Nearest-neighbour pixels of a channels-last output row from a channels-last image:
// pixel x is the 3 bytes at rows[x] * stride + 3 * columns[x], or `fill` where columns[x] < 0.
// Sixteen pixels per step: a 4-byte gather (the pixel and one byte beyond, dropped), the 3 bytes of
// each packed by a byte shuffle and a dword permute, one 48-byte store. Pixels in the image's last
// column would read past a row's end: those lanes are read 3 bytes at a time. Offsets must fit in
// int32. Returns the pixels done (whole steps of 16); the caller does the rest.
GPUPIPE_TARGET_AVX512 inline int32_t gather_pixels_avx512(const uint8_t* image, int32_t stride, int32_t image_w,
                                                          const int32_t* columns, const int32_t* rows, int32_t w,
                                                          uint32_t fill_word, uint8_t* out) {
  const __m512i fill = _mm512_set1_epi32(static_cast<int32_t>(fill_word));
  const __m512i last_column = _mm512_set1_epi32(image_w - 1), row_bytes = _mm512_set1_epi32(stride);
  const __m512i pack = _mm512_set_epi8(-1, -1, -1, -1, 14, 13, 12, 10, 9, 8, 6, 5, 4, 2, 1, 0,  //
                                       -1, -1, -1, -1, 14, 13, 12, 10, 9, 8, 6, 5, 4, 2, 1, 0,  //
                                       -1, -1, -1, -1, 14, 13, 12, 10, 9, 8, 6, 5, 4, 2, 1, 0,  //
                                       -1, -1, -1, -1, 14, 13, 12, 10, 9, 8, 6, 5, 4, 2, 1, 0);
  const __m512i dwords = _mm512_set_epi32(15, 15, 15, 15, 14, 13, 12, 10, 9, 8, 6, 5, 4, 2, 1, 0);
  const __mmask64 bytes48 = (__mmask64{1} << 48) - 1;
  int32_t x = 0;
  for (; x + 16 <= w; x += 16) {
    const __m512i col = _mm512_loadu_si512(columns + x);
    const __m512i row = _mm512_loadu_si512(rows + x);
    const __mmask16 inside = _mm512_cmpge_epi32_mask(col, _mm512_setzero_si512());
    const __mmask16 whole = _mm512_mask_cmplt_epi32_mask(inside, col, last_column);  // 4-byte reads stay in the row
    const __m512i offset = _mm512_add_epi32(_mm512_mullo_epi32(row, row_bytes),
                                            _mm512_add_epi32(col, _mm512_add_epi32(col, col)));
    __m512i v = _mm512_mask_i32gather_epi32(fill, whole, offset, image, 1);
    const __mmask16 edge = inside & static_cast<__mmask16>(~whole);
    if (edge) {
      alignas(64) int32_t lanes[16], offsets[16];
      _mm512_store_si512(lanes, v);
      _mm512_store_si512(offsets, offset);
      for (int j = 0; j < 16; ++j)
        if (edge >> j & 1) {
          const uint8_t* p = image + offsets[j];
          lanes[j] = static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16);
        }
      v = _mm512_load_si512(lanes);
    }
    const __m512i packed = _mm512_permutexvar_epi32(dwords, _mm512_shuffle_epi8(v, pack));
    _mm512_mask_storeu_epi8(out + 3 * static_cast<int64_t>(x), bytes48, packed);
  }
  return x;
}

}  // namespace simd
}  // namespace gpupipe

#else  // other architectures: the portable loops only; these are never called

namespace gpupipe {
namespace simd {
inline void lut_bytes_vbmi(const uint8_t*, uint8_t*, int64_t, const uint8_t*) {}
inline void lut_channels_vbmi(const uint8_t*, uint8_t*, int64_t, const uint8_t*) {}
inline int32_t gather_pixels_avx512(const uint8_t*, int32_t, int32_t, const int32_t*, const int32_t*, int32_t, uint32_t,
                                    uint8_t*) {
  return 0;
}
}  // namespace simd
}  // namespace gpupipe

#endif
