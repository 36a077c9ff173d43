#include "decode/entropy_index.h"

#include "common/errors.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <unordered_map>

#include <pthread.h>

namespace gpupipe {

namespace {

// 64 x 64 -> 128-bit multiply, folded (wyhash's mixing step).
inline uint64_t mix(uint64_t a, uint64_t b) {
  const unsigned __int128 m = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(m) ^ static_cast<uint64_t>(m >> 64);
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

constexpr uint64_t kP0 = 0xa0761d6478bd642full, kP1 = 0xe7037ed1a0b428dbull, kP2 = 0x8ebc6af09c88c6e3ull,
                   kP3 = 0x589965cc75374cc3ull;

// noexcept: the map's nodes then keep no copy of the hash (it is recomputed: one multiply)
struct KeyHash {
  size_t operator()(const FileKey& k) const noexcept { return static_cast<size_t>(k.h1 ^ (k.h2 * kP0)); }
};

// A file's rows as the index holds them: one heap block, this header and then the coded bytes.
struct StoredRows {
  uint32_t mcus_per_row, blocks_in_mcu, comps, count, size;
  const uint8_t* coded() const { return reinterpret_cast<const uint8_t*>(this) + sizeof(StoredRows); }
};

struct FreeStoredRows {
  void operator()(StoredRows* r) const noexcept { std::free(r); }
};
using StoredRowsPtr = std::unique_ptr<StoredRows, FreeStoredRows>;

StoredRowsPtr store(const EntropyRows& rows) {
  void* block = std::malloc(sizeof(StoredRows) + rows.coded.size());
  if (!block) return nullptr;
  StoredRowsPtr r(new (block) StoredRows{rows.mcus_per_row, rows.blocks_in_mcu, rows.comps, rows.count,
                                         static_cast<uint32_t>(rows.coded.size())});
  if (!rows.coded.empty())
    std::memcpy(static_cast<uint8_t*>(block) + sizeof(StoredRows), rows.coded.data(), rows.coded.size());
  return r;
}

// A file's memory in the index: its block with glibc's chunk header, rounded to 16 bytes, and a
// map node (next, key, pointer: 40 bytes, a 48-byte chunk) with its share of the buckets (libstdc++
// keeps 1.5-2.2 a file: 16 bytes).
uint64_t cost_of(const StoredRows& rows) {
  return ((sizeof(StoredRows) + rows.size + 8 + 15) & ~uint64_t{15}) + 48 + 16;
}

// A checkpoint's bit position: from the scan's first entropy-coded byte.
inline uint64_t bit_position(const EntropyCheckpoint& c) { return uint64_t{c.offset} * 8 + c.skip; }

void put_varint(uint64_t v, std::vector<uint8_t>* out) {
  for (; v >= 0x80; v >>= 7) out->push_back(static_cast<uint8_t>(v | 0x80));
  out->push_back(static_cast<uint8_t>(v));
}

// false past the end or beyond 64 bits
inline bool get_varint(const uint8_t*& p, const uint8_t* end, uint64_t* v) {
  if (p < end && *p < 0x80) {  // (most: a prediction's change under 64)
    *v = *p++;
    return true;
  }
  uint64_t x = 0;
  for (int shift = 0; p < end && shift < 64; shift += 7) {
    const uint8_t b = *p++;
    if (shift == 63 && b > 1) return false;  // (past 64 bits)
    x |= uint64_t{b & 0x7Fu} << shift;
    if (!(b & 0x80)) {
      *v = x;
      return true;
    }
  }
  return false;
}

// The largest zigzagged change between two int16 predictions (-32768 -> 32767)
constexpr uint64_t kMaxPredChange = 2 * 65535;

inline uint64_t zigzag(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
inline int64_t unzigzag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

// Calls on_row(row) for each coded row in order; false when the coding is not `count` rows of
// valid checkpoints.
template <class F>
bool walk(const EntropyRows& rows, F&& on_row) {
  if (rows.comps > 4) return false;
  const uint8_t* p = rows.coded.data();
  const uint8_t* end = p + rows.coded.size();
  EntropyCheckpoint c;
  uint64_t bits = 0;
  for (uint32_t r = 0; r < rows.count; ++r) {
    uint64_t v;
    if (!get_varint(p, end, &v) || v > (uint64_t{UINT32_MAX} << 3 | 7) - bits) return false;
    bits += v;
    c.offset = static_cast<uint32_t>(bits >> 3);
    c.skip = static_cast<uint8_t>(bits & 7);
    for (uint32_t ci = 0; ci < rows.comps; ++ci) {
      if (!get_varint(p, end, &v) || v > kMaxPredChange) return false;
      const int64_t pred = c.pred[ci] + unzigzag(v);
      if (pred < INT16_MIN || pred > INT16_MAX) return false;
      c.pred[ci] = static_cast<int16_t>(pred);
    }
    on_row(c);
  }
  return p == end;
}

// GPUPIPE_ENTROPY_INDEX_MB's error, read once: decodes refuse to run until a bound is set (guarded by
// the index's lock once the index exists)
std::string g_env_error;

uint64_t initial_max_bytes() {
  if (const char* v = std::getenv("GPUPIPE_ENTROPY_INDEX_MB")) {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    if (end != v && *end == '\0' && v[0] != '-' && mb < (1ull << 40)) return static_cast<uint64_t>(mb) << 20;
    g_env_error = "GPUPIPE_ENTROPY_INDEX_MB must be a whole number of MiB (0: no entropy index), got '" +
                  std::string(v) + "' (or call gpupipe.set_entropy_index_size)";
    return 0;
  }
  return 256ull << 20;
}

struct Index {
  std::mutex lock;
  std::unordered_map<FileKey, StoredRowsPtr, KeyHash> files;
  uint64_t bytes = 0, max_bytes = initial_max_bytes();
  std::atomic<bool> enabled{max_bytes > 0};
  std::atomic<bool> paused{false};  // (benchmarks: decodes without it, its rows kept)
  std::atomic<uint64_t> keyed{0}, found{0}, learned{0}, full{0};
};

Index& index() {
  static Index* i = new Index();  // never destroyed: pool threads may still decode at exit
  return *i;
}

// fork() copies one thread; the lock a pool thread held at that moment would stay locked forever in
// the child. Taken around fork(), the child's copy is consistent and unlocked (the rows are valid there).
const bool g_atfork_registered = [] {
  index();
  return pthread_atfork([] { index().lock.lock(); }, [] { index().lock.unlock(); },
                        [] { index().lock.unlock(); }) == 0;
}();

// The hash's secrets, drawn once per process. A product of two words is 0 when one of them is: with
// public constants a file could make a block's other word, and all the state before it, vanish
// from the hash (two crafted files would share rows: wrong pixels). Secret, the words that do that
// cannot be chosen. A forked child keeps its parent's (and its parent's rows, which stay right).
struct Secrets {
  uint64_t s[6];
  Secrets() {
    uint64_t seed = 0;
    try {
      std::random_device device;
      seed = (static_cast<uint64_t>(device()) << 32) ^ device();
    } catch (...) {  // no entropy source: the clock and an address, still unknown to a file's author
    }
    seed ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            reinterpret_cast<uintptr_t>(this);
    const uint64_t constants[6] = {kP0, kP1, kP2, kP3, kP0 ^ kP3, kP1 ^ kP2};
    for (int i = 0; i < 6; ++i) {  // splitmix64: distinct, odd-heavy, well mixed
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s[i] = (z ^ (z >> 31)) ^ constants[i];
    }
  }
};

const Secrets& secrets() {
  static const Secrets s;
  return s;
}

// Drawn at load, as index() is made: a fork() during a first, lazy draw would leave the child's
// guard of the static held, and its first hash waiting forever.
const Secrets& g_secrets_drawn = secrets();

}  // namespace

bool EntropyRows::append(const EntropyCheckpoint* rows, size_t n) {
  if (comps > 4) return false;
  EntropyCheckpoint last;  // the scan's start before row 0
  if (count ? !walk(*this, [&](const EntropyCheckpoint& c) { last = c; }) : !coded.empty()) return false;
  if (n > UINT32_MAX - count) return false;
  const size_t had = coded.size();
  for (size_t i = 0; i < n; ++i) {
    const EntropyCheckpoint& c = rows[i];
    if (bit_position(c) < bit_position(last) || c.skip > 7) {
      coded.resize(had);
      return false;
    }
    put_varint(bit_position(c) - bit_position(last), &coded);
    for (uint32_t ci = 0; ci < comps; ++ci) put_varint(zigzag(int64_t{c.pred[ci]} - last.pred[ci]), &coded);
    last = c;
  }
  count += static_cast<uint32_t>(n);
  return true;
}

bool EntropyRows::expand(std::vector<EntropyCheckpoint>* out) const {
  if (count > coded.size() / (1 + comps)) {  // (each row takes 1 + comps bytes at least: refused before allocating)
    out->clear();
    return false;
  }
  out->resize(count);
  EntropyCheckpoint* row = out->data();
  if (walk(*this, [&](const EntropyCheckpoint& c) { *row++ = c; })) return true;
  out->clear();
  return false;
}

FileKey file_key(const uint8_t* data, size_t size) {
  // Two independent 64-bit lanes over every byte, each 16 bytes mixed with a 128-bit product of
  // the words xored with secrets (wyhash's construction, seeded per process).
  const uint64_t* s = secrets().s;
  uint64_t a = s[0] ^ size, b = s[1] ^ (size * kP2), c = s[4], d = s[5];
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    a = mix(load64(data + i) ^ s[2], load64(data + i + 8) ^ a);
    b = mix(load64(data + i + 16) ^ s[3], load64(data + i + 24) ^ b);
    c ^= a + kP3;
    d += b ^ kP0;
  }
  uint8_t tail[32] = {};
  std::memcpy(tail, data + i, size - i);
  a = mix(load64(tail) ^ s[2], load64(tail + 8) ^ a ^ (size - i));
  b = mix(load64(tail + 16) ^ s[3], load64(tail + 24) ^ b);
  FileKey k;
  k.size = size;
  k.h1 = mix(a ^ s[4], c ^ b ^ kP1);
  k.h2 = mix(b ^ s[5], d ^ a ^ kP2);
  return k;
}

void check_entropy_index_env() {
  Index& x = index();  // (reads the variable)
  std::string error;
  {
    std::lock_guard<std::mutex> g(x.lock);  // (set_entropy_index_bytes clears it)
    error = g_env_error;
  }
  if (!error.empty()) throw InvalidArgument(error);
}

uint64_t set_entropy_index_bytes(uint64_t max_bytes) {
  Index& x = index();
  std::lock_guard<std::mutex> g(x.lock);
  g_env_error.clear();  // (a bound set explicitly replaces a bad variable's)
  const uint64_t old = x.max_bytes;
  x.max_bytes = max_bytes;
  x.enabled.store(max_bytes > 0);
  if (max_bytes == 0 || x.bytes > max_bytes) {  // off, or smaller than what is held: start again
    decltype(x.files)().swap(x.files);  // (its buckets too)
    x.bytes = 0;
  }
  return old;
}

bool entropy_index_enabled() {
  const Index& x = index();
  return x.enabled.load(std::memory_order_relaxed) && !x.paused.load(std::memory_order_relaxed);
}

bool pause_entropy_index(bool paused) { return index().paused.exchange(paused); }

EntropyIndexStats entropy_index_stats() {
  Index& x = index();
  std::lock_guard<std::mutex> g(x.lock);
  EntropyIndexStats s;
  s.files = x.files.size();
  s.bytes = x.bytes;
  s.max_bytes = x.max_bytes;
  s.keyed = x.keyed.load();
  s.found = x.found.load();
  s.learned = x.learned.load();
  s.full = x.full.load();
  return s;
}

void clear_entropy_index() {
  Index& x = index();
  std::lock_guard<std::mutex> g(x.lock);
  decltype(x.files)().swap(x.files);  // (its buckets too)
  x.bytes = 0;
  x.keyed = x.found = x.learned = x.full = 0;
}

bool find_entropy_rows(const FileKey& key, EntropyRows* out) {
  Index& x = index();
  std::lock_guard<std::mutex> g(x.lock);
  auto it = x.files.find(key);
  if (it == x.files.end()) return false;
  const StoredRows& r = *it->second;
  out->coded.assign(r.coded(), r.coded() + r.size);  // (first: what may throw, out's rest untouched)
  out->mcus_per_row = r.mcus_per_row;
  out->blocks_in_mcu = r.blocks_in_mcu;
  out->comps = r.comps;
  out->count = r.count;
  x.found.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void EntropyIndexUse::look_up() {
  looked_up = true;
  index().keyed.fetch_add(1, std::memory_order_relaxed);
  key = file_key(data, size);
  try {
    found = find_entropy_rows(key, &known);
  } catch (const std::bad_alloc&) {  // (no memory for the copy: decoded as without the index)
    found = false;
  }
}

static void learn(EntropyIndexUse&& use) {
  const size_t base = use.found ? use.known.count : 0;
  if (!use.looked_up || use.learned.empty() || base + use.learned.size() < 2) return;  // (row 0's start alone saves nothing)
  if (use.found && (use.known.mcus_per_row != use.mcus_per_row || use.known.blocks_in_mcu != use.blocks_in_mcu ||
                    use.known.comps != use.comps))
    return;  // (the same bytes give the same layout: never, unless the key collided)
  // Nor when the bytes changed under the decode (a caller refilling its buffer meanwhile): the rows
  // of other bytes would stand for these in every later decode of them. One more pass over the file,
  // only where rows are learned.
  if (!(file_key(use.data, use.size) == use.key)) return;
  EntropyRows rows;
  if (use.found) rows = std::move(use.known);
  rows.mcus_per_row = use.mcus_per_row;
  rows.blocks_in_mcu = use.blocks_in_mcu;
  rows.comps = use.comps;
  if (!rows.append(use.learned.data(), use.learned.size()) || rows.coded.size() > UINT32_MAX) return;
  StoredRowsPtr stored = store(rows);
  if (!stored) return;  // (no memory: learned another time)
  const uint64_t cost = cost_of(*stored);
  Index& x = index();
  std::lock_guard<std::mutex> g(x.lock);
  if (x.max_bytes == 0) return;
  auto it = x.files.find(use.key);
  const uint64_t held = it == x.files.end() ? 0 : cost_of(*it->second);
  if (it != x.files.end() && it->second->count != base) return;  // another decode got there first
  if (it == x.files.end() && base != 0) return;  // (emptied meanwhile: the rows no longer continue any)
  if (x.bytes - held + cost > x.max_bytes) {
    x.full.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (it == x.files.end())
    x.files.emplace(use.key, std::move(stored));  // (may throw: counted after)
  else
    it->second = std::move(stored);  // (the old block freed under the lock: nothing else reads it)
  x.bytes = x.bytes - held + cost;
  x.learned.fetch_add(1, std::memory_order_relaxed);
}

void learn_entropy_rows(EntropyIndexUse&& use) {
  try {
    learn(std::move(use));
  } catch (const std::bad_alloc&) {  // (no memory: the decode stands, nothing learned)
  }
}

}  // namespace gpupipe
