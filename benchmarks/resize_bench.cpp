// The CPU core's resampler alone (csrc/decode/resize.cpp), outside Python and the decoder: the
// best of repeated 10-call timings of Resampler::resize on RandomResizedCrop-like shapes (the
// regions DCT scaling leaves, an upscale, a 2x box, a vertical-first one), with a hash of each
// output to check a change keeps the bits. Built by hand against the sources:
//
//   g++ -O3 -std=c++17 -ffp-contract=off -Icsrc benchmarks/resize_bench.cpp csrc/decode/resize.cpp
//       csrc/common/multiversion.cpp -o /tmp/resize_bench && /tmp/resize_bench [reps] [level]
//
// level: default, avx2, avx512, avx512_vbmi (gpupipe.set_cpu_capability's names; default: the CPU's).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/multiversion.h"
#include "decode/resize.h"

using gpupipe::Resampler;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 40;
  if (argc > 2) gpupipe::set_cpu_level(gpupipe::cpu_level_named(argv[2]));
  struct Shape {
    int src_h, src_w;
    double x0, y0, x1, y1;
    int dst_h, dst_w;
  };
  const Shape shapes[] = {
      {256, 260, 3.3, 1.7, 252.1, 251.9, 224, 224},  // ratio ~1.1: what DCT scaling leaves
      {300, 400, 0, 0, 400, 300, 224, 224},          // 1.34 x 1.79
      {180, 200, 0.5, 0.5, 199.5, 179.5, 224, 224},  // an upscale
      {448, 448, 0, 0, 448, 448, 224, 224},          // 2x
      {533, 300, 0, 0, 300, 533, 176, 176},          // the vertical pass first (Pillow >= 13)
      {240, 250, 1, 1, 249, 239, 224, 224},
  };
  std::mt19937 rng(1);
  Resampler r;
  double total = 0;
  std::printf("level %s\n", gpupipe::cpu_level_name(gpupipe::cpu_level()));
  for (const Shape& s : shapes) {
    std::vector<uint8_t> src(static_cast<size_t>(s.src_h) * s.src_w * 3);
    for (auto& v : src) v = static_cast<uint8_t>(rng());
    std::vector<uint8_t> dst(static_cast<size_t>(s.dst_h) * s.dst_w * 3);
    const bool hfirst = Resampler::pillow_horizontal_first(s.y1 - s.y0, s.x1 - s.x0, s.dst_h, s.dst_w);
    auto call = [&] {
      r.resize(src.data(), s.src_h, s.src_w, 3, static_cast<size_t>(s.src_w) * 3, s.x0, s.y0, s.x1, s.y1, dst.data(),
               s.dst_h, s.dst_w, static_cast<size_t>(s.dst_w) * 3, hfirst);
    };
    call();
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 10; ++i) call();
      best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 10);
    }
    unsigned long long hash = 1469598103934665603ull;  // FNV-1a of the output
    for (uint8_t v : dst) hash = (hash ^ v) * 1099511628211ull;
    std::printf("%4dx%-4d -> %dx%d (%s first): %7.1f us  output %016llx\n", s.src_h, s.src_w, s.dst_h, s.dst_w,
                hfirst ? "horizontal" : "vertical", best, hash);
    total += best;
  }
  std::printf("total %.1f us\n", total);
}
