#include "decode/gpu_routes.h"

#include <cmath>

#include "common/keyed_uniforms.h"
#include "decode/header_table.h"

namespace gpupipe {
namespace {

// The header table's columns, by name (header_table.h).
constexpr size_t kHeight = info_column("height"), kWidth = info_column("width"),
                 kColorSpace = info_column("colorspace"), kProgressive = info_column("progressive"),
                 kScans = info_column("scans"), kEoi = info_column("eoi");

bool whole(double v) { return std::floor(v) == v; }

}  // namespace

bool gpu_eligible(const int64_t* row, const Box& box, const GpuEligibility& e) {
  if (e.window || e.strict) return false;
  const int64_t h = row[kHeight], w = row[kWidth], cs = row[kColorSpace], scans = row[kScans];
  if (h <= 0 || w <= 0 || cs < 0 || cs >= 32 || !((e.colorspaces >> cs) & 1u)) return false;
  int64_t pixels = 0;  // (a JPEG's sides are at most 65535; a crafted table's are not)
  if (__builtin_mul_overflow(h, w, &pixels) || pixels > e.max_pixels) return false;
  if (scans < 0 || scans > e.max_scans || row[kEoi] != 1) return false;
  const double t = box.top, l = box.left, bh = box.height, bw = box.width;
  const bool inside = t >= 0 && l >= 0 && bh >= 1 && bw >= 1 && t + bh <= static_cast<double>(h) &&
                      l + bw <= static_cast<double>(w);
  return inside && whole(t) && whole(l) && whole(bh) && whole(bw);
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

}  // namespace gpupipe
