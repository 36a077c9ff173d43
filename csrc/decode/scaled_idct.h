// libjpeg-turbo's 3x3 and 6x6 inverse DCTs as AVX2 kernels with the same bits.
//
// DCT scaling at 3/8 (choose_scale_num picks it for crops 2.67-4x the output) has libjpeg run its
// jpeg_idct_3x3 on the luma blocks and, in 4:2:0 files, jpeg_idct_6x6 on the chroma blocks (a
// doubled chroma IDCT saves the upsampling). libjpeg-turbo has SIMD for 8x8, 4x4 and 2x2 only; these
// two are plain C: a later epoch's RandomResizedCrop 224 decode spent 5.6% of its time in them on the
// benchmark's default set and 10.5% on 1920x1280 photos, about 230 cycles per 6x6 block.
//
// The kernels run the C code's arithmetic lane by lane in 32-bit lanes (the columns of a block in
// the first pass, its rows in the second). libjpeg computes in 64 bits. The second pass's result is
// only ever read through its bits 18-27 (a shift and libjpeg's 10-bit range mask), and wrapping
// 32-bit adds, multiplies and left shifts keep the low 32 bits of the 64-bit ones exactly, so it
// needs no bound. The first pass's shifted outputs need all their bits: a block is handed to
// libjpeg's own function when a dequantized coefficient exceeds the bound under which no first-pass
// value leaves int32 (kLimit6 and kLimit3, derived in the .cpp; real photos stay under ~2^11).
//
// Installed per image after jpeg_start_decompress, for the components whose method libjpeg chose is
// one of the two (compared by address), when the CPU runs AVX2, the range-limit table is the
// standard one and, checked once per process, a block through each kernel and libjpeg's function
// gives the same bytes. GPUPIPE_VECTOR_IDCT=0 turns it off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE

#include <jpeglib.h>

namespace gpupipe {

// Swaps libjpeg's jpeg_idct_3x3 / jpeg_idct_6x6 for the AVX2 kernels where it chose them (call after
// jpeg_start_decompress, before the first row); returns the number of components swapped.
int use_vector_idcts(j_decompress_ptr cinfo);
bool set_vector_idcts(bool on);  // returns the previous setting
uint64_t vector_idct_swaps();     // components swapped so far (the tests: the kernels do run)

struct VectorIdctCheck {
  int64_t blocks = 0;     // blocks compared
  int64_t different = 0;  // whose output differed from libjpeg's function (must be 0)
  int64_t handed = 0;     // of those, blocks the kernel handed to libjpeg's function (over the bound)
  int64_t overwrote = 0;  // blocks whose kernel wrote outside its size x size output
};
// Test: through the kernel for `size` (3 or 6) and libjpeg's function, byte for byte, at output
// columns 0-8: every sign pattern of a column's rows at the bound and one past it, then `blocks`
// random blocks (seeded; typical, any 16-bit values, at the bound). blocks = 0 when the kernels
// cannot run here.
VectorIdctCheck check_vector_idcts(int size, int64_t blocks, uint64_t seed);

}  // namespace gpupipe
