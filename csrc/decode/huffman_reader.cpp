#include "decode/huffman_reader.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace gpupipe {

namespace {

// libjpeg-turbo's Huffman decoder object (jdhuff.c: huff_entropy_decoder), its leading fields.
struct EntropyPublic {  // jpegint.h: struct jpeg_entropy_decoder
  void (*start_pass)(j_decompress_ptr);
  boolean (*decode_mcu)(j_decompress_ptr, JBLOCKROW*);
  boolean insufficient_data;
};
struct BitreadPermState {  // jdhuff.h
  size_t get_buffer;
  int bits_left;
};
struct SavableState {
  int last_dc_val[MAX_COMPS_IN_SCAN];
};
struct HuffEntropy {
  EntropyPublic pub;
  BitreadPermState bitstate;
  SavableState saved;
  unsigned int restarts_to_go;
};

HuffEntropy* entropy_of(j_decompress_ptr cinfo) { return reinterpret_cast<HuffEntropy*>(cinfo->entropy); }

// An AC table entry (lut): the bits to drop now (code, and the magnitude when both fit the
// lookahead), the coefficient index's advance (run + 1, 16 for ZRL), end of block, magnitude bits
// still to drop, or "code longer than the lookahead".
constexpr uint16_t kConsume = 31, kAdvanceShift = 5, kEob = 1 << 10, kPendingShift = 11,
                   kPending = 15 << kPendingShift, kSlow = 1 << 15;

// A value-table entry (vlut): bits 0-3 the bits to drop, 4-7 the run, then flags; a coefficient's
// value (a DC table's: the difference) in bits 16-31 when its code and magnitude fit the
// lookahead, else (kVPending) its magnitude's size in bits 11-14.
constexpr uint32_t kVEob = 1 << 8, kVZrl = 1 << 9, kVPending = 1 << 10, kVSizeShift = 11, kVSlow = 1 << 15;

// A multi-symbol entry (multi): bits 0-5 the bits the whole symbols take (alone in the low 6 bits:
// a shift takes them as they are), 6-11 the coefficient index's advance (kMNone: not even one
// symbol fits), 12 an end of block after them.
constexpr uint16_t kMAdvanceShift = 6, kMNone = 63 << kMAdvanceShift, kMEob = 1 << 12;

// A pair-table entry (pairs): bits 0-5 the bits to drop (alone in the low 6 bits: a shift takes
// them as they are), 6-11 the coefficient index's advance (kPOther: nothing here for the fast
// path), 12 an end of block after the coefficients, 13-16 the first coefficient's run, 17-23 its
// value, 24-31 the last coefficient's value (the first's when there is one). An entry holds only
// whole symbols, no ZRL, coefficients of magnitude size <= 7, the first of two <= 6.
constexpr uint32_t kPAdvanceShift = 6, kPOther = 63 << kPAdvanceShift, kPEob = 1 << 12, kPRunShift = 13;

// jpeg_natural_order with libjpeg's 16 extra entries: a corrupt run past coefficient 63 lands on 63.
constexpr int kNatural[80] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13,
    6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31,
    39, 46, 53, 60, 61, 54, 47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

inline int extend(int v, int size) { return v < (1 << (size - 1)) ? v - (1 << size) + 1 : v; }

std::atomic<bool> g_enabled{[] {
  const char* v = std::getenv("GPUPIPE_HUFFMAN_READER");
  return !(v && v[0] == '0' && v[1] == '\0');
}()};
std::atomic<uint64_t> g_images{0}, g_rejected{0}, g_skipped{0}, g_decoded{0}, g_handed_back{0}, g_coasted{0};

struct Sym { uint8_t len = 0, sym = 0; };

// The first symbol of every B-bit prefix (len 0: its code is longer than B bits), from the codes
// of <= B bits by their left-aligned prefixes.
template <int B>
void first_symbols(const HuffmanReader::Table& t, const uint8_t* size, const unsigned* code_of, int count,
                   Sym (&first)[1 << B]) {
  for (int p = 0; p < count && size[p] <= B; ++p) {
    const unsigned base = code_of[p] << (B - size[p]);
    for (unsigned i = 0; i < (1u << (B - size[p])); ++i) first[base + i] = {size[p], t.huffval[p]};
  }
}

// The multi-symbol AC table: for each kMultiBits-bit prefix, the whole symbols it holds.
void build_multi(HuffmanReader::Table* t, const uint8_t* size, const unsigned* code_of, int count) {
  constexpr int M = HuffmanReader::kMultiBits;
  Sym first[1 << M];
  first_symbols<M>(*t, size, code_of, count, first);
  for (unsigned idx = 0; idx < (1u << M); ++idx) {
    int used = 0, advance = 0;
    bool eob = false;
    while (used < M) {
      const unsigned rest = (idx << used) & ((1u << M) - 1);  // the bits after `used`, zero-padded
      const Sym s = first[rest];
      const int run = s.sym >> 4, mag = s.sym & 15;
      if (s.len == 0 || used + s.len + mag > M) break;  // no code here, or it runs past the prefix
      used += s.len + mag;
      if (mag == 0 && run != 15) {
        eob = true;
        break;
      }
      advance += mag ? run + 1 : 16;
      if (advance > 63) {  // past a block's coefficients: leave it to the single steps
        used = 0;
        break;
      }
    }
    t->multi[idx] = static_cast<uint16_t>(used ? used | advance << kMAdvanceShift | (eob ? kMEob : 0) : kMNone);
  }
}

// The pair table: for each kPairBits-bit prefix, its first coefficient (or end of block) and, when
// they fit the prefix too, a second coefficient and an end of block after it. The fast path takes
// an entry only while the block's index stays below 64 (k + advance < 64), so a block that ends on
// coefficient 63 without an end of block never has the next block's bits read as its own.
void build_pairs(HuffmanReader::Table* t, const uint8_t* size, const unsigned* code_of, int count) {
  constexpr int P = HuffmanReader::kPairBits;
  Sym first[1 << P];
  first_symbols<P>(*t, size, code_of, count, first);
  for (unsigned idx = 0; idx < (1u << P); ++idx) {
    int used = 0, advance = 0, coefs = 0, run1 = 0, first_mag = 0, value[2] = {0, 0};
    bool eob = false;
    while (coefs < 2 && !eob) {
      const Sym s = first[(idx << used) & ((1u << P) - 1)];
      const int run = s.sym >> 4, mag = s.sym & 15;
      if (s.len == 0 || used + s.len + mag > P) break;  // no code here, or it runs past the prefix
      if (mag == 0) {
        if (run == 15) break;  // ZRL: the single steps
        used += s.len;
        eob = true;
        break;
      }
      if (mag > 7 || (coefs == 1 && first_mag > 6)) break;  // a value that does not fit its field
      if (coefs == 0) first_mag = mag;
      const int bits = static_cast<int>((idx >> (P - used - s.len - mag)) & ((1u << mag) - 1));
      value[coefs] = extend(bits, mag);
      if (coefs == 0) run1 = run;
      advance += run + 1;
      used += s.len + mag;
      ++coefs;
    }
    if (coefs == 1) value[1] = value[0];
    if (used == 0) {
      t->pairs[idx] = kPOther;
      continue;
    }
    t->pairs[idx] = static_cast<uint32_t>(used) | static_cast<uint32_t>(advance) << kPAdvanceShift | (eob ? kPEob : 0) |
                    static_cast<uint32_t>(run1) << kPRunShift | static_cast<uint32_t>(value[0] & 0x7F) << 17 |
                    static_cast<uint32_t>(value[1] & 0xFF) << 24;
  }
}

// Builds the decoding tables of `h` with jpeg_make_d_derived_tbl's checks (libjpeg has already
// accepted the table when this runs; false: it would not have).
bool build_table(const JHUFF_TBL* h, bool dc, HuffmanReader::Table* t) {
  if (!h) return false;
  uint8_t size[257];
  unsigned code_of[257];
  int count = 0;
  for (int l = 1; l <= 16; ++l) {
    const int n = h->bits[l];
    if (count + n > 256) return false;
    for (int i = 0; i < n; ++i) size[count++] = static_cast<uint8_t>(l);
  }
  unsigned code = 0;
  int si = count ? size[0] : 0;
  for (int p = 0; p < count;) {
    while (p < count && size[p] == si) code_of[p++] = code++;
    if (code >= (1u << si)) return false;  // not a valid prefix code
    code <<= 1;
    ++si;
  }
  for (int l = 1, p = 0; l <= 16; ++l) {
    if (h->bits[l]) {
      t->valoffset[l] = p - static_cast<int32_t>(code_of[p]);
      p += h->bits[l];
      t->maxcode[l] = static_cast<int32_t>(code_of[p - 1]);
    } else {
      t->maxcode[l] = -1;
    }
  }
  t->valoffset[17] = 0;
  t->maxcode[17] = 0xFFFFF;
  t->dc = dc;
  std::memcpy(t->bits, h->bits, sizeof(t->bits));
  std::memcpy(t->huffval, h->huffval, sizeof(t->huffval));
  if (dc)
    for (int p = 0; p < count; ++p)
      if (h->huffval[p] > 15) return false;

  constexpr int L = HuffmanReader::kLookahead;
  for (auto& e : t->lut) e = kSlow;
  for (auto& e : t->vlut) e = static_cast<int32_t>(kVSlow);
  for (int p = 0; p < count && size[p] <= L; ++p) {
    const int len = size[p], sym = h->huffval[p], run = sym >> 4, s = sym & 15;
    const unsigned first = code_of[p] << (L - len);
    if (!dc) {  // (a DC table's symbols are read from vlut alone)
      uint16_t e;
      if (s == 0) e = static_cast<uint16_t>(run == 15 ? len | 16 << kAdvanceShift : len | kEob);
      else if (len + s <= L) e = static_cast<uint16_t>((len + s) | (run + 1) << kAdvanceShift);
      else e = static_cast<uint16_t>(len | (run + 1) << kAdvanceShift | s << kPendingShift);
      for (unsigned i = 0; i < (1u << (L - len)); ++i) t->lut[first + i] = e;
    }
    for (unsigned i = 0; i < (1u << (L - len)); ++i) {
      uint32_t v;
      // a DC symbol is a coefficient of run 0 whose size 0 is a zero difference, not an end of block
      if (s == 0) v = dc ? len : len | (run == 15 ? kVZrl : kVEob);
      else if (len + s <= L) {
        const int bits = static_cast<int>((first + i) >> (L - len - s)) & ((1 << s) - 1);
        v = static_cast<uint32_t>(len + s) | run << 4 | static_cast<uint32_t>(extend(bits, s)) << 16;
      } else {
        v = len | run << 4 | kVPending | s << kVSizeShift;
      }
      t->vlut[first + i] = static_cast<int32_t>(v);
    }
  }
  if (!dc) {
    build_multi(t, size, code_of, count);
    build_pairs(t, size, code_of, count);
  }
  return true;
}

// Loads bytes until at least 32 bits are buffered, un-stuffing FF 00 and stopping before a marker
// or the data's end; false when fewer than 32 bits could be had.
inline bool fill(HuffmanReader::Reader* r) {
  const int take = (63 - r->nbits) >> 3;  // 4..7 bytes fit
  if (r->end - r->p >= 8) {
    uint64_t w;
    std::memcpy(&w, r->p, 8);
    const uint64_t x = ~w;  // a zero byte of x is an FF byte of w (exact up to the first one)
    const uint64_t ff = (x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull;
    if (!(ff & ((1ull << (8 * take)) - 1))) {
      r->buf |= (__builtin_bswap64(w) & (~0ull << (64 - 8 * take))) >> r->nbits;
      r->p += take;
      r->nbits += 8 * take;
      return true;
    }
  }
  while (r->nbits <= 56 && r->p < r->end) {
    const unsigned c = r->p[0];
    if (c == 0xFF) {
      if (r->end - r->p < 2 || r->p[1] != 0) break;  // a marker (or padding before one)
      r->p += 2;
    } else {
      r->p += 1;
    }
    r->buf |= static_cast<uint64_t>(c) << (56 - r->nbits);
    r->nbits += 8;
  }
  return r->nbits >= 32;
}

inline unsigned peek(const HuffmanReader::Reader& r, int n) { return static_cast<unsigned>(r.buf >> (64 - n)); }

inline void drop(HuffmanReader::Reader* r, int n) {
  r->buf <<= n;
  r->nbits -= n;
}

// A code longer than the lookahead, as jpeg_huff_decode reads it; false for no code of <= 16 bits.
inline bool slow_symbol(const HuffmanReader::Reader& r, const HuffmanReader::Table& t, int* len, int* sym) {
  const unsigned bits = peek(r, 16);
  for (int l = HuffmanReader::kLookahead + 1; l <= 16; ++l) {
    const int32_t code = static_cast<int32_t>(bits >> (16 - l));
    if (code <= t.maxcode[l]) {
      *len = l;
      *sym = t.huffval[(code + t.valoffset[l]) & 0xFF];
      return true;
    }
  }
  return false;
}

// Whether libjpeg-turbo's fast Huffman decoder (decode_mcu_fast) could meet a marker: an FF and a
// byte other than 0 (an FF fill byte counts: FF FF is a marker to it). It is used for an MCU when
// 512 bytes per block remain (BUFSIZE), reads ahead of the MCU, and on a marker falls back to its
// careful decoder for that MCU without clearing what the fast attempt stored: the MCU keeps
// coefficients decoded from the zeros read past the marker. Which MCU that is depends on libjpeg's
// own read-ahead, which the reader does not reproduce (a fuzzed file, FF FF ... 00 mid-scan, gave
// one block of other pixels), so the reader runs only when no MCU libjpeg decodes fast can reach
// a marker. One MCU reads at most 248 data bytes per block (the DC and 63 AC symbols of 31 bits)
// and looks 9 bytes further (its 64-bit buffer, and the byte after an FF).
bool fast_decoder_may_meet_a_marker(const uint8_t* data, size_t size, int blocks_in_mcu) {
  const size_t fast_needs = 512 * static_cast<size_t>(blocks_in_mcu);
  if (size < fast_needs) return false;  // never decoded fast
  const uint8_t* end = data + size;
  const uint8_t* marker = data;
  while ((marker = static_cast<const uint8_t*>(std::memchr(marker, 0xFF, static_cast<size_t>(end - marker)))) &&
         marker + 1 < end && marker[1] == 0)
    marker += 2;
  if (!marker || marker + 1 >= end) return false;
  const uint8_t* last_fast = end - fast_needs;  // the last MCU decoded fast starts here or before
  if (marker <= last_fast) return true;
  size_t reach = 248 * static_cast<size_t>(blocks_in_mcu) + 9;  // data bytes, an FF 00 being one
  for (const uint8_t* q = last_fast; q < marker; q += q[0] == 0xFF && q[1] == 0 ? 2 : 1)
    if (reach-- == 0) return false;
  return true;
}

// A data byte FF is coded FF 00, and libjpeg's careful reader (jpeg_fill_bit_buffer) takes any run
// FF FF ... FF 00 (fill bytes before the stuffed byte) as that one byte too. The reader's own fill()
// stops before FF FF, but libjpeg's buffer may hold bits read past such a run when the reader takes
// over from it (load_state), so positions are counted over whole runs.

// The first byte after the data byte at q: past a run FF ... FF 00 when q is an FF, else q + 1.
const uint8_t* after_data_byte(const uint8_t* q, const uint8_t* end) {
  if (q[0] != 0xFF) return q + 1;
  const uint8_t* r = q + 1;
  while (r < end && *r == 0xFF) ++r;
  return r < end && *r == 0 ? r + 1 : q + 1;
}

// The byte holding the reader's next unread bit (`*byte`) and its bits read before it (`*consumed`,
// 0..7): back from r.p over the bytes the buffer holds (an FF ... FF 00 run is one byte of data: a 00
// after an FF is always its stuffing, and the FFs before it its fill). False when the buffer holds
// bits from before `start`.
bool next_unread(const HuffmanReader::Reader& r, const uint8_t* start, const uint8_t** byte, int* consumed) {
  const uint8_t* q = r.p;
  int bits = r.nbits;
  while (bits > 0 && q > start) {
    --q;
    if (*q == 0 && q > start && q[-1] == 0xFF)
      while (q > start && q[-1] == 0xFF) --q;
    bits -= 8;
  }
  *byte = q;
  *consumed = -bits;
  return bits <= 0;
}

// The bits libjpeg's reader has consumed from `start` when its next byte is `p` with `nbits`
// buffered (an FF ... FF 00 run is one byte of data).
int64_t consumed_bits(const uint8_t* start, const uint8_t* p, int nbits) {
  int64_t bytes = 0;
  for (const uint8_t* q = start; q < p; q = after_data_byte(q, p)) ++bytes;
  return 8 * bytes - nbits;
}

}  // namespace

HuffmanReaderStats huffman_reader_stats() {
  HuffmanReaderStats s;
  s.images = g_images.load();
  s.rejected = g_rejected.load();
  s.skipped = g_skipped.load();
  s.decoded = g_decoded.load();
  s.handed_back = g_handed_back.load();
  s.coasted = g_coasted.load();
  return s;
}

bool set_huffman_reader(bool on) { return g_enabled.exchange(on); }

bool HuffmanReader::install(j_decompress_ptr cinfo, unsigned crop_x, unsigned crop_width) {
  if (!g_enabled.load(std::memory_order_relaxed)) return false;
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->restart_interval != 0 || cinfo->buffered_image ||
      cinfo->data_precision != 8 || cinfo->comps_in_scan != cinfo->num_components ||
      cinfo->comps_in_scan > MAX_COMPS_IN_SCAN || cinfo->blocks_in_MCU < 1 ||
      cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || cinfo->MCUs_per_row < 1 || !cinfo->entropy ||
      cinfo->src == nullptr || crop_width < 1)
    return false;
  // An EOI marker must follow the scan (looked for in the last kb, trailers allowed): libjpeg's
  // reader then stops there and never asks the source for more, which it would do, warning of a
  // premature end, from a look-ahead position that depends on where its buffer stood (and so on
  // whether a skip came before).
  const uint8_t* data = reinterpret_cast<const uint8_t*>(cinfo->src->next_input_byte);
  const size_t left = cinfo->src->bytes_in_buffer;
  bool eoi = false;
  for (size_t i = left, stop = left > 1024 ? left - 1024 : 0; i >= stop + 2 && !eoi; --i)
    eoi = data[i - 2] == 0xFF && data[i - 1] == JPEG_EOI;
  if (!eoi) return false;
  // The entropy index's rows for these bytes (the bytes hashed here). Rows learned on this layout
  // mean a decode of the same bytes passed the marker scan below before (a function of the bytes
  // and the MCU's blocks alone): it is not run again (~1% of a later epoch's decode).
  const EntropyRows* known = nullptr;
  if (use_) {
    if (!use_->looked_up) use_->look_up();
    known = use_->found ? &use_->known : nullptr;
    if (known && (known->mcus_per_row != cinfo->MCUs_per_row ||
                  known->blocks_in_mcu != static_cast<uint32_t>(cinfo->blocks_in_MCU) ||
                  known->comps != static_cast<uint32_t>(cinfo->comps_in_scan) || !expand_known(*known))) {
      known = nullptr;
      use_->found = false;  // (what it learns then starts at row 0: it never extends those rows)
    }
  }
  if (!known && fast_decoder_may_meet_a_marker(data, left, cinfo->blocks_in_MCU)) return false;
  const int align_blocks = cinfo->comps_in_scan == 1 ? 1 : cinfo->max_h_samp_factor;
  if (cinfo->comps_in_scan == 1 &&
      (cinfo->cur_comp_info[0]->h_samp_factor != 1 || cinfo->cur_comp_info[0]->v_samp_factor != 1))
    return false;  // a lone component's MCU is one block: the iMCU columns below would not be MCUs
  const unsigned align = static_cast<unsigned>(cinfo->min_DCT_scaled_size * align_blocks);
  if (align < 1) return false;
  HuffEntropy* e = entropy_of(cinfo);
  // Fresh from start_pass: nothing read, no prediction, no pending restart.
  if (e->bitstate.bits_left != 0 || e->bitstate.get_buffer != 0 || e->pub.insufficient_data ||
      e->restarts_to_go != 0 || cinfo->unread_marker != 0)
    return false;
  for (int ci = 0; ci < cinfo->comps_in_scan; ++ci)
    if (e->saved.last_dc_val[ci] != 0) return false;

  install_clock_ = ++clock_;  // the tables this install takes are not evicted by its later ones
  const Table* dc[MAX_COMPS_IN_SCAN];
  const Table* ac[MAX_COMPS_IN_SCAN];
  for (int ci = 0; ci < cinfo->comps_in_scan; ++ci) {
    const jpeg_component_info* c = cinfo->cur_comp_info[ci];
    const int d = c->dc_tbl_no, a = c->ac_tbl_no;
    if (d < 0 || d >= NUM_HUFF_TBLS || a < 0 || a >= NUM_HUFF_TBLS) return false;
    if (!(dc[ci] = table(cinfo->dc_huff_tbl_ptrs[d], true)) || !(ac[ci] = table(cinfo->ac_huff_tbl_ptrs[a], false)))
      return false;
  }
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    const int ci = cinfo->MCU_membership[b];
    if (ci < 0 || ci >= cinfo->comps_in_scan) return false;
    // libjpeg keeps the DC predictions of the components the output needs (dc_needed): for gray
    // output from YCbCr, Cb's and Cr's are never updated. -1: this block's prediction is not kept.
    block_comp_[b] = cinfo->cur_comp_info[ci]->component_needed ? ci : -1;
    // ... and stores the ACs of those, unless it decodes at 1/8 (DC only).
    block_ac_needed_[b] = cinfo->cur_comp_info[ci]->component_needed && cinfo->cur_comp_info[ci]->DCT_scaled_size > 1;
    block_dc_[b] = dc[ci];
    block_ac_[b] = ac[ci];
  }
  blocks_ = cinfo->blocks_in_MCU;
  comps_ = cinfo->comps_in_scan;
  mcus_per_row_ = cinfo->MCUs_per_row;
  // jpeg_crop_scanline's first_iMCU_col and last_iMCU_col: the MCU columns libjpeg transforms.
  first_col_ = crop_x / align;
  last_col_ = (crop_x + crop_width + align - 1) / align - 1;
  col_ = row_ = 0;
  checked_ = enabled_ = ours_ = coasting_ = false;
  libjpeg_decode_mcu_ = e->pub.decode_mcu;
  load_state(cinfo);  // libjpeg's fresh state: check_first starts the reader from it
  scan_ = r_.p;
  known_rows_ = 0;
  learning_ = false;
  if (use_) {
    if (known) known_rows_ = known->count;
    // Learned only where every component's DC prediction is kept (not for gray output of color)
    bool all_needed = comps_ <= 4;
    for (int ci = 0; ci < comps_; ++ci) all_needed = all_needed && cinfo->cur_comp_info[ci]->component_needed;
    learning_ = all_needed;
    use_->learned.clear();
    use_->mcus_per_row = mcus_per_row_;
    use_->blocks_in_mcu = static_cast<uint32_t>(blocks_);
    use_->comps = static_cast<uint32_t>(comps_);
    if (learning_ && known_rows_ == 0) keep(EntropyCheckpoint{});  // row 0: the scan's start
  }
  cinfo->client_data = this;
  e->pub.decode_mcu = &HuffmanReader::decode_mcu;
  g_images.fetch_add(1, std::memory_order_relaxed);
  return true;
}

const HuffmanReader::Table* HuffmanReader::table(const JHUFF_TBL* h, bool dc) {
  if (!h) return nullptr;
  Table* victim = nullptr;  // the least recently used slot that this install does not hold
  for (Table& t : cache_) {
    if (t.used && t.dc == dc && std::memcmp(t.bits, h->bits, sizeof(t.bits)) == 0 &&
        std::memcmp(t.huffval, h->huffval, sizeof(t.huffval)) == 0) {
      t.used = clock_;
      return &t;
    }
    if (t.used < install_clock_ && (!victim || t.used < victim->used)) victim = &t;
  }
  if (!victim) return nullptr;  // unreachable: a scan uses at most kCached tables
  if (!build_table(h, dc, victim)) {
    victim->used = 0;
    return nullptr;
  }
  victim->used = clock_;
  return victim;
}

void HuffmanReader::flush_stats() {
  if (skipped_) g_skipped.fetch_add(skipped_, std::memory_order_relaxed);
  if (decoded_) g_decoded.fetch_add(decoded_, std::memory_order_relaxed);
  if (handed_back_) g_handed_back.fetch_add(handed_back_, std::memory_order_relaxed);
  if (coasted_) g_coasted.fetch_add(coasted_, std::memory_order_relaxed);
  skipped_ = decoded_ = handed_back_ = coasted_ = 0;
  use_ = nullptr;  // (one decode's)
}

void HuffmanReader::materialize(j_decompress_ptr cinfo, unsigned row, unsigned col) {
  coasting_ = false;
  const EntropyCheckpoint& cp = checkpoint(row);
  r_.buf = 0;
  r_.nbits = 0;
  r_.p = cp.offset < static_cast<size_t>(r_.end - scan_) ? scan_ + cp.offset : r_.end;
  fill(&r_);  // (false near the data's end: what it loaded is still the data's)
  for (int ci = 0; ci < comps_; ++ci) r_.pred[ci] = cp.pred[ci];
  ours_ = true;
  if (cp.skip <= r_.nbits) {
    drop(&r_, cp.skip);
  } else {  // only for other bytes under the same key: libjpeg's decoder meets the data's end
    r_.nbits = 0;
    r_.buf = 0;
  }
  for (unsigned c = 0; c < col; ++c) {  // the columns left of `col` in its row: passed, as without the index
    if (!ours_ && cinfo->unread_marker == 0 && !entropy_of(cinfo)->pub.insufficient_data) {
      load_state(cinfo);
      ours_ = true;
    }
    if (ours_ && mcu<false>(&r_, nullptr)) {
      ++skipped_;
      continue;
    }
    stop_learning();
    ++handed_back_;
    if (ours_) {
      store_state(cinfo);
      ours_ = false;
    }
    libjpeg_decode_mcu_(cinfo, nullptr);
  }
}

void HuffmanReader::record(unsigned row) {
  if (!learning_ || row != rows_known()) return;
  const uint8_t* q;
  int consumed;
  EntropyCheckpoint cp;
  if (!next_unread(r_, scan_, &q, &consumed) || static_cast<uint64_t>(q - scan_) > UINT32_MAX) return stop_learning();
  cp.offset = static_cast<uint32_t>(q - scan_);
  cp.skip = static_cast<uint8_t>(consumed);
  for (int ci = 0; ci < comps_; ++ci) {
    if (r_.pred[ci] < INT16_MIN || r_.pred[ci] > INT16_MAX) return stop_learning();  // (a hostile file's)
    cp.pred[ci] = static_cast<int16_t>(r_.pred[ci]);
  }
  keep(cp);
}

// The index never fails a decode: with no memory for its rows (this runs under libjpeg's C frames
// too, which an exception must not cross), the decode goes on as without it.
void HuffmanReader::keep(const EntropyCheckpoint& cp) {
  try {
    use_->learned.push_back(cp);
  } catch (const std::bad_alloc&) {
    stop_learning();
  }
}

bool HuffmanReader::expand_known(const EntropyRows& rows) {
  try {
    return rows.expand(&known_);
  } catch (const std::bad_alloc&) {
    known_.clear();
    return false;
  }
}

void HuffmanReader::load_state(j_decompress_ptr cinfo) {
  HuffEntropy* e = entropy_of(cinfo);
  r_.nbits = e->bitstate.bits_left;  // 0..64, the low bits of get_buffer; left-aligned here
  r_.buf = r_.nbits ? static_cast<uint64_t>(e->bitstate.get_buffer) << (64 - r_.nbits) : 0;
  r_.p = reinterpret_cast<const uint8_t*>(cinfo->src->next_input_byte);
  r_.end = r_.p + cinfo->src->bytes_in_buffer;
  for (int ci = 0; ci < comps_; ++ci) r_.pred[ci] = e->saved.last_dc_val[ci];
}

void HuffmanReader::store_state(j_decompress_ptr cinfo) {
  HuffEntropy* e = entropy_of(cinfo);
  for (int ci = 0; ci < comps_; ++ci) e->saved.last_dc_val[ci] = r_.pred[ci];
  // The position as a function of the bit position alone, not of how far the reader had loaded
  // ahead (which depends on where it started: the scan's start, or a row's with the entropy index):
  // the byte holding the next unread bit, its unread low bits in libjpeg's buffer. libjpeg's choice
  // between its fast and careful decoders, and so its warnings on a bad code near the data's end,
  // follow the bytes left in its buffer: with or without the index, they are then the same.
  const uint8_t* q;
  int consumed;
  if (!next_unread(r_, scan_, &q, &consumed)) {  // (never: every buffered bit came from the scan)
    e->bitstate.get_buffer = static_cast<size_t>(r_.nbits ? r_.buf >> (64 - r_.nbits) : 0);
    e->bitstate.bits_left = r_.nbits;
    cinfo->src->next_input_byte = r_.p;
    cinfo->src->bytes_in_buffer = static_cast<size_t>(r_.end - r_.p);
    return;
  }
  const int unread = consumed == 0 ? 0 : 8 - consumed;  // byte q's bits still to read, in libjpeg's buffer
  const uint8_t* next = q;
  if (unread > 0) next = after_data_byte(q, r_.end);
  e->bitstate.get_buffer = unread > 0 ? static_cast<size_t>(q[0] & ((1u << unread) - 1)) : 0;
  e->bitstate.bits_left = unread;
  cinfo->src->next_input_byte = next;
  cinfo->src->bytes_in_buffer = static_cast<size_t>(r_.end - next);
}

// The first MCU, decoded here and by libjpeg from the same start: both must reach the same bit
// position and DC predictions, and store the same coefficients, else the fields read above are not
// where this build expects them.
bool HuffmanReader::check_first(j_decompress_ptr cinfo, JBLOCKROW* data, boolean* result) {
  checked_ = true;
  HuffEntropy* e = entropy_of(cinfo);
  Reader mine = r_;  // install() left the start of the data here
  JBLOCK blocks[D_MAX_BLOCKS_IN_MCU];
  JBLOCKROW rows[D_MAX_BLOCKS_IN_MCU];
  std::memset(blocks, 0, sizeof(blocks));
  for (int b = 0; b < blocks_; ++b) rows[b] = &blocks[b];
  const bool decoded = data ? mcu<true>(&mine, rows) : mcu<false>(&mine, nullptr);
  *result = libjpeg_decode_mcu_(cinfo, data);
  const uint8_t* lp = reinterpret_cast<const uint8_t*>(cinfo->src->next_input_byte);
  // libjpeg's MCU ran into a marker or the data's end (a tiny scan): that says nothing about the
  // layout; the image is libjpeg's alone, not counted as rejected.
  const bool clean = *result && !e->pub.insufficient_data && cinfo->unread_marker == 0;
  bool same = decoded && clean && e->bitstate.bits_left >= 0 && e->bitstate.bits_left <= 64 && lp >= r_.p &&
              lp <= r_.end && consumed_bits(r_.p, lp, e->bitstate.bits_left) == consumed_bits(r_.p, mine.p, mine.nbits);
  for (int ci = 0; same && ci < comps_; ++ci)
    same = !cinfo->cur_comp_info[ci]->component_needed || e->saved.last_dc_val[ci] == mine.pred[ci];
  for (int b = 0; same && data && b < blocks_; ++b) same = std::memcmp(blocks[b], data[b][0], sizeof(JBLOCK)) == 0;
  enabled_ = same;
  if (!same && decoded && clean) g_rejected.fetch_add(1, std::memory_order_relaxed);
  return same;
}

boolean HuffmanReader::decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* data) {
  HuffmanReader* h = static_cast<HuffmanReader*>(cinfo->client_data);
  const unsigned col = h->col_, row = h->row_;
  if (col + 1 == h->mcus_per_row_) {
    h->col_ = 0;
    ++h->row_;
  } else {
    h->col_ = col + 1;
  }
  boolean result;
  if (!h->checked_) {
    h->check_first(cinfo, data, &result);
    if (!h->enabled_ && h->use_) {  // libjpeg's decoder alone: nothing to learn
      h->stop_learning();
      h->use_->learned.clear();
    }
    return result;
  }
  if (h->enabled_) {
    // The crop's MCUs are stored; the others (rows above it: no buffer; columns beside it: never
    // transformed) only passed, or not read at all when the next row's start is known.
    const bool needed = data != nullptr && col >= h->first_col_ && col <= h->last_col_;
    if (!needed && row + 1 < h->rows_known()) {
      h->coasting_ = true;
      ++h->coasted_;
      return TRUE;
    }
    if (h->coasting_) h->materialize(cinfo, row, col);
    if (!h->ours_ && cinfo->unread_marker == 0 && !entropy_of(cinfo)->pub.insufficient_data) {
      h->load_state(cinfo);
      h->ours_ = true;
    }
    if (h->ours_) {
      if (col == 0) h->record(row);
      if (needed ? h->mcu<true>(&h->r_, data) : h->mcu<false>(&h->r_, nullptr)) {
        ++(needed ? h->decoded_ : h->skipped_);
        return TRUE;
      }
      ++h->handed_back_;
      if (data)  // libjpeg's decoder expects zeroed blocks; a failed store may have written some
        for (int b = 0; b < h->blocks_; ++b) std::memset(data[b][0], 0, sizeof(JBLOCK));
    }
  }
  h->stop_learning();  // libjpeg's decoder takes this MCU: no row after it is learned
  if (h->ours_) {
    h->store_state(cinfo);
    h->ours_ = false;
  }
  return h->libjpeg_decode_mcu_(cinfo, data);
}

// One MCU's bits, as decode_mcu_fast/slow consume them: DC difference, then AC symbols up to an end
// of block or coefficient 63. Stored as libjpeg stores them (the DC prediction of a needed
// component; the ACs of an ac_needed block at jpeg_natural_order[k]); on failure `r` is unchanged.
template <bool kStore>
bool HuffmanReader::mcu(Reader* r, JBLOCKROW* data) const {
  Reader s = *r;
  constexpr int L = kLookahead;
  for (int b = 0; b < blocks_; ++b) {
    const Table& dc = *block_dc_[b];
    const Table& ac = *block_ac_[b];
    if (s.nbits < 32 && !fill(&s)) return false;
    int len, size, diff;
    const uint32_t dv = static_cast<uint32_t>(dc.vlut[peek(s, L)]);
    if (!(dv & (kVPending | kVSlow))) {  // the code and the difference in the lookahead
      drop(&s, dv & 15);
      diff = static_cast<int32_t>(dv) >> 16;
    } else {
      if (dv & kVSlow) {
        if (!slow_symbol(s, dc, &len, &size)) return false;
      } else {  // the code fits the lookahead, the difference does not
        len = dv & 15;
        size = (dv >> kVSizeShift) & 15;
      }
      drop(&s, len);  // >= 16 bits remain: a difference's size is <= 15
      diff = size ? extend(static_cast<int>(s.buf >> (64 - size)), size) : 0;
      drop(&s, size);
    }
    if (block_comp_[b] >= 0) {
      int& pred = s.pred[block_comp_[b]];
      if (pred > (1 << 24) || pred < -(1 << 24)) return false;  // libjpeg's business (overflow checks)
      pred += diff;
      if (kStore) data[b][0][0] = static_cast<JCOEF>(pred);
    }
    if (kStore && block_ac_needed_[b]) {
      JCOEF* coef = data[b][0];
      for (int k = 1; k < 64;) {
        if (s.nbits < 32 && !fill(&s)) return false;
        const uint32_t p = ac.pairs[peek(s, kPairBits)];
        const int advance = static_cast<int>((p >> kPAdvanceShift) & 63);
        if (k + advance < 64) {  // kPOther's advance is 63
          drop(&s, p & 63);  // the count alone in the low 6 bits: x86's shift takes them as they are
          if (advance) {
            coef[kNatural[k + static_cast<int>(p >> kPRunShift & 15)]] = static_cast<JCOEF>(static_cast<int32_t>(p << 8) >> 25);
            k += advance;
            coef[kNatural[k - 1]] = static_cast<JCOEF>(static_cast<int8_t>(p >> 24));
          }
          if (p & kPEob) break;
          continue;
        }
        const uint32_t v = static_cast<uint32_t>(ac.vlut[peek(s, L)]);
        if (!(v & (kVEob | kVZrl | kVPending | kVSlow))) {  // a coefficient, code and value in the lookahead
          drop(&s, v & 15);
          k += (v >> 4) & 15;
          coef[kNatural[k]] = static_cast<JCOEF>(static_cast<int32_t>(v) >> 16);
          ++k;
          continue;
        }
        if (v & (kVEob | kVZrl)) {
          drop(&s, v & 15);
          if (v & kVEob) break;
          k += 16;
          continue;
        }
        int sym;
        if (v & kVSlow) {
          if (!slow_symbol(s, ac, &len, &sym)) return false;
        } else {  // the code fits the lookahead, its magnitude does not
          len = v & 15;
          sym = static_cast<int>((v >> 4) & 15) << 4 | static_cast<int>((v >> kVSizeShift) & 15);
        }
        drop(&s, len);
        const int run = sym >> 4, mag = sym & 15;
        if (mag) {
          const int value = extend(static_cast<int>(s.buf >> (64 - mag)), mag);
          drop(&s, mag);
          k += run;
          coef[kNatural[k]] = static_cast<JCOEF>(value);
          ++k;
        } else if (run == 15) {
          k += 16;
        } else {
          break;  // end of block
        }
      }
      continue;
    }
    for (int k = 1; k < 64;) {
      if (s.nbits < 32 && !fill(&s)) return false;
      const unsigned m = ac.multi[peek(s, kMultiBits)];
      const int advance = static_cast<int>((m >> kMAdvanceShift) & 63);
      if (k + advance < 64) {  // the block goes on past these symbols (kMNone's advance is 63)
        drop(&s, m & 63);  // the count alone in the low 6 bits: x86's shift takes them as they are
        k += advance;
        if (m & kMEob) break;
        continue;
      }
      const unsigned a = ac.lut[peek(s, L)];
      if (!(a & (kSlow | kPending))) {
        drop(&s, a & kConsume);
        if (a & kEob) break;
        k += (a >> kAdvanceShift) & 31;
        continue;
      }
      int sym;
      if (a & kSlow) {
        if (!slow_symbol(s, ac, &len, &sym)) return false;
      } else {  // the code fits the lookahead, its magnitude does not
        len = a & kConsume;
        sym = static_cast<int>(((a >> kAdvanceShift) & 31) - 1) << 4 | static_cast<int>((a & kPending) >> kPendingShift);
      }
      drop(&s, len);
      const int run = sym >> 4, mag = sym & 15;
      if (mag) {
        drop(&s, mag);
        k += run + 1;
      } else if (run == 15) {
        k += 16;
      } else {
        break;  // end of block
      }
    }
  }
  *r = s;
  return true;
}

template bool HuffmanReader::mcu<true>(Reader*, JBLOCKROW*) const;
template bool HuffmanReader::mcu<false>(Reader*, JBLOCKROW*) const;

}  // namespace gpupipe
