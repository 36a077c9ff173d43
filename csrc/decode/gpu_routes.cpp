#include "decode/gpu_routes.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "common/keyed_uniforms.h"
#include "decode/header_table.h"

namespace gpupipe {
namespace {

// The header table's columns, by name (header_table.h).
constexpr size_t kHeight = info_column("height"), kWidth = info_column("width"),
                 kColorSpace = info_column("colorspace"), kProgressive = info_column("progressive"),
                 kScans = info_column("scans"), kTrailing = info_column("trailing"),
                 kMalformed = info_column("malformed");

bool whole(double v) { return std::floor(v) == v; }

}  // namespace

GpuRefusal gpu_refusal(const int64_t* row, const Box& box, const GpuEligibility& e) {
  if (e.window || e.strict) return GpuRefusal::kWindowOrStrict;
  const int64_t h = row[kHeight], w = row[kWidth], cs = row[kColorSpace], scans = row[kScans];
  if (h <= 0 || w <= 0) return GpuRefusal::kHeader;
  if (cs < 0 || cs >= 32 || !((e.colorspaces >> cs) & 1u)) return GpuRefusal::kColorSpace;
  int64_t pixels = 0;  // (a JPEG's sides are at most 65535; a crafted table's are not)
  if (__builtin_mul_overflow(h, w, &pixels) || pixels > e.max_pixels) return GpuRefusal::kPixels;
  if (scans < 0 || scans > e.max_scans) return GpuRefusal::kScans;
  const int64_t malformed = row[kMalformed];
  if (malformed < 0 || (malformed & kMalformedLayout)) return GpuRefusal::kLayout;
  if (malformed & kFinerChroma) return GpuRefusal::kSampling;
  if (row[kTrailing] < 0) return GpuRefusal::kNoEoi;
  const double t = box.top, l = box.left, bh = box.height, bw = box.width;
  const bool inside = t >= 0 && l >= 0 && bh >= 1 && bw >= 1 && t + bh <= static_cast<double>(h) &&
                      l + bw <= static_cast<double>(w);
  const bool sized = e.box_height <= 0 || (bh == static_cast<double>(e.box_height) &&
                                           bw == static_cast<double>(e.box_width));
  const bool ok = inside && sized && whole(t) && whole(l) && whole(bh) && whole(bw);
  return ok ? GpuRefusal::kNone : GpuRefusal::kBox;
}

void hybrid_routes(const int64_t* table, const std::vector<Box>& boxes, const int64_t* indices, uint64_t seed,
                   uint64_t epoch, uint64_t stream, const RouteShares& shares, const GpuEligibility& e, int64_t* route,
                   int8_t* reason) {
  const uint64_t key = keyed_stream_key(seed, epoch, stream);
  const double to_cpu = shares.cpu, to_hardware = shares.cpu + shares.hardware;  // numpy's cumsum, the same sums
  for (size_t i = 0; i < boxes.size(); ++i) {
    const int64_t* row = table + kInfoWidth * i;
    route[i] = static_cast<int64_t>(Engine::kCpu);
    reason[i] = static_cast<int8_t>(RouteReason::kShare);
    if (!gpu_eligible(row, boxes[i], e)) {
      reason[i] = static_cast<int8_t>(RouteReason::kIneligible);
      continue;
    }
    const double u = keyed_draw(keyed_sample_key(key, indices[i]), 0);
    const Engine drawn = u < to_cpu ? Engine::kCpu : u < to_hardware ? Engine::kHardware : Engine::kCuda;
    if (drawn == Engine::kHardware && shares.has_hardware) {
      if (row[kProgressive] == 1)
        reason[i] = static_cast<int8_t>(RouteReason::kHardwareDeclines);
      else
        route[i] = static_cast<int64_t>(Engine::kHardware);
    } else if (drawn == Engine::kCuda && shares.has_cuda) {
      route[i] = static_cast<int64_t>(Engine::kCuda);
    }
  }
}

// Fitted on one core of an AMD EPYC (Zen 4), RandomResizedCrop 224 of 1,536 files (assorted sizes,
// 800x533 and 1920x1280 photos): the Huffman pass to the crop's last row (bytes and pixels above it)
// and the DCT-scaled crop's IDCT, colour conversion and resize; 5.8% median error, R^2 0.96
// (python -m benchmarks.hybrid_split --fit). The GPU decoder's: two parameters fitted to an H100's
// hardware decoder rates on three sets, where bytes fitted them better than pixels (docs/gpu.md;
// hybrid_probe --part costs measures it per file on a GPU).
double cpu_cost_estimate(const int64_t* row, const Box& box, int64_t nbytes, int out_h, int out_w, bool dct_scaling) {
  const double h = static_cast<double>(row[kHeight]), w = static_cast<double>(row[kWidth]);
  // (a file size is never negative: a crafted one is taken as 0, so every estimate stays finite and
  // positive and the ranking's sort has a strict weak order)
  const double mb = static_cast<double>(std::max<int64_t>(nbytes, 0)) * 1e-6, mpx = h * w * 1e-6;
  const double above = (box.top + box.height) / h;  // the rows the Huffman pass reads
  // (a box of an eligible sample lies inside its image; any other is only kept from undefined casts)
  const bool castable = box.height >= 0 && box.height < 0x1p31 && box.width >= 0 && box.width < 0x1p31;
  const int m = dct_scaling && castable ? choose_scale_num(static_cast<int64_t>(box.height),
                                                           static_cast<int64_t>(box.width), out_h, out_w)
                                        : 8;
  const double scale = m / 8.0;
  const double scaled_mpx = box.height * box.width * scale * scale * 1e-6;
  return 0.17 + above * (4.5 * mb + 0.35 * mpx) + 2.2 * scaled_mpx;
}

double gpu_cost_estimate(int64_t nbytes) {
  return 0.018 + 0.594 * (static_cast<double>(std::max<int64_t>(nbytes, 0)) * 1e-6);
}

void hybrid_ranked_routes(const int64_t* table, const std::vector<Box>& boxes, const int64_t* indices, uint64_t seed,
                          uint64_t epoch, uint64_t stream, const RouteShares& shares, const GpuEligibility& e,
                          const RankInputs& rank, int64_t* route, int8_t* reason) {
  const uint64_t key = keyed_stream_key(seed, epoch, stream);
  const double hardware = shares.has_hardware ? shares.hardware : 0.0;
  const double cuda = shares.has_cuda ? std::max(0.0, 1.0 - shares.cpu - shares.hardware) : 0.0;
  const double gpu = hardware + cuda;
  const double to_cpu = std::min(std::max(1.0 - gpu, 0.0), 1.0);  // the CPU core's share, a missing engine's with it
  const double to_hardware = gpu > 0 ? hardware / gpu : 0.0;
  const size_t n = boxes.size();
  // (ratio, draw 0, position) of a group's rankable samples: sorted, the first k go to the CPU core
  std::vector<std::tuple<double, double, size_t>> ranked;
  for (size_t a = 0; a < n;) {
    size_t b = a + 1;
    while (b < n && rank.groups[b] == rank.groups[a]) ++b;
    ranked.clear();
    for (size_t i = a; i < b; ++i) {
      const int64_t* row = table + kInfoWidth * i;
      route[i] = static_cast<int64_t>(Engine::kCpu);
      reason[i] = static_cast<int8_t>(RouteReason::kShare);
      if (!gpu_eligible(row, boxes[i], e)) {
        reason[i] = static_cast<int8_t>(RouteReason::kIneligible);
      } else if (row[kProgressive] == 1 && hardware > 0) {
        reason[i] = static_cast<int8_t>(RouteReason::kHardwareDeclines);
      } else if (gpu > 0) {
        const double ratio = cpu_cost_estimate(row, boxes[i], rank.nbytes[i], rank.out_h, rank.out_w, rank.dct_scaling) /
                             gpu_cost_estimate(rank.nbytes[i]);
        ranked.emplace_back(ratio, keyed_draw(keyed_sample_key(key, indices[i]), 0), i);
      }
    }
    if (!ranked.empty()) {
      std::sort(ranked.begin(), ranked.end());
      const double m = static_cast<double>(ranked.size());
      // keyed on the group (a Loader's batch number), not on a sample: a sample that fails to read
      // on a replay moves at most one other sample of its batch
      const double v = keyed_draw(keyed_sample_key(key, rank.groups[a]), 1);
      const size_t k = static_cast<size_t>(std::min(std::floor(to_cpu * m + v), m));
      for (size_t j = k; j < ranked.size(); ++j) {
        const size_t i = std::get<2>(ranked[j]);
        const bool hw = keyed_draw(keyed_sample_key(key, indices[i]), 2) < to_hardware;
        route[i] = static_cast<int64_t>(hw ? Engine::kHardware : Engine::kCuda);
      }
    }
    a = b;
  }
}

}  // namespace gpupipe
