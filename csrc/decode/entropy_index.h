// The entropy index: where each MCU row's entropy-coded data starts, learned from the files decoded.
//
// A baseline JPEG without restart markers has no random access: to reach a crop, the decoder must
// Huffman-decode every MCU before it, the rows above the crop and, in its rows, the columns either
// side. On RandomResizedCrop of the benchmark's default set that passing was about a quarter of a
// crop's decode time (huffman_reader.h passes those MCUs without storing them). Each decode by
// gpupipe's Huffman reader records, as it passes them, the start of every MCU row it reaches: the
// byte holding the row's first bit, the bits of that byte before it, and the DC predictions there.
// A later decode of the same bytes (a later epoch) starts from the row start at or above its crop
// instead of the scan's start, and leaves each crop row for the next row's start as soon as its
// last needed column is done: the rows above the crop and the columns right of it cost nothing.
//
// The rows are keyed by the bytes themselves (their size and a 128-bit hash), so a file that
// changed is a new file, and nothing depends on how the caller names its samples. The index is
// process-wide and bounded (set_entropy_index_bytes; GPUPIPE_ENTROPY_INDEX_MB, 256 by default,
// 0 turns it off): once full, files not yet indexed are decoded as without it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpupipe {

// Where an MCU row starts: the reader's position and DC predictions before its first MCU.
struct EntropyCheckpoint {
  uint32_t offset = 0;  // the byte holding the row's first bit, from the scan's first entropy-coded byte
  int16_t pred[4] = {0, 0, 0, 0};  // the DC predictions by component of the scan
  uint8_t skip = 0;     // bits of that byte before the row's first one (0..7)
};

// One file's known row starts, rows [0, count), kept compact: each row as its change from the row
// before it (row 0's from the scan's start), LEB128 varints: the bit position's advance, then each
// component's DC prediction change, zigzagged. About 6-8 bytes a row where EntropyCheckpoint takes
// 16 (the index holds twice the files in the same memory); a decode expands them once (expand).
// The index keeps them in one heap block per file and copies them out for a decode (look_up): a
// decode that learns more makes a longer copy, which replaces the block.
struct EntropyRows {
  uint32_t mcus_per_row = 0;  // the scan's layout the rows were learned on
  uint32_t blocks_in_mcu = 0;
  uint32_t comps = 0;  // DC predictions per row (the scan's components)
  uint32_t count = 0;
  std::vector<uint8_t> coded;

  // Appends `rows` after the `count` known; false (nothing changed) when a row's bit position
  // precedes its predecessor's, a skip is over 7, comps is over 4, the count would pass 2^32 - 1
  // (a decode records none of these) or the coding held is not `count` rows.
  bool append(const EntropyCheckpoint* rows, size_t n);
  // All `count` rows into `out`; false when the coding does not hold exactly `count` rows.
  bool expand(std::vector<EntropyCheckpoint>* out) const;
};

struct FileKey {
  uint64_t size = 0, h1 = 0, h2 = 0;
  bool operator==(const FileKey& o) const { return size == o.size && h1 == o.h1 && h2 == o.h2; }
};

// One decode's use of the index: the file's bytes, the rows known before it, and those it learned
// after them. The bytes are keyed and their rows looked up only when the scan is of the kind
// gpupipe's Huffman reader takes, with its EOI (look_up): a file on the restart route or one the
// reader declines (progressive, arithmetic) is never hashed. Known rows also spare the reader its
// scan of the data for markers.
struct EntropyIndexUse {
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool looked_up = false;
  FileKey key;
  bool found = false;  // known holds a copy of the index's rows for key (known means nothing when false)
  EntropyRows known;
  uint32_t mcus_per_row = 0, blocks_in_mcu = 0, comps = 0;  // set by the reader when it learns
  std::vector<EntropyCheckpoint> learned;          // rows known.count, known.count + 1, ...

  void look_up();
};

// The bytes' key: their size and a 128-bit hash of all of them (about 10 GB/s).
FileKey file_key(const uint8_t* data, size_t size);

struct EntropyIndexStats {
  uint64_t files = 0;       // files with known rows
  uint64_t bytes = 0;       // memory they take (estimated: each file's block, map node and buckets)
  uint64_t max_bytes = 0;   // the bound (0: off)
  uint64_t keyed = 0;       // decodes that hashed their file's bytes (a scan gpupipe's Huffman reader takes)
  uint64_t found = 0;       // decodes that started with known rows
  uint64_t learned = 0;     // decodes that added rows
  uint64_t full = 0;        // decodes whose new rows did not fit
};

// InvalidArgument naming GPUPIPE_ENTROPY_INDEX_MB when it held no whole number of MiB (the decode
// entry points call it first), until a bound is set explicitly.
void check_entropy_index_env();
// Sets the bound (0: off, and the index emptied); returns the previous one.
uint64_t set_entropy_index_bytes(uint64_t max_bytes);
bool entropy_index_enabled();
// Decodes go without the index (its rows kept) while paused; returns the previous setting.
bool pause_entropy_index(bool paused);
EntropyIndexStats entropy_index_stats();
void clear_entropy_index();

// The rows known for `key`, copied into `out`; false (out untouched) when there are none.
bool find_entropy_rows(const FileKey& key, EntropyRows* out);
// Adds what `use` learned to its file's rows (use.key; nothing when it never looked them up), when
// it continues the rows now known and fits the bound.
void learn_entropy_rows(EntropyIndexUse&& use);

}  // namespace gpupipe
