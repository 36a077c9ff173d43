// Which engine decodes each sample of a hybrid batch, from the batch's header table and boxes, in
// one pass: whether a GPU decoder may take the sample with gpupipe's semantics, then its keyed
// share. The Python definitions these replace on the hot path (numpy, ~30 array ops a batch) are
// the tests' reference (tests/test_hybrid.py).
#pragma once

#include <cstdint>
#include <vector>

#include "decode/jpeg_decoder.h"

namespace gpupipe {

// What makes a sample decodable on a GPU decoder beside its header and box.
struct GpuEligibility {
  bool window = false;          // a window resize: never (the GPU resizers crop first)
  bool strict = false;          // strict: never (nvJPEG does not report recoverable corruption)
  uint32_t colorspaces = 0;     // bit c set: ColorSpace c allowed
  int64_t max_pixels = 0;       // gpupipe's limits: the CPU core reports what exceeds them
  int64_t max_scans = 0;
  int64_t box_height = 0;       // without a resize, the output's size: a box of another size is the
  int64_t box_width = 0;        // CPU core's to report (0: any size)
};

// Why a sample may not go to a GPU decoder (the first that holds, in this order, kLayout and
// kSampling checked right after kScans), or kNone. gpupipe._backends.gpu_fallback.REFUSALS words each.
enum class GpuRefusal : int8_t {
  kNone = 0,
  kWindowOrStrict = 1,  // a window resize, or a strict decode
  kHeader = 2,          // no readable header (not a JPEG, corrupt, ...)
  kColorSpace = 3,      // a colour space not allowed (CMYK, YCCK, coded as RGB, ...)
  kPixels = 4,          // over max_pixels
  kScans = 5,           // scans not counted, or over max_scans
  kNoEoi = 6,           // no EOI marker ends the JPEG (a truncated file)
  kBox = 7,             // the box: outside the image, fractional, or not the output's size without a resize
  kLayout = 8,          // a marker layout libjpeg reads only with a warning or an error (header_table.cpp)
  kSampling = 9,        // a component sampled more finely than the first (DALI's crop decode gets it wrong)
};

// Whether the sample of header-table row `row` (kInfoColumns) and `box` may go to a GPU decoder: a
// readable header of an allowed colour space within the limits, its scans counted, a marker layout
// libjpeg reads cleanly, an EOI marker ending it (the bytes after it are not given to the decoder),
// the box whole and inside the image (and of the output's size without a resize).
GpuRefusal gpu_refusal(const int64_t* row, const Box& box, const GpuEligibility& e);
inline bool gpu_eligible(const int64_t* row, const Box& box, const GpuEligibility& e) {
  return gpu_refusal(row, box, e) == GpuRefusal::kNone;
}

// The engines of a hybrid batch, in the order of gpupipe._backends.hybrid.ENGINES.
enum class Engine : int64_t { kCpu = 0, kHardware = 1, kCuda = 2 };

// Why a sample is on the CPU core other than by its share.
enum class RouteReason : int8_t { kShare = 0, kIneligible = 1, kHardwareDeclines = 2 };

struct RouteShares {
  double cpu = 1, hardware = 0;  // the CUDA decoder has the rest
  bool has_hardware = false, has_cuda = false;  // an engine that is not there: its share to the CPU core
};

// route[i], reason[i] of each sample: its keyed draw u (stream `stream` of (seed, epoch, index), draw
// 0) picks the CPU core when u < cpu, the hardware decoder when u < cpu + hardware, else the CUDA
// decoder; an ineligible sample, a missing engine's share and a progressive file drawn for the
// hardware decoder (which declines them) go to the CPU core.
void hybrid_routes(const int64_t* table, const std::vector<Box>& boxes, const int64_t* indices, uint64_t seed,
                   uint64_t epoch, uint64_t stream, const RouteShares& shares, const GpuEligibility& e, int64_t* route,
                   int8_t* reason);

// What the ranked split estimates each sample's cost from, beside its header and box.
struct RankInputs {
  const int64_t* nbytes = nullptr;  // each sample's file size
  const int64_t* groups = nullptr;  // each sample's group (a Loader's batch number): runs of equal values
  int out_h = 0, out_w = 0;         // the output size (0: no resize), for the DCT scale the CPU core picks
  bool dct_scaling = true;
};

// A sample's estimated decode time (ms) on one thread of the CPU core (ROI, DCT scaling) and on a
// GPU decoder (the whole image), fitted on measurements; only their ratio is used, to rank samples.
double cpu_cost_estimate(const int64_t* row, const Box& box, int64_t nbytes, int out_h, int out_w, bool dct_scaling);
double gpu_cost_estimate(int64_t nbytes);

// The ranked split (gpupipe._backends.hybrid.assign_ranked is its numpy definition): route[i],
// reason[i] as hybrid_routes gives them for ineligible samples and progressive files beside a
// hardware decoder; of each group's other samples (m), the k = floor(f * m + v) with the lowest
// estimated CPU-to-GPU cost ratio go to the CPU core (f its share, with a missing engine's; v draw 1
// keyed on the group's value as an index), ties broken by draw 0 then position; the rest to the
// hardware decoder when draw 2 < hardware / (hardware + cuda), else the CUDA decoder.
void hybrid_ranked_routes(const int64_t* table, const std::vector<Box>& boxes, const int64_t* indices, uint64_t seed,
                          uint64_t epoch, uint64_t stream, const RouteShares& shares, const GpuEligibility& e,
                          const RankInputs& rank, int64_t* route, int8_t* reason);

}  // namespace gpupipe
