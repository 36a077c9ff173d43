#include "decode/scaled_idct.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/multiversion.h"

#if GPUPIPE_X86_LEVELS
#include <immintrin.h>
#endif

using IdctMethod = void (*)(j_decompress_ptr, jpeg_component_info*, JCOEFPTR, JSAMPARRAY, JDIMENSION);

extern "C" {
// libjpeg-turbo's scaled IDCTs (jidctint.c), exported though declared in its private jdct.h. Weak:
// a libjpeg without them leaves the kernels off.
__attribute__((weak)) void jpeg_idct_3x3(j_decompress_ptr, jpeg_component_info*, JCOEFPTR, JSAMPARRAY, JDIMENSION);
__attribute__((weak)) void jpeg_idct_6x6(j_decompress_ptr, jpeg_component_info*, JCOEFPTR, JSAMPARRAY, JDIMENSION);
}

namespace gpupipe {
namespace {

// ISLOW_MULT_TYPE, the element of a component's dct_table: jmorecfg.h's MULTIPLIER (declared for
// libjpeg's own sources only), short in builds with SIMD.
#ifdef WITH_SIMD
using Multiplier = short;
#else
using Multiplier = int;
#endif

// libjpeg's IDCT controller (jpegint.h: struct jpeg_inverse_dct), the methods it chose per component.
struct InverseDct {
  void (*start_pass)(j_decompress_ptr);
  IdctMethod inverse_DCT[MAX_COMPONENTS];
};

std::atomic<bool> g_enabled{[] {
  const char* v = std::getenv("GPUPIPE_VECTOR_IDCT");
  return !(v && v[0] == '0' && v[1] == '\0');
}()};

// jidctint.c's fixed point for 8-bit samples: constants with 13 fraction bits, first-pass outputs
// with 2 more bits than the result.
constexpr int kConstBits = 13, kPass1Bits = 2;
constexpr int32_t fix(double x) { return static_cast<int32_t>(x * (1 << kConstBits) + 0.5); }
constexpr int32_t kC4 = fix(0.707106781), kC2 = fix(1.224744871), kC5 = fix(0.366025404);

// The largest dequantized coefficient for which no first-pass value leaves int32: each is a sum of
// constants times the column's coefficients (+ the rounding term), so at most the sum of the
// constants' magnitudes times the largest coefficient. 6x6, output 0: the even part's 8192 + c4 + c2
// and the odd part's 2 x c5 + 2 x 8192; 3x3, output 0: 8192 + c4 + c2.
constexpr int64_t kRounding = int64_t{1} << (kConstBits - kPass1Bits - 1);
constexpr int64_t kSum6 = (8192 + kC4 + kC2) + (2 * kC5 + 2 * 8192), kSum3 = 8192 + kC4 + kC2;
static_assert(kSum6 == 46398 && kSum3 == 24018, "jidctint.c's constants");
constexpr int32_t kLimit6 = static_cast<int32_t>((int64_t{INT32_MAX} - kRounding) / kSum6);
constexpr int32_t kLimit3 = static_cast<int32_t>((int64_t{INT32_MAX} - kRounding) / kSum3);

// The range limit libjpeg applies after its IDCTs (jdmaster.c's table, read at index x & 1023 from
// sample_range_limit + 128): x wrapped to 10 bits and read as [-512, 512), + 128, clamped to 0-255.
inline int range_limited(int idx) {
  const int v = ((idx + 512) & 1023) - 384;
  return v < 0 ? 0 : v > 255 ? 255 : v;
}

bool standard_range_limit(const JSAMPLE* sample_range_limit) {
  if (!sample_range_limit) return false;
  const JSAMPLE* t = sample_range_limit + CENTERJSAMPLE;
  for (int i = 0; i < 1024; ++i)
    if (t[i] != range_limited(i)) return false;
  return true;
}

#if GPUPIPE_X86_LEVELS

template <typename M>
GPUPIPE_TARGET_AVX2 inline __m256i quant_row8(const M* q) {
  if constexpr (sizeof(M) == 2) return _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  else return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
}

template <typename M>
GPUPIPE_TARGET_AVX2 inline __m128i quant_row4(const M* q) {
  if constexpr (sizeof(M) == 2) return _mm_cvtepi16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  else return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

GPUPIPE_TARGET_AVX2 inline void transpose8x8(__m256i r[8]) {
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// The second pass's 32-bit sum -> libjpeg's range-limited sample (as int32, 0-255 after packing):
// bits 18-27 of the sum as a 10-bit index into the table standard_range_limit checked.
GPUPIPE_TARGET_AVX2 inline __m256i descale_limit8(__m256i sum) {
  const __m256i idx = _mm256_srai_epi32(sum, kConstBits + kPass1Bits + 3);
  return _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(idx, _mm256_set1_epi32(512)), _mm256_set1_epi32(1023)),
                          _mm256_set1_epi32(384));
}
GPUPIPE_TARGET_AVX2 inline __m128i descale_limit4(__m128i sum) {
  const __m128i idx = _mm_srai_epi32(sum, kConstBits + kPass1Bits + 3);
  return _mm_sub_epi32(_mm_and_si128(_mm_add_epi32(idx, _mm_set1_epi32(512)), _mm_set1_epi32(1023)),
                       _mm_set1_epi32(384));
}

// 32-bit lane arithmetic, as jidctint.c writes it
GPUPIPE_TARGET_AVX2 inline __m256i mul(__m256i v, int32_t k) { return _mm256_mullo_epi32(v, _mm256_set1_epi32(k)); }
GPUPIPE_TARGET_AVX2 inline __m256i shl(__m256i v, int n) { return _mm256_slli_epi32(v, n); }
GPUPIPE_TARGET_AVX2 inline __m256i sar(__m256i v, int n) { return _mm256_srai_epi32(v, n); }
GPUPIPE_TARGET_AVX2 inline __m256i add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
GPUPIPE_TARGET_AVX2 inline __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi32(a, b); }
GPUPIPE_TARGET_AVX2 inline __m128i mul(__m128i v, int32_t k) { return _mm_mullo_epi32(v, _mm_set1_epi32(k)); }
GPUPIPE_TARGET_AVX2 inline __m128i shl(__m128i v, int n) { return _mm_slli_epi32(v, n); }
GPUPIPE_TARGET_AVX2 inline __m128i sar(__m128i v, int n) { return _mm_srai_epi32(v, n); }
GPUPIPE_TARGET_AVX2 inline __m128i add(__m128i a, __m128i b) { return _mm_add_epi32(a, b); }
GPUPIPE_TARGET_AVX2 inline __m128i sub(__m128i a, __m128i b) { return _mm_sub_epi32(a, b); }

// jpeg_idct_6x6: the first pass over the block's columns 0-5 in lanes 0-5, the second over its rows.
GPUPIPE_TARGET_AVX2 void idct_6x6(j_decompress_ptr cinfo, jpeg_component_info* comp, JCOEFPTR coef,
                                  JSAMPARRAY out, JDIMENSION col) {
  const Multiplier* q = static_cast<const Multiplier*>(comp->dct_table);
  __m256i d[6];
  __m256i over = _mm256_setzero_si256();
  const __m256i limit = _mm256_set1_epi32(kLimit6);
  for (int r = 0; r < 6; ++r) {
    const __m256i c = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(coef + 8 * r)));
    d[r] = _mm256_mullo_epi32(c, quant_row8(q + 8 * r));  // |coef x q| < 2^31: exact
    over = _mm256_or_si256(over, _mm256_cmpgt_epi32(_mm256_abs_epi32(d[r]), limit));
  }
  if (!_mm256_testz_si256(over, over)) {  // a first-pass value could leave int32: libjpeg's 64-bit code
    jpeg_idct_6x6(cinfo, comp, coef, out, col);
    return;
  }
  constexpr int kPass1Shift = kConstBits - kPass1Bits;

  // Pass 1, lanes = columns; w[k] = the column's output k (libjpeg's workspace row k).
  __m256i w[8];
  {
    __m256i t0 = add(shl(d[0], kConstBits), _mm256_set1_epi32(static_cast<int32_t>(kRounding)));
    __m256i t10 = mul(d[4], kC4);
    __m256i t1 = add(t0, t10);
    const __m256i t11 = sar(sub(sub(t0, t10), t10), kPass1Shift);
    t0 = mul(d[2], kC2);
    t10 = add(t1, t0);
    const __m256i t12 = sub(t1, t0);
    const __m256i z1 = d[1], z2 = d[3], z3 = d[5];
    t1 = mul(add(z1, z3), kC5);
    t0 = add(t1, shl(add(z1, z2), kConstBits));
    const __m256i t2 = add(t1, shl(sub(z3, z2), kConstBits));
    t1 = shl(sub(sub(z1, z2), z3), kPass1Bits);
    w[0] = sar(add(t10, t0), kPass1Shift);
    w[5] = sar(sub(t10, t0), kPass1Shift);
    w[1] = add(t11, t1);
    w[4] = sub(t11, t1);
    w[2] = sar(add(t12, t2), kPass1Shift);
    w[3] = sar(sub(t12, t2), kPass1Shift);
    w[6] = w[7] = _mm256_setzero_si256();
  }
  transpose8x8(w);  // w[j] lane k: workspace row k, column j (the second pass's input j of row k)

  // Pass 2, lanes = rows; wrapping 32-bit arithmetic (bits 18-27 of the sums are libjpeg's).
  __m256i o[8];
  {
    __m256i t0 = shl(add(w[0], _mm256_set1_epi32(1 << (kPass1Bits + 2))), kConstBits);
    __m256i t10 = mul(w[4], kC4);
    __m256i t1 = add(t0, t10);
    const __m256i t11 = sub(sub(t0, t10), t10);
    t0 = mul(w[2], kC2);
    t10 = add(t1, t0);
    const __m256i t12 = sub(t1, t0);
    const __m256i z1 = w[1], z2 = w[3], z3 = w[5];
    t1 = mul(add(z1, z3), kC5);
    t0 = add(t1, shl(add(z1, z2), kConstBits));
    const __m256i t2 = add(t1, shl(sub(z3, z2), kConstBits));
    t1 = shl(sub(sub(z1, z2), z3), kConstBits);
    o[0] = descale_limit8(add(t10, t0));
    o[5] = descale_limit8(sub(t10, t0));
    o[1] = descale_limit8(add(t11, t1));
    o[4] = descale_limit8(sub(t11, t1));
    o[2] = descale_limit8(add(t12, t2));
    o[3] = descale_limit8(sub(t12, t2));
    o[6] = o[7] = _mm256_setzero_si256();
  }
  transpose8x8(o);  // o[k] lane j: the sample at row k, column j
  for (int k = 0; k < 6; ++k) {
    const __m128i s16 = _mm_packs_epi32(_mm256_castsi256_si128(o[k]), _mm256_extracti128_si256(o[k], 1));
    const __m128i s8 = _mm_packus_epi16(s16, s16);  // the clamp to 0-255
    JSAMPLE* dst = out[k] + col;
    const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(s8));
    const uint16_t hi = static_cast<uint16_t>(_mm_extract_epi16(s8, 2));
    std::memcpy(dst, &lo, 4);  // exactly the block's 6 samples: the next block's follow
    std::memcpy(dst + 4, &hi, 2);
  }
}

GPUPIPE_TARGET_AVX2 inline void transpose4x4(__m128i r[4]) {
  const __m128i t0 = _mm_unpacklo_epi32(r[0], r[1]), t1 = _mm_unpackhi_epi32(r[0], r[1]);
  const __m128i t2 = _mm_unpacklo_epi32(r[2], r[3]), t3 = _mm_unpackhi_epi32(r[2], r[3]);
  r[0] = _mm_unpacklo_epi64(t0, t2);
  r[1] = _mm_unpackhi_epi64(t0, t2);
  r[2] = _mm_unpacklo_epi64(t1, t3);
  r[3] = _mm_unpackhi_epi64(t1, t3);
}

// jpeg_idct_3x3: columns 0-2 in lanes 0-2, then the rows.
GPUPIPE_TARGET_AVX2 void idct_3x3(j_decompress_ptr cinfo, jpeg_component_info* comp, JCOEFPTR coef,
                                  JSAMPARRAY out, JDIMENSION col) {
  const Multiplier* q = static_cast<const Multiplier*>(comp->dct_table);
  __m128i d[3];
  __m128i over = _mm_setzero_si128();
  const __m128i limit = _mm_set1_epi32(kLimit3);
  for (int r = 0; r < 3; ++r) {
    const __m128i c = _mm_cvtepi16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(coef + 8 * r)));
    d[r] = _mm_mullo_epi32(c, quant_row4(q + 8 * r));
    over = _mm_or_si128(over, _mm_cmpgt_epi32(_mm_abs_epi32(d[r]), limit));
  }
  if (!_mm_testz_si128(over, over)) {
    jpeg_idct_3x3(cinfo, comp, coef, out, col);
    return;
  }
  constexpr int kPass1Shift = kConstBits - kPass1Bits;
  __m128i w[4];
  {
    const __m128i t0 = add(shl(d[0], kConstBits), _mm_set1_epi32(static_cast<int32_t>(kRounding)));
    const __m128i t12 = mul(d[2], kC4);
    const __m128i t10 = add(t0, t12);
    const __m128i t2 = sub(sub(t0, t12), t12);
    const __m128i odd = mul(d[1], kC2);
    w[0] = sar(add(t10, odd), kPass1Shift);
    w[2] = sar(sub(t10, odd), kPass1Shift);
    w[1] = sar(t2, kPass1Shift);
    w[3] = _mm_setzero_si128();
  }
  transpose4x4(w);
  __m128i o[4];
  {
    const __m128i t0 = shl(add(w[0], _mm_set1_epi32(1 << (kPass1Bits + 2))), kConstBits);
    const __m128i t12 = mul(w[2], kC4);
    const __m128i t10 = add(t0, t12);
    const __m128i t2 = sub(sub(t0, t12), t12);
    const __m128i odd = mul(w[1], kC2);
    o[0] = descale_limit4(add(t10, odd));
    o[2] = descale_limit4(sub(t10, odd));
    o[1] = descale_limit4(t2);
    o[3] = _mm_setzero_si128();
  }
  transpose4x4(o);
  for (int k = 0; k < 3; ++k) {
    const __m128i s16 = _mm_packs_epi32(o[k], o[k]);
    const __m128i s8 = _mm_packus_epi16(s16, s16);
    JSAMPLE* dst = out[k] + col;
    const uint16_t lo = static_cast<uint16_t>(_mm_extract_epi16(s8, 0));
    std::memcpy(dst, &lo, 2);
    dst[2] = static_cast<JSAMPLE>(_mm_extract_epi8(s8, 2));
  }
}

#endif  // GPUPIPE_X86_LEVELS

std::atomic<uint64_t> g_swapped{0};

bool kernels_run_here() {
#if GPUPIPE_X86_LEVELS
  return jpeg_idct_3x3 != nullptr && jpeg_idct_6x6 != nullptr && static_cast<int>(cpu_level()) >= static_cast<int>(CpuLevel::kAvx2);
#else
  return false;
#endif
}

#if GPUPIPE_X86_LEVELS
// Eight rows of 32 bytes, filled with kPattern(i), then one block's samples written by `method` from
// output_col (< 8): the block's output and, around it, what it must leave alone.
constexpr int kCheckRow = 32;
using CheckRows = std::array<JSAMPLE, 8 * kCheckRow>;
constexpr JSAMPLE kPattern(int i) { return static_cast<JSAMPLE>(0xA5 ^ i); }

CheckRows run_block(IdctMethod method, j_decompress_ptr cinfo, jpeg_component_info* comp, JCOEF* coef,
                    JDIMENSION output_col) {
  CheckRows rows;
  JSAMPROW starts[8];
  for (int k = 0; k < 8; ++k) starts[k] = rows.data() + k * kCheckRow;
  for (int i = 0; i < 8 * kCheckRow; ++i) rows[i] = kPattern(i);
  method(cinfo, comp, coef, starts, output_col);
  return rows;
}

bool same_block(IdctMethod theirs, IdctMethod mine, j_decompress_ptr cinfo, jpeg_component_info* comp, JCOEF* coef,
                JDIMENSION output_col) {
  return run_block(theirs, cinfo, comp, coef, output_col) == run_block(mine, cinfo, comp, coef, output_col);
}

// Whether the kernels give libjpeg's bytes in this process, checked once on the first decode that
// would take them, with its range-limit table: a block of each size whose quantizers are written as
// Multiplier (jconfig.h's WITH_SIMD says short; a library built otherwise reads ints, and differs).
std::atomic<int> g_verified{0};  // 0: not yet, 1: the same bytes, -1: not (the kernels stay off)

bool verified(j_decompress_ptr cinfo) {
  int v = g_verified.load(std::memory_order_relaxed);
  if (v == 0) {
    alignas(32) unsigned char table[DCTSIZE2 * sizeof(int)] = {};  // room for ints, read either way
    Multiplier* quant = reinterpret_cast<Multiplier*>(table);
    JCOEF coef[DCTSIZE2];
    for (int i = 0; i < DCTSIZE2; ++i) {
      quant[i] = static_cast<Multiplier>(1 + (i * 7) % 13);
      coef[i] = static_cast<JCOEF>((i * 37) % 41 - 20);  // well inside the bound: the kernels' own path
    }
    jpeg_component_info comp;
    std::memset(&comp, 0, sizeof(comp));
    comp.dct_table = quant;
    v = same_block(jpeg_idct_6x6, idct_6x6, cinfo, &comp, coef, 1) &&
                same_block(jpeg_idct_3x3, idct_3x3, cinfo, &comp, coef, 1)
            ? 1
            : -1;
    g_verified.store(v, std::memory_order_relaxed);
  }
  return v > 0;
}
#endif

}  // namespace

int use_vector_idcts(j_decompress_ptr cinfo) {
#if GPUPIPE_X86_LEVELS
  if (!g_enabled.load(std::memory_order_relaxed) || !kernels_run_here() || !cinfo->idct) return 0;
  auto* idct = reinterpret_cast<InverseDct*>(cinfo->idct);
  int swapped = 0;
  bool table_checked = false;
  for (int ci = 0; ci < cinfo->num_components && ci < MAX_COMPONENTS; ++ci) {
    const IdctMethod chosen = idct->inverse_DCT[ci];
    const IdctMethod mine = chosen == jpeg_idct_6x6 ? idct_6x6 : chosen == jpeg_idct_3x3 ? idct_3x3 : nullptr;
    if (!mine) continue;
    if (!table_checked) {
      if (!standard_range_limit(cinfo->sample_range_limit) || !verified(cinfo)) return swapped;
      table_checked = true;
    }
    idct->inverse_DCT[ci] = mine;
    ++swapped;
  }
  if (swapped) g_swapped.fetch_add(static_cast<uint64_t>(swapped), std::memory_order_relaxed);
  return swapped;
#else
  (void)cinfo;
  return 0;
#endif
}

bool set_vector_idcts(bool on) { return g_enabled.exchange(on); }

uint64_t vector_idct_swaps() { return g_swapped.load(std::memory_order_relaxed); }

VectorIdctCheck check_vector_idcts(int size, int64_t blocks, uint64_t seed) {
  VectorIdctCheck result;
#if GPUPIPE_X86_LEVELS
  if (!kernels_run_here() || (size != 3 && size != 6)) return result;
  const IdctMethod theirs = size == 6 ? jpeg_idct_6x6 : jpeg_idct_3x3;
  const IdctMethod mine = size == 6 ? idct_6x6 : idct_3x3;
  const int32_t bound = size == 6 ? kLimit6 : kLimit3;
  const int lanes = size == 6 ? 8 : 4;  // the columns a kernel's bound check reads
  // libjpeg's range-limit table: [-256, 0) -> 0, [0, 256) itself, then the post-IDCT part
  std::vector<JSAMPLE> table(5 * 256 + CENTERJSAMPLE);
  JSAMPLE* limit = table.data() + 256;
  for (int i = -256; i < 256; ++i) limit[i] = static_cast<JSAMPLE>(i < 0 ? 0 : i);
  for (int i = 0; i < 1024; ++i) limit[CENTERJSAMPLE + i] = static_cast<JSAMPLE>(range_limited(i));
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof(cinfo));
  cinfo.sample_range_limit = limit;
  jpeg_component_info comp;
  std::memset(&comp, 0, sizeof(comp));
  Multiplier quant[DCTSIZE2];
  comp.dct_table = quant;
  JCOEF coef[DCTSIZE2];
  const auto compare = [&](JDIMENSION output_col) {
    bool over = false;
    for (int r = 0; r < size; ++r)
      for (int c = 0; c < lanes; ++c) {
        const int64_t v = static_cast<int64_t>(coef[r * 8 + c]) * static_cast<int64_t>(quant[r * 8 + c]);
        over = over || v > bound || v < -bound;
      }
    ++result.blocks;
    result.handed += over;
    const CheckRows ours = run_block(mine, &cinfo, &comp, coef, output_col);
    if (ours != run_block(theirs, &cinfo, &comp, coef, output_col)) {
      ++result.different;
      for (int i = 0; i < 8 * kCheckRow; ++i) {  // what the kernel wrote outside its size x size samples
        const int k = i / kCheckRow, c = i % kCheckRow - static_cast<int>(output_col);
        if ((k >= size || c < 0 || c >= size) && ours[i] != kPattern(i)) {
          ++result.overwrote;
          break;
        }
      }
    }
  };
  // Each first-pass value's worst case: every sign pattern of a column's rows (0 included), in all
  // columns, at the bound (the dequantized values exactly +-bound) and one past it.
  for (const int32_t target : {bound, bound + 1}) {
    int32_t q = 2;
    while (target % q != 0 || target / q > 32767) ++q;  // a quantizer and coefficient whose product is it
    for (int i = 0; i < DCTSIZE2; ++i) quant[i] = static_cast<Multiplier>(q);
    int patterns = 1;
    for (int r = 0; r < size; ++r) patterns *= 3;
    for (int p = 0; p < patterns; ++p) {
      std::memset(coef, 0, sizeof(coef));
      for (int r = 0, code = p; r < size; ++r, code /= 3)
        for (int c = 0; c < 8; ++c) coef[r * 8 + c] = static_cast<JCOEF>((code % 3 - 1) * (target / q));
      compare(static_cast<JDIMENSION>(p % 8));
    }
  }
  std::mt19937_64 rng(seed);
  const auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int64_t n = 0; n < blocks; ++n) {
    const int kind = static_cast<int>(n % 4);
    for (int i = 0; i < DCTSIZE2; ++i) {
      int64_t qv = 1, c = 0;
      if (kind == 0) {  // a photo's block: small quantizers, sparse low-frequency coefficients
        qv = uniform(1, 99);
        if (i == 0) c = uniform(-1024, 1023) / qv;
        else if (uniform(0, 2) == 0) c = uniform(-60, 60);
      } else if (kind == 1) {  // anything a file can hold: 16-bit coefficients and quantizers
        qv = uniform(1, 65535);
        c = uniform(-32768, 32767);
      } else {  // at the bound: every dequantized coefficient within it, many exactly at it
        qv = uniform(1, kind == 2 ? 2000 : 40);
        const int64_t m = std::min<int64_t>(bound / qv, 32767);
        c = uniform(0, 3) == 0 ? uniform(-m, m) : (uniform(0, 1) ? m : -m);
      }
      quant[i] = static_cast<Multiplier>(qv);
      coef[i] = static_cast<JCOEF>(c);
    }
    if (kind == 2 && uniform(0, 1)) {  // and one just over it, in the block's used part
      const int i = static_cast<int>(uniform(0, size - 1) * 8 + uniform(0, size - 1));
      const int64_t over_by_one = bound / quant[i] + 1;
      if (over_by_one <= 32767) coef[i] = static_cast<JCOEF>(uniform(0, 1) ? over_by_one : -over_by_one);
    }
    compare(static_cast<JDIMENSION>(n % 9));
  }
#else
  (void)size, (void)blocks, (void)seed;
#endif
  return result;
}

}  // namespace gpupipe
