#include "decode/crop_resize.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <string>

#include "common/errors.h"
#include "common/parallel_rows.h"
#include "common/thread_pool.h"
#include "decode/decode_args.h"
#include "decode/resize.h"

namespace gpupipe {
namespace {

uint64_t align16(uint64_t v) { return (v + 15) / 16 * 16; }

constexpr int64_t kMaxImageSide = int64_t{1} << 24;

InvalidArgument sample_error(size_t i, const std::string& what) {
  return InvalidArgument("sample " + std::to_string(i) + ": " + what);
}

// Where the sample's passes read and write, as Resampler::resize decides for the CPU core's region
// (jpeg_decoder.cpp's plan_decode with DCT scaling off): a copy when the core copies, else each pass
// whose axis changes size or box, in Pillow's order, the first into the intermediate when both run.
void plan_passes(CropResizeSample* s, bool copy, bool horizontal_first, int64_t out_h, int64_t out_w,
                 int64_t channels) {
  const bool need_h = out_w != s->region_w || s->bx0 != 0.0 || s->bx1 != s->region_w;
  const bool need_v = out_h != s->region_h || s->by0 != 0.0 || s->by1 != s->region_h;
  const int32_t oh = static_cast<int32_t>(out_h);
  s->first_rows = oh;
  if (copy || (!need_h && !need_v)) {
    s->first = CropPass::kCopy;
    return;
  }
  if (!need_h || !need_v) {  // one pass, straight into the output
    s->first = need_h ? CropPass::kHorizontal : CropPass::kVertical;
    return;
  }
  s->second_rows = oh;
  if (horizontal_first) {  // horizontal over the rows the vertical pass reads, then vertical
    const resample::Axis v = resample::axis_of(s->region_h, s->by0, s->by1, oh);
    int first, count, last_first, last_count;
    resample::output_taps(v, 0, &first, &count, nullptr);
    resample::output_taps(v, oh - 1, &last_first, &last_count, nullptr);
    s->first = CropPass::kHorizontal;
    s->second = CropPass::kVertical;
    s->temp_row0 = first;
    s->temp_rows = last_first + last_count - first;
    s->temp_row_bytes = static_cast<int32_t>(out_w * channels);
  } else {  // vertical over every region column, then horizontal
    s->first = CropPass::kVertical;
    s->second = CropPass::kHorizontal;
    s->temp_rows = oh;
    s->temp_row_bytes = static_cast<int32_t>(s->region_w * channels);
  }
  s->first_rows = s->temp_rows;
}

// Runs fn(sample, row) for rows [0, count(sample)) of every sample, as one parallel loop.
template <typename Count, typename Fn>
void for_each_sample_row(size_t n, int num_threads, Count&& count, Fn&& fn) {
  std::vector<int64_t> end(n);  // the rows of samples 0..i
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) end[i] = total += count(i);
  parallel_rows(total, num_threads, [&](int64_t begin, int64_t stop) {
    size_t i = static_cast<size_t>(std::upper_bound(end.begin(), end.end(), begin) - end.begin());
    for (int64_t k = begin; k < stop; ++k) {
      while (k >= end[i]) ++i;
      fn(i, k - (end[i] - count(i)));
    }
  });
}

}  // namespace

std::vector<RaggedImage> ragged_images(const std::vector<int64_t>& rows) {
  std::vector<RaggedImage> images(rows.size() / 4);
  for (size_t i = 0; i < images.size(); ++i) {
    images[i].address = static_cast<uint64_t>(rows[4 * i]);
    images[i].height = rows[4 * i + 1];
    images[i].width = rows[4 * i + 2];
    images[i].pitch = rows[4 * i + 3];
  }
  return images;
}

CropResizePlan plan_crop_resize(const std::vector<RaggedImage>& images, const std::vector<Box>& boxes,
                                const std::vector<int64_t>& slots, uintptr_t out_address, size_t out_nbytes,
                                int64_t batch, int64_t out_h, int64_t out_w, int64_t channels, bool resize,
                                bool window) {
  const size_t n = images.size();
  if (boxes.size() != n || slots.size() != n)
    throw InvalidArgument(std::to_string(n) + " images but " + std::to_string(boxes.size()) + " boxes and " +
                          std::to_string(slots.size()) + " slots");
  if (channels != 1 && channels != 3)
    throw InvalidArgument("the output must have 1 or 3 channels, got " + std::to_string(channels));
  // rows of the output and of any region are int32 byte counts in the kernels
  if (batch < 0 || out_h < 1 || out_w < 1 || out_h > INT32_MAX || out_w > INT32_MAX / channels)
    throw InvalidArgument("the output must be [batch >= 0, height >= 1, width >= 1, channels] within int32 rows, got [" +
                          std::to_string(batch) + ", " + std::to_string(out_h) + ", " + std::to_string(out_w) + ", " +
                          std::to_string(channels) + "]");
  const size_t needed = checked_mul(checked_mul(checked_mul(static_cast<size_t>(batch), out_h, "the output"), out_w,
                                                "the output"),
                                    channels, "the output");
  checked_output(out_address, needed, out_nbytes, {});  // the batch's size before a table of its slots
  CropResizePlan plan;
  plan.batch = batch;
  plan.out_h = out_h;
  plan.out_w = out_w;
  plan.channels = channels;
  std::vector<ByteSpan> extents(n);  // each image's bytes, which the output must not overlap
  std::vector<int64_t> owner(static_cast<size_t>(batch), -1);
  uint64_t offset = crop_table_bytes(n);
  plan.samples.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const RaggedImage& im = images[i];
    const Box& b = boxes[i];
    if (im.address == 0) throw sample_error(i, "the image address is null");
    // Sides within 2^24 keep every tap count (2 * ceil(scale) + 1) far inside int32, and a pitch
    // within 2^36 every image's extent within 2^60 bytes.
    if (im.height < 1 || im.width < 1 || im.height > kMaxImageSide || im.width > kMaxImageSide ||
        im.pitch < im.width * channels || im.pitch > (int64_t{1} << 36))
      throw sample_error(i, "the image must be at least 1x1, at most " + std::to_string(kMaxImageSide) +
                                " pixels a side, with a row pitch from width * " +
                                std::to_string(channels) + " bytes to 2^36; got " + std::to_string(im.width) + "x" +
                                std::to_string(im.height) + " (width x height), pitch " + std::to_string(im.pitch));
    if (!box_inside(b, im.height, im.width))
      throw sample_error(i, "crop box " + describe(b) + " is not inside the image of " + std::to_string(im.width) +
                                "x" + std::to_string(im.height) + " (width x height)");
    if (!whole_box(b)) throw sample_error(i, "crop box " + describe(b) + " is fractional: boxes must be whole pixels");
    if (!resize && (b.height != out_h || b.width != out_w))
      throw sample_error(i, "crop box " + describe(b) + " differs from the output size " + std::to_string(out_h) +
                                "x" + std::to_string(out_w) + " but resize is off");
    const int64_t slot = slots[i];
    if (slot < 0 || slot >= batch)
      throw sample_error(i, "slot " + std::to_string(slot) + " is outside the batch of " + std::to_string(batch));
    if (owner[slot] >= 0)
      throw sample_error(i, "slot " + std::to_string(slot) + " is also sample " + std::to_string(owner[slot]) + "'s");
    owner[slot] = static_cast<int64_t>(i);
    extents[i] = ByteSpan{reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(im.address)),
                          static_cast<size_t>(static_cast<size_t>(im.pitch) * static_cast<size_t>(im.height - 1) +
                                              im.width * channels)};

    // The region the CPU core decodes (plan_decode, DCT scaling off), the box within it, the pass order.
    const int64_t top = static_cast<int64_t>(b.top), left = static_cast<int64_t>(b.left);
    int64_t x0 = left, y0 = top, x1 = left + static_cast<int64_t>(b.width), y1 = top + static_cast<int64_t>(b.height);
    bool horizontal_first;
    if (resize && window) {
      const int mx = Resampler::window_margin(b.width, static_cast<int>(out_w));
      const int my = Resampler::window_margin(b.height, static_cast<int>(out_h));
      x0 = std::max<int64_t>(0, x0 - mx);
      y0 = std::max<int64_t>(0, y0 - my);
      x1 = std::min<int64_t>(im.width, x1 + mx);
      y1 = std::min<int64_t>(im.height, y1 + my);
      horizontal_first = Resampler::window_horizontal_first(im.height, im.width, b.height, b.width,
                                                            static_cast<int>(out_h), static_cast<int>(out_w));
    } else {
      horizontal_first = Resampler::pillow_horizontal_first(static_cast<double>(y1 - y0), static_cast<double>(x1 - x0),
                                                            static_cast<double>(out_h), static_cast<double>(out_w));
    }
    CropResizeSample& s = plan.samples[i];
    s.src = im.address + static_cast<uint64_t>(y0 * im.pitch + x0 * channels);
    s.src_pitch = im.pitch;
    s.region_h = static_cast<int32_t>(y1 - y0);
    s.region_w = static_cast<int32_t>(x1 - x0);
    s.bx0 = b.left - static_cast<double>(x0);
    s.by0 = b.top - static_cast<double>(y0);
    s.bx1 = b.left + b.width - static_cast<double>(x0);
    s.by1 = b.top + b.height - static_cast<double>(y0);
    s.slot = static_cast<int32_t>(slot);
    s.h_ksize = horizontal_axis(s, out_w).ksize;
    s.v_ksize = vertical_axis(s, out_h).ksize;
    const bool copy = !resize || Resampler::is_copy(s.region_h, s.region_w, s.bx0, s.by0, s.bx1, s.by1, out_h, out_w);
    plan_passes(&s, copy, horizontal_first, out_h, out_w, channels);
    s.coeff_offset = static_cast<int64_t>(offset);
    offset = align16(offset + 4 * (static_cast<uint64_t>(out_w) * (2 + s.h_ksize) +
                                   static_cast<uint64_t>(out_h) * (2 + s.v_ksize)));
    s.temp_offset = static_cast<int64_t>(offset);
    offset = align16(offset + static_cast<uint64_t>(s.temp_rows) * static_cast<uint64_t>(s.temp_row_bytes));
  }
  plan.out = checked_output(out_address, needed, out_nbytes, extents);
  plan.scratch_bytes = n ? offset : 0;
  return plan;
}

void crop_resize_host(const CropResizePlan& plan, int num_threads) {
  if (num_threads < 0 || num_threads > kMaxThreads)
    throw InvalidArgument("num_threads must be within 1.." + std::to_string(kMaxThreads) + " (0: default), got " +
                          std::to_string(num_threads));
  if (num_threads == 0) num_threads = default_num_threads();
  const size_t n = plan.samples.size();
  if (n == 0) return;
  std::unique_ptr<uint8_t[]> scratch(new uint8_t[plan.scratch_bytes]);  // 16-byte aligned, as cudaMalloc's
  CropResizeArgs a;
  a.samples = plan.samples.data();
  a.n = static_cast<int64_t>(n);
  a.out = plan.out;
  a.out_h = plan.out_h;
  a.out_w = plan.out_w;
  a.channels = plan.channels;
  a.scratch = scratch.get();
  const auto& s = plan.samples;
  for_each_sample_row(
      n, num_threads, [&](size_t) { return a.out_w + a.out_h; },
      [&](size_t i, int64_t j) { coeff_entry(a, s[i], j); });
  for (const bool second : {false, true}) {
    std::vector<PassView> views(n);
    for (size_t i = 0; i < n; ++i) views[i] = pass_view(a, s[i], second);
    for_each_sample_row(
        n, num_threads, [&](size_t i) { return views[i].rows; },
        [&](size_t i, int64_t r) {
          const PassView& v = views[i];
          uint8_t* row = v.out + r * v.out_stride;
          for (int32_t b = 0; b < v.row_bytes; ++b) row[b] = pass_value(v, static_cast<int32_t>(r), b);
        });
  }
}

}  // namespace gpupipe
