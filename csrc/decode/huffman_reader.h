// gpupipe's Huffman decoding of baseline JPEGs, inside libjpeg-turbo's pipeline.
//
// libjpeg-turbo entropy-decodes every MCU of every row it passes, the rows above a crop
// (jpeg_skip_scanlines) and the columns either side of it (jpeg_crop_scanline), although it only
// inverse-transforms the crop's: for RandomResizedCrop on 800x533 photos about half of the MCUs it
// decodes are never used, and Huffman decoding is most of a crop's decode time. HuffmanReader takes
// over libjpeg's decode_mcu method for one image. MCUs the crop does not need are only passed: the
// bit position and the DC predictions advance, several AC symbols per table lookup, nothing stored.
// MCUs it needs are decoded into libjpeg's coefficient blocks exactly as libjpeg stores them, up to
// two coefficients and an end of block per lookup (codes and values together); libjpeg's IDCT,
// upsampling and color conversion do the rest.
//
// Control passes to libjpeg's own decoder through the leading fields of libjpeg-turbo's private
// Huffman state (jdhuff.c: the public methods, the bit buffer, the DC predictions). Each image checks
// that layout: its first MCU is decoded both ways and must leave the same bit position, predictions
// and coefficients, else the image is decoded by libjpeg alone. Whatever is unusual (a marker in the
// data, the data's end, a code libjpeg would warn about) is handed to libjpeg's decoder at the start
// of that MCU, so libjpeg meets it in the state it would have reached itself (docs/semantics.md names
// the one narrow difference). Taken: baseline or extended sequential Huffman, one scan holding every
// component, no restart markers (files with them have the restart route), an EOI marker in the last
// kilobyte, and no marker that libjpeg's fast decoder could meet mid-scan (it would redo that MCU over
// the coefficients its fast attempt stored, at an MCU set by its own read-ahead: see
// fast_decoder_may_meet_a_marker). GPUPIPE_HUFFMAN_READER=0 turns it off.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE
#include <vector>

#include <jpeglib.h>

#include "decode/entropy_index.h"

namespace gpupipe {

struct HuffmanReaderStats {
  uint64_t images = 0;      // images the reader was installed on
  uint64_t rejected = 0;    // of those, images whose first-MCU check failed (decoded by libjpeg alone)
  uint64_t skipped = 0;     // MCUs skipped
  uint64_t decoded = 0;     // MCUs the crop needs, decoded into libjpeg's blocks
  uint64_t handed_back = 0; // MCUs handed to libjpeg's decoder (marker, data end, bad code)
  uint64_t coasted = 0;     // MCUs not read at all: the entropy index knew where the next row starts
};

HuffmanReaderStats huffman_reader_stats();
bool set_huffman_reader(bool on);  // returns the previous setting (default: on unless GPUPIPE_HUFFMAN_READER=0)

class HuffmanReader {
 public:
  // Takes over cinfo's decode_mcu; the MCU columns that the output window [crop_x, crop_x +
  // crop_width) of the scaled frame covers (jpeg_crop_scanline's aligned values; the whole width
  // when not cropped) are stored, the others passed. Call after jpeg_start_decompress and
  // jpeg_crop_scanline, before the first row is read or skipped. Returns false, changing nothing,
  // when the scan does not qualify.
  bool install(j_decompress_ptr cinfo, unsigned crop_x, unsigned crop_width);
  // The entropy index's rows for this decode (entropy_index.h), or nullptr: call before install.
  // The reader starts from the known row starts and learns those it reaches after them (when the
  // output needs every component: the DC predictions of all of them are then kept).
  void use_index(EntropyIndexUse* use) { use_ = use; }
  void flush_stats();  // adds this image's counts to the process's (Decoder::decode, after each decode)

  static constexpr int kLookahead = 10;  // bits per single-symbol lookup
  static constexpr int kMultiBits = 12;  // bits per multi-symbol lookup (AC)
  static constexpr int kPairBits = 11;   // bits per lookup of up to two stored AC coefficients

  struct Table {
    // The table's identity: DC or AC, its code counts and symbols (a decode's tables are cached).
    bool dc = false;
    uint8_t bits[17] = {};
    uint8_t huffval[256] = {};
    // kLookahead bits -> one AC symbol: what to consume (see the k* constants in huffman_reader.cpp).
    uint16_t lut[1 << kLookahead];
    // kMultiBits bits -> every whole AC symbol (code and magnitude) they hold, up to an end of
    // block: the bits they take and the index advance (see kM* in the .cpp).
    uint16_t multi[1 << kMultiBits];
    // kLookahead bits -> one AC symbol with its value, for MCUs stored; in a DC table the
    // difference with its code (see kV* in the .cpp).
    int32_t vlut[1 << kLookahead];
    // kPairBits bits -> up to two AC coefficients of small magnitude with their values, and an end
    // of block after them, for MCUs stored (see kP* in the .cpp).
    uint32_t pairs[1 << kPairBits];
    int32_t maxcode[18];    // as libjpeg's d_derived_tbl: the largest code of each length, -1: none
    int32_t valoffset[18];  // huffval index of a length's first code, minus that code
    uint64_t used = 0;      // for the cache's eviction
  };

  struct Reader {  // the bit buffer: the next `nbits` bits are the top of `buf`, the rest zeros
    uint64_t buf = 0;
    int nbits = 0;
    const uint8_t* p = nullptr;    // the next byte to load
    const uint8_t* end = nullptr;  // the end of the data
    int pred[4] = {0, 0, 0, 0};    // DC predictions by component of the scan
  };

 private:
  static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* data);
  // One MCU: with kStore its coefficients into `data` (zeroed by libjpeg), as libjpeg's decoder
  // stores them; without, only passed. On failure `r` is unchanged (the MCU is libjpeg's).
  template <bool kStore>
  bool mcu(Reader* r, JBLOCKROW* data) const;
  // The reader's state from libjpeg's (bit buffer, source position, DC predictions), and back.
  void load_state(j_decompress_ptr cinfo);
  void store_state(j_decompress_ptr cinfo);
  bool check_first(j_decompress_ptr cinfo, JBLOCKROW* data, boolean* result);
  // The entropy index: row starts known (those of use_->known, then those learned this decode).
  unsigned rows_known() const { return known_rows_ + (learning_ ? static_cast<unsigned>(use_->learned.size()) : 0); }
  const EntropyCheckpoint& checkpoint(unsigned row) const {
    return row < known_rows_ ? known_[row] : use_->learned[row - known_rows_];
  }
  // After MCUs passed without reading: the reader at MCU (row, col), from row's start.
  void materialize(j_decompress_ptr cinfo, unsigned row, unsigned col);
  void record(unsigned row);  // row's start, at its first MCU, when it is the next row to learn
  void keep(const EntropyCheckpoint& cp);     // a learned row (no memory: learning stops)
  bool expand_known(const EntropyRows& rows);  // into known_ (no memory: false, as rows rejected)
  void stop_learning() { learning_ = false; }

  const Table* table(const JHUFF_TBL* h, bool dc);  // built, or from the cache; nullptr: invalid

  static constexpr int kCached = 2 * NUM_HUFF_TBLS;  // as many as one scan can use; data sets share a few
  Table cache_[kCached];
  uint64_t clock_ = 0, install_clock_ = 0;
  const Table* block_dc_[D_MAX_BLOCKS_IN_MCU] = {};
  const Table* block_ac_[D_MAX_BLOCKS_IN_MCU] = {};
  int block_comp_[D_MAX_BLOCKS_IN_MCU] = {};
  bool block_ac_needed_[D_MAX_BLOCKS_IN_MCU] = {};  // libjpeg's ac_needed: it stores the block's ACs
  int blocks_ = 0, comps_ = 0;
  unsigned mcus_per_row_ = 0, first_col_ = 0, last_col_ = 0, col_ = 0;
  bool checked_ = false, enabled_ = false, ours_ = false;
  boolean (*libjpeg_decode_mcu_)(j_decompress_ptr, JBLOCKROW*) = nullptr;
  Reader r_;
  EntropyIndexUse* use_ = nullptr;
  const uint8_t* scan_ = nullptr;  // the scan's first entropy-coded byte (the index's offsets start there)
  // use_->known's rows, expanded; its capacity is kept from image to image (16 bytes a row of the
  // tallest file this thread decoded with known rows, at most 128 KiB: outside the index's bound)
  std::vector<EntropyCheckpoint> known_;
  unsigned known_rows_ = 0, row_ = 0;
  bool coasting_ = false, learning_ = false;
  uint64_t skipped_ = 0, decoded_ = 0, handed_back_ = 0, coasted_ = 0;  // flushed into the global stats per image
};

}  // namespace gpupipe
