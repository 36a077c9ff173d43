#include "decode/header_table.h"

#include <cstring>

namespace gpupipe {
namespace {

// A JPEG's scans and the bytes after the EOI marker that ends it, found as libjpeg's marker reader
// finds them: from SOI, every marker after its FF (fill bytes skipped); a segment with a length is
// skipped whole (an EXIF thumbnail's SOS and EOI are inside APP1's), FF 00 and RSTn inside
// entropy-coded data are not markers. The first EOI found ends the JPEG: libjpeg stops there and
// never reads what follows (an appended image, a vendor's trailer), so a GPU decoder is given the
// bytes up to it (gpu_fallback.gpu_inputs). -1 bytes after it: no EOI (a truncated file, a second
// SOI, or a segment whose length runs past the data). A scan bomb's thousands of SOS are counted
// here too.
//
// `malformed`: a layout libjpeg reads only with a warning, an error or a trace, which GPU parsers
// read otherwise (nvImageCodec 0.9's parser crashed DALI's process on one): bytes or a standalone
// marker (RSTn, TEM) between the header's segments, a second frame header (SOF), a marker libjpeg
// does not know, a length below 2, a table segment or a scan libjpeg refuses or warns about
// (ScanState: its components, its parameters, a progression out of sequence, its tables; DALI's
// libjpeg-turbo 3 printed the progressive ones to stderr), a sampling libjpeg cannot upsample.
// Such a file is the CPU core's, which reports what it finds (kMalformedLayout). And, in a valid file: a
// component sampled more finely than the first (luma) one (kFinerChroma), which DALI's crop decode
// gets wrong (up to 22 levels on narrow crops near the left edge; 2x1 luma with 4x1 chroma, ...).
struct JpegExtent {
  int64_t scans = 0;
  int64_t trailing = -1;
  int64_t malformed = 0;
};

bool is_frame_header(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }
bool is_progressive_frame(uint8_t m) { return m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE; }

// What libjpeg knows when it reads a scan: the frame's components, the tables defined so far, and a
// progressive frame's history of successive approximation per component and coefficient (its
// coef_bits). Each check below is one of libjpeg's errors or warnings, read at the marker level.
struct ScanState {
  static constexpr int kMaxComponents = 10;  // libjpeg's MAX_COMPONENTS (more: its error)
  int components = 0;
  uint8_t ids[kMaxComponents] = {}, quant[kMaxComponents] = {}, h[kMaxComponents] = {}, v[kMaxComponents] = {};
  bool scanned[kMaxComponents] = {};  // in a scan already (its quantization table latched)
  int8_t coef_bits[kMaxComponents][64];
  enum Kind { kNone, kSequential, kProgressive, kLossless } kind = kNone;
  bool arithmetic = false;
  bool quant_defined[4] = {};
  // Huffman tables by class (DC, AC) and slot: 0 none, 1 usable, 2 one libjpeg refuses to use
  // ("Bogus Huffman table definition").
  uint8_t huffman[2][4] = {};

  // Whether a scan may decode with Huffman table `slot` of class `cls`: one defined and usable; in
  // a sequential frame slots 0 and 1 also without one (libjpeg-turbo's standard tables, for Motion
  // JPEG; its progressive decoder has none).
  bool huffman_table(int cls, int slot) const {
    return slot <= 3 && (huffman[cls][slot] == 1 || (huffman[cls][slot] == 0 && slot < 2 && kind == kSequential));
  }

  // A frame header; false where libjpeg cannot upsample its sampling ("Fractional sampling not
  // implemented yet": a factor that does not divide the largest).
  bool frame(uint8_t marker, const uint8_t* s, size_t length) {
    kind = is_progressive_frame(marker) ? kProgressive : (marker & 3) == 3 ? kLossless : kSequential;
    arithmetic = marker >= 0xC9;
    components = length >= 8 ? s[7] : 0;
    if (components > kMaxComponents || length < 8 + 3 * static_cast<size_t>(components)) components = 0;
    int hmax = 1, vmax = 1;
    for (int c = 0; c < components; ++c) {
      ids[c] = s[8 + 3 * c];
      h[c] = s[9 + 3 * c] >> 4;
      v[c] = s[9 + 3 * c] & 15;
      quant[c] = s[10 + 3 * c];
      hmax = h[c] > hmax ? h[c] : hmax;
      vmax = v[c] > vmax ? v[c] : vmax;
    }
    std::memset(coef_bits, -1, sizeof(coef_bits));
    for (int c = 0; c < components; ++c)
      if (h[c] == 0 || v[c] == 0 || hmax % h[c] != 0 || vmax % v[c] != 0) return false;
    return true;
  }

  // A table segment (DQT, DHT, DAC, DRI): false where libjpeg errors reading it (an index out of
  // range, counts or a length that do not add up, a DAC value out of range) or where it reads a
  // short quantization table silently (ones for the rest) that other decoders may read otherwise.
  bool table(uint8_t marker, const uint8_t* s, size_t length) {
    size_t p = 2;
    switch (marker) {
      case 0xDB:  // DQT
        while (p < length) {
          const int precision = s[p] >> 4, id = s[p] & 15;
          const size_t size = 1 + 64 * (precision + 1);
          if (precision > 1 || id > 3 || size > length - p) return false;
          quant_defined[id] = true;
          p += size;
        }
        return true;
      case 0xC4:  // DHT
        while (length - p > 16) {
          const int index = s[p];
          size_t count = 0;
          for (int l = 1; l <= 16; ++l) count += s[p + l];
          if (count > 256 || count > length - p - 17 || (index & ~0x13) != 0) return false;
          const int cls = index >> 4, slot = index & 3;
          huffman[cls][slot] = huffman_usable(s + p + 1, s + p + 17, count, cls == 0) ? 1 : 2;
          p += 17 + count;
        }
        return p == length;
      case 0xCC:  // DAC
        for (; length - p >= 2; p += 2) {
          const int index = s[p], value = s[p + 1];
          if (index >= 32 || (index >= 16 ? value < 1 || value > 63 : (value & 15) > (value >> 4))) return false;
        }
        return p == length;
      case 0xDD:  // DRI
        return length == 4;
      default:
        return true;
    }
  }

  // jdhuff.c's jpeg_make_d_derived_tbl: the code lengths' counts leave a code unused at every
  // length (a code of all ones is never assigned), and a DC table's values are at most 15.
  static bool huffman_usable(const uint8_t* bits, const uint8_t* values, size_t count, bool dc) {
    int first = 1, last = 16;
    while (first <= 16 && bits[first - 1] == 0) ++first;
    while (last >= 1 && bits[last - 1] == 0) --last;
    int64_t code = 0;
    for (int l = first; l <= last; ++l) {
      code += bits[l - 1];
      if (code >= (int64_t{1} << l)) return false;
      code <<= 1;
    }
    if (dc)
      for (size_t i = 0; i < count; ++i)
        if (values[i] > 15) return false;
    return true;
  }

  // Whether libjpeg reads the SOS segment `s` (its `length` bytes) without an error or a warning:
  // 1..4 components of the frame's first four, each once and in the frame's order (jdmarker.c's
  // get_sos); at most 10 blocks in an interleaved scan's MCU ("Sampling factors too large for
  // interleaved scan"); each component's quantization table defined by its first scan; the
  // Huffman tables the scan decodes with defined and usable; sequential: Ss = 0, Se = 63,
  // Ah = Al = 0 ("Invalid SOS parameters for sequential JPEG"), each component in one scan ("Didn't
  // expect more than one scan"); progressive (jdphuff.c's and jdarith.c's checks): a DC scan
  // (Ss = 0) with Se = 0, an AC scan with Ss <= Se <= 63 of one component, a refinement (Ah > 0)
  // with Al = Ah - 1, Al <= 13 ("Invalid progressive parameters"), no AC scan before its
  // component's DC scan and Ah the Al of the scan before over Ss..Se ("Inconsistent progression
  // sequence"). Lossless frames' scans (libjpeg-turbo 3 reads them, 2.1 refuses the frame) are
  // not checked.
  bool scan(const uint8_t* s, size_t length) {
    if (kind == kNone || components == 0 || length < 3) return false;
    const size_t ns = s[2];
    if (ns < 1 || ns > 4 || length != 6 + 2 * ns) return false;
    int index[4];
    int blocks = 0;
    for (size_t i = 0; i < ns; ++i) {
      const int first = i == 0 ? 0 : index[i - 1] + 1;
      int c = first;
      while (c < components && c < 4 && ids[c] != s[3 + 2 * i]) ++c;
      if (c >= components || c >= 4) return false;
      index[i] = c;
      blocks += h[c] * v[c];
    }
    if (kind == kLossless) return true;
    if (ns > 1 && blocks > 10) return false;
    const uint8_t* tail = s + 3 + 2 * ns;
    const int ss = tail[0], se = tail[1], ah = tail[2] >> 4, al = tail[2] & 15;
    for (size_t i = 0; i < ns; ++i) {
      const int c = index[i];
      if (!scanned[c] && (quant[c] > 3 || !quant_defined[quant[c]])) return false;
      if (kind == kSequential && scanned[c]) return false;
      scanned[c] = true;
      if (arithmetic) continue;
      const int dc = s[4 + 2 * i] >> 4, ac = s[4 + 2 * i] & 15;
      const bool uses_dc = kind == kSequential || (ss == 0 && ah == 0), uses_ac = kind == kSequential || ss != 0;
      if ((uses_dc && !huffman_table(0, dc)) || (uses_ac && !huffman_table(1, ac))) return false;
    }
    if (kind == kSequential) return ss == 0 && se == 63 && ah == 0 && al == 0;
    const bool band = ss == 0 ? se == 0 : ss <= se && se <= 63 && ns == 1;
    if (!band || (ah != 0 && al != ah - 1) || al > 13) return false;
    bool consistent = true;
    for (size_t i = 0; i < ns; ++i) {
      int8_t* bits = coef_bits[index[i]];
      if (ss != 0 && bits[0] < 0) consistent = false;  // an AC scan before the DC scan
      for (int k = ss; k <= se; ++k) {
        if (ah != (bits[k] < 0 ? 0 : bits[k])) consistent = false;
        bits[k] = static_cast<int8_t>(al);
      }
    }
    return consistent;
  }
};

// Whether the frame header `s` (its `length` bytes) has a component sampled more finely than the
// first one, horizontally or vertically.
bool finer_than_first(const uint8_t* s, size_t length) {
  if (length < 8) return false;
  const size_t nf = s[7];
  if (nf < 2 || length < 8 + 3 * nf) return false;
  const int h0 = s[9] >> 4, v0 = s[9] & 15;
  for (size_t k = 1; k < nf; ++k) {
    const int hv = s[8 + 3 * k + 1];
    if ((hv >> 4) > h0 || (hv & 15) > v0) return true;
  }
  return false;
}

// The markers with a length libjpeg reads: SOFn, DHT, DAC, SOS, DQT, DNL, DRI, APPn, COM.
bool is_known_segment(uint8_t m) {
  return (m >= 0xC0 && m <= 0xCF && m != 0xC8) || (m >= 0xDA && m <= 0xDD) || (m >= 0xE0 && m <= 0xEF) || m == 0xFE;
}

JpegExtent jpeg_extent(const uint8_t* d, size_t n) {
  JpegExtent e;
  size_t p = 2;  // after SOI (read_header checked it)
  int64_t frames = 0;
  ScanState state;
  while (p + 1 < n) {
    const void* hit = std::memchr(d + p, 0xFF, n - p - 1);
    if (!hit) break;
    const size_t at = static_cast<size_t>(static_cast<const uint8_t*>(hit) - d);
    if (at != p && e.scans == 0) e.malformed |= kMalformedLayout;  // bytes between the header's segments
    p = at + 1;
    while (p < n && d[p] == 0xFF) ++p;  // fill bytes
    if (p >= n) break;
    const uint8_t marker = d[p++];
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // no length
      if (e.scans == 0) e.malformed |= kMalformedLayout;  // (inside entropy-coded data they are its own)
      continue;
    }
    if (marker == 0xD8) break;  // a second SOI: libjpeg refuses the file, no EOI ends this JPEG
    if (marker == 0xD9) {
      e.trailing = static_cast<int64_t>(n - p);
      return e;
    }
    if (n - p < 2) break;
    const size_t length = static_cast<size_t>(d[p]) << 8 | d[p + 1];
    if (length > n - p) break;
    if (is_frame_header(marker)) {
      if (++frames == 1 && !state.frame(marker, d + p, length)) e.malformed |= kMalformedLayout;
      if (finer_than_first(d + p, length)) e.malformed |= kFinerChroma;
    }
    if (length < 2 || frames > 1 || !is_known_segment(marker) || !state.table(marker, d + p, length))
      e.malformed |= kMalformedLayout;
    if (marker == 0xDA && !state.scan(d + p, length)) e.malformed |= kMalformedLayout;  // (before a frame too)
    e.scans += marker == 0xDA;
    p += length < 2 ? 2 : length;  // (a length below 2 carries nothing, as for_each_header_segment reads it)
  }
  return e;
}

constexpr size_t kHeight = info_column("height"), kWidth = info_column("width"),
                 kColorspace = info_column("colorspace"), kChannels = info_column("channels"),
                 kOrientation = info_column("orientation"), kProgressive = info_column("progressive"),
                 kScans = info_column("scans"), kTrailing = info_column("trailing"),
                 kMalformed = info_column("malformed"), kError = info_column("error");

}  // namespace

int64_t* header_table_output(const std::vector<ByteSpan>& inputs, uintptr_t address, size_t given) {
  const size_t needed = checked_mul(inputs.size(), kInfoWidth * sizeof(int64_t), "the header table");
  if (address % alignof(int64_t)) throw InvalidArgument("the header table must be 8-byte aligned");
  return reinterpret_cast<int64_t*>(checked_output(address, needed, given, inputs));
}

std::vector<IndexedError> read_header_table(const std::vector<ByteSpan>& inputs, int64_t* out, bool scans) {
  std::vector<IndexedError> failures;
  Decoder& d = thread_decoder();
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t* row = out + kInfoWidth * i;
    try {
      const JpegInfo info = d.read_header(inputs[i].data, inputs[i].size);
      row[kHeight] = info.height;
      row[kWidth] = info.width;
      row[kColorspace] = static_cast<int64_t>(info.colorspace);
      row[kChannels] = info.channels;
      row[kOrientation] = info.orientation;
      row[kProgressive] = info.progressive;
      // every file: a baseline file may also hold many scans (one component each). The whole file is
      // read for it (~12 us for 300 KB): only where a GPU decoder may take the file
      const JpegExtent extent = scans ? jpeg_extent(inputs[i].data, inputs[i].size) : JpegExtent{-1, -1, -1};
      row[kScans] = extent.scans;
      row[kTrailing] = extent.trailing;
      row[kMalformed] = extent.malformed;
      row[kError] = static_cast<int64_t>(ErrorKind::kNone);
    } catch (const DecodeError& e) {
      for (size_t c = 0; c < kInfoWidth; ++c) row[c] = -1;
      row[kError] = static_cast<int64_t>(e.kind);
      failures.emplace_back(i, e.kind, e.what());
    }
  }
  return failures;
}

}  // namespace gpupipe
