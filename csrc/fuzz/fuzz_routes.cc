// libFuzzer harness of the hybrid backend's routing (csrc/decode/gpu_routes.cpp), no Python, under
// ASan + UBSan: header tables, boxes, file sizes and groups straight from the input (any int64 and any
// double, NaN and infinities included), both splits, any shares. Every route must be an engine, every
// reason a reason, an ineligible sample always on the CPU core. Input layout: 16 parameter bytes, then
// rows of kInfoWidth int64s, 4 doubles, 2 int64s (file size, group).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "decode/gpu_routes.h"
#include "decode/header_table.h"

using namespace gpupipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  if (size < 16) return 0;
  const uint8_t* p = input;
  constexpr size_t kRow = kInfoWidth * 8 + 4 * 8 + 2 * 8;
  const size_t n = std::min<size_t>((size - 16) / kRow, 512);
  std::vector<int64_t> table(kInfoWidth * n), nbytes(n), groups(n), indices(n);
  std::vector<Box> boxes(n);
  const uint8_t* row = input + 16;
  for (size_t i = 0; i < n; ++i, row += kRow) {
    std::memcpy(&table[kInfoWidth * i], row, kInfoWidth * 8);
    double b[4];
    std::memcpy(b, row + kInfoWidth * 8, sizeof b);
    boxes[i] = Box{b[0], b[1], b[2], b[3]};
    std::memcpy(&nbytes[i], row + kInfoWidth * 8 + 32, 8);
    std::memcpy(&groups[i], row + kInfoWidth * 8 + 40, 8);
    indices[i] = static_cast<int64_t>(i) * 7919;
  }
  // a plausible table now and then: the eligible path (sizes, colour space, scans, EOI) is reached
  if (p[0] & 1)
    for (size_t i = 0; i < n; ++i) {
      int64_t* t = &table[kInfoWidth * i];
      t[info_column("height")] = 1 + std::llabs(t[info_column("height")] % 4000);
      t[info_column("width")] = 1 + std::llabs(t[info_column("width")] % 4000);
      t[info_column("colorspace")] = std::llabs(t[info_column("colorspace")] % 3);
      t[info_column("scans")] = 1 + std::llabs(t[info_column("scans")] % 3);
      t[info_column("trailing")] = std::llabs(t[info_column("trailing")] % 3);
      t[info_column("malformed")] = 0;
      t[info_column("progressive")] = t[info_column("progressive")] & 1;
      const double h = static_cast<double>(t[info_column("height")]), w = static_cast<double>(t[info_column("width")]);
      if (p[0] & 2)
        boxes[i] = Box{std::floor(std::fmod(std::fabs(boxes[i].top), h)), 0, 1, std::floor(w)};
    }
  RouteShares shares;
  shares.cpu = (p[1] % 101) / 100.0;
  shares.hardware = std::min(1.0 - shares.cpu, (p[2] % 101) / 100.0);
  if (p[3] & 1) std::memcpy(&shares.cpu, p + 4, 8);  // any double, NaN included
  shares.has_hardware = p[12] & 1;
  shares.has_cuda = p[12] & 2;
  GpuEligibility e;
  e.colorspaces = 0x7;
  e.max_pixels = int64_t{1} << 26;
  e.max_scans = 100;
  e.window = p[13] & 1;
  if (p[13] & 2) e.box_height = 1, e.box_width = p[14];  // no resize: boxes of the output's size only
  RankInputs rank{nbytes.data(), groups.data(), p[14] % 3 ? 224 : 0, p[14] % 3 == 2 ? 24 : 224, (p[15] & 1) != 0};
  std::vector<int64_t> route(n);
  std::vector<int8_t> reason(n);
  for (int ranked = 0; ranked < 2; ++ranked) {
    if (ranked)
      hybrid_ranked_routes(table.data(), boxes, indices.data(), p[13], p[14], p[15], shares, e, rank, route.data(),
                           reason.data());
    else
      hybrid_routes(table.data(), boxes, indices.data(), p[13], p[14], p[15], shares, e, route.data(), reason.data());
    for (size_t i = 0; i < n; ++i) {
      if (route[i] < 0 || route[i] > 2 || reason[i] < 0 || reason[i] > 2) std::abort();
      if (reason[i] != 0 && route[i] != 0) std::abort();  // an ineligible or declined sample: the CPU core
    }
  }
  for (size_t i = 0; i < n; ++i) {
    volatile double c = cpu_cost_estimate(&table[kInfoWidth * i], boxes[i], nbytes[i], 224, 224, true);
    volatile double g = gpu_cost_estimate(nbytes[i]);
    if (!(g > 0)) std::abort();
    (void)c;
  }
  return 0;
}
