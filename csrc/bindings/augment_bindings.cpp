// gpupipe._C's augmentation host kernels: BatchAugment's parameter packing and engine, warp_affine,
// RandomErasing and MixUp. Tensors arrive as buffer descriptions (gpupipe.augment._kernels.buffer),
// validated by the core (augment/augment_args.h, augment/erase_cpu.h, augment/mix_cpu.h) before the
// GIL is released; parameters as numpy rows (augment/augment_params.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "augment/augment_args.h"
#include "augment/augment_cpu.h"
#include "augment/augment_params.h"
#include "augment/erase_cpu.h"
#include "augment/mix_cpu.h"
#include "bindings/bindings.h"
#include "bindings/released_gil.h"
#include "common/elem_type.h"

namespace py = pybind11;

namespace gpupipe {
namespace {

// Parameter rows of exactly `count` elements, C order: float64 ones converted from any number type,
// flags (bool) and op indices (int64) only from types that cast safely (a float is not a flag).
template <typename T>
using Rows = py::array_t<T, py::array::c_style | py::array::forcecast>;
template <typename T>
using SafeRows = py::array_t<T, py::array::c_style>;

template <typename Array>
auto rows_of(const Array& a, int64_t count, const char* name) {
  if (a.size() != count) throw InvalidArgument(std::string(name) + " must have " + std::to_string(count) + " values");
  return a.data();
}

void register_augment_params(py::module_& m) {
  py::dict columns;  // BatchAugment's draw columns (augment_params.h, namespace draw)
  for (const auto& [name, column] : {std::pair{"hflip", draw::kHflip}, {"vflip", draw::kVflip}, {"angle", draw::kAngle},
                                     {"translate", draw::kTranslate}, {"scale", draw::kScale}, {"shear", draw::kShear},
                                     {"brightness", draw::kBrightness}, {"contrast", draw::kContrast},
                                     {"saturation", draw::kSaturation}, {"hue", draw::kHue}, {"order", draw::kOrder},
                                     {"grayscale", draw::kGrayscale}})
    columns[name] = column;
  m.attr("AUGMENT_DRAW_COLUMNS") = columns;
  m.attr("AUGMENT_DRAWS") = draw::kCount;
  m.def(
      "augment_params_from_uniforms",
      [](Rows<double> u, double hflip, double vflip, double grayscale, std::array<double, 2> rotation,
         std::array<double, 2> translate, std::array<double, 2> scale, std::array<double, 4> shear,
         std::array<double, 2> brightness, std::array<double, 2> contrast, std::array<double, 2> saturation,
         std::array<double, 2> hue) {
        if (u.ndim() != 2 || u.shape(1) != draw::kCount)
          throw InvalidArgument("u must be float64 [N, " + std::to_string(draw::kCount) + "] draws");
        const int64_t n = u.shape(0);
        AugmentRanges r;
        r.hflip = hflip, r.vflip = vflip, r.grayscale = grayscale;
        std::copy(rotation.begin(), rotation.end(), r.rotation);
        std::copy(translate.begin(), translate.end(), r.translate);
        std::copy(scale.begin(), scale.end(), r.scale);
        std::copy(shear.begin(), shear.end(), r.shear);
        std::copy(brightness.begin(), brightness.end(), r.brightness);
        std::copy(contrast.begin(), contrast.end(), r.contrast);
        std::copy(saturation.begin(), saturation.end(), r.saturation);
        std::copy(hue.begin(), hue.end(), r.hue);
        py::array_t<double> floats(kDrawnFloats * n);
        py::array_t<bool> flags(kDrawnFlags * n);
        py::array_t<int64_t> order({n, int64_t{4}});
        const AugmentParamsOut out = drawn_params_out(n, floats.mutable_data(), flags.mutable_data(), order.mutable_data());
        augment_params_from_uniforms(n, u.data(), r, out);
        // views of the blocks (their base), in PARAM_KEYS order
        const std::vector<py::ssize_t> rows{n}, pairs{n, 2};
        const auto f = [&](const double* p, const std::vector<py::ssize_t>& shape) {
          return py::array_t<double>(shape, p, floats);
        };
        const auto b = [&](const bool* p) { return py::array_t<bool>(rows, p, flags); };
        return py::make_tuple(b(out.hflip), b(out.vflip), f(out.angle, rows), f(out.translate, pairs),
                              f(out.scale, rows), f(out.shear, pairs), f(out.brightness, rows),
                              f(out.contrast, rows), f(out.saturation, rows), f(out.hue, rows), order,
                              b(out.grayscale));
      },
      py::arg("u"), py::arg("hflip"), py::arg("vflip"), py::arg("grayscale"), py::arg("rotation"), py::arg("translate"),
      py::arg("scale"), py::arg("shear"), py::arg("brightness"), py::arg("contrast"), py::arg("saturation"),
      py::arg("hue"),
      "BatchAugment's parameters (PARAM_KEYS order) from its uniform draws u (float64 [N, AUGMENT_DRAWS]) and "
      "its ranges: BatchAugment._params_from's numpy definition, equal bit for bit. The float and flag "
      "parameters are views of two blocks (their base), which pack_drawn_augment_params reads with order.");
  m.def(
      "inverse_affine",
      [](Rows<double> angle, Rows<double> translate, Rows<double> scale, Rows<double> shear, Rows<double> center,
         SafeRows<bool> hflip, SafeRows<bool> vflip, int64_t height, int64_t width) {
        const int64_t n = angle.size();
        AffineParams p{angle.data(), rows_of(translate, 2 * n, "translate"), rows_of(scale, n, "scale"),
                       rows_of(shear, 2 * n, "shear"), rows_of(center, 2 * n, "center"),
                       rows_of(hflip, n, "hflip"), rows_of(vflip, n, "vflip")};
        py::array_t<double> out({n, int64_t{2}, int64_t{3}});
        inverse_affine(n, p, height, width, out.mutable_data());
        return out;
      },
      py::arg("angle"), py::arg("translate"), py::arg("scale"), py::arg("shear"), py::arg("center"), py::arg("hflip"),
      py::arg("vflip"), py::arg("height"), py::arg("width"),
      "float64 [N, 2, 3] inverse maps of torchvision's affine, followed by the flips (augment_params.h).");
  m.def(
      "pack_augment_params",
      [](SafeRows<bool> hflip, SafeRows<bool> vflip, Rows<double> angle, Rows<double> translate, Rows<double> scale,
         Rows<double> shear, Rows<double> brightness, Rows<double> contrast, Rows<double> saturation, Rows<double> hue,
         SafeRows<int64_t> order, SafeRows<bool> grayscale, int64_t height, int64_t width) {
        const int64_t n = angle.size();
        AugmentParams p{rows_of(hflip, n, "hflip"),           rows_of(vflip, n, "vflip"),
                        angle.data(),                         rows_of(translate, 2 * n, "translate"),
                        rows_of(scale, n, "scale"),           rows_of(shear, 2 * n, "shear"),
                        rows_of(brightness, n, "brightness"), rows_of(contrast, n, "contrast"),
                        rows_of(saturation, n, "saturation"), rows_of(hue, n, "hue"),
                        rows_of(order, 4 * n, "order"),       rows_of(grayscale, n, "grayscale")};
        py::array_t<float> out({n, int64_t{param::kCount}});
        pack_augment_params(n, p, height, width, out.mutable_data());
        return out;
      },
      py::arg("hflip"), py::arg("vflip"), py::arg("angle"), py::arg("translate"), py::arg("scale"), py::arg("shear"),
      py::arg("brightness"), py::arg("contrast"), py::arg("saturation"), py::arg("hue"), py::arg("order"),
      py::arg("grayscale"), py::arg("height"), py::arg("width"),
      "BatchAugment's float32 [N, 24] engine rows (color='torchvision') from its parameters, values checked "
      "(ValueError naming the first that cannot apply).");
  m.def(
      "pack_drawn_augment_params",
      [](SafeRows<double> floats, SafeRows<bool> flags, SafeRows<int64_t> order, int64_t height, int64_t width) {
        const int64_t n = order.size() / 4;
        AugmentParams p = drawn_params(n, rows_of(floats, kDrawnFloats * n, "floats"),
                                       rows_of(flags, kDrawnFlags * n, "flags"), rows_of(order, 4 * n, "order"));
        py::array_t<float> out({n, int64_t{param::kCount}});
        pack_augment_params(n, p, height, width, out.mutable_data());
        return out;
      },
      py::arg("floats"), py::arg("flags"), py::arg("order"), py::arg("height"), py::arg("width"),
      "pack_augment_params from the blocks augment_params_from_uniforms' parameters are views of (the float "
      "parameters' base, the flags' base, order), in one call: values checked as there.");
}

}  // namespace

void register_augment(py::module_& m) {
  register_augment_params(m);
  py::dict types;
  for (int t = kUInt8; t <= kInt64; ++t) types[elem_name(t)] = t;
  m.attr("ELEM_TYPES") = types;
  py::dict layout;  // the one layout of the engine's per-sample parameter rows (augment_kernels.h)
  for (const param::Field& f : param::kFields) layout[f.name] = py::make_tuple(f.first, f.width);
  m.attr("PARAM_LAYOUT") = layout;
  m.attr("PARAM_COUNT") = param::kCount;
  py::dict interpolations, colors;  // the codes the kernels take (augment_pixel.h, augment_kernels.h)
  interpolations["nearest"] = int{pixel::kNearest};
  interpolations["bilinear"] = int{pixel::kBilinear};
  colors["torchvision"] = int{kColorTorchvision};
  colors["linear"] = int{kColorLinear};
  m.attr("INTERPOLATIONS") = interpolations;
  m.attr("COLOR_MODELS") = colors;
  m.def(
      "warp_affine",
      [](std::vector<int64_t> input, std::vector<int64_t> matrices, std::vector<int64_t> output,
         int out_type, int interpolation, std::optional<std::vector<double>> fill, int num_threads) {
        const WarpArgs a = warp_args(input, matrices, output, out_type, interpolation, fill);
        ReleasedGil released;
        warp_affine_cpu(a, num_threads);
      },
      py::arg("input"), py::arg("matrices"), py::arg("output"), py::arg("out_type"),
      py::arg("interpolation"), py::arg("fill"), py::arg("num_threads"),
      "Host kernel of gpupipe.augment.warp_affine. Buffers are [address, extent, type, ndim, "
      "shape..., strides...] lists (gpupipe.augment._kernels.buffer).");
  m.def(
      "augment",
      [](std::vector<int64_t> input, std::vector<int64_t> params, std::vector<int64_t> output, int out_type,
         int interpolation, std::optional<std::vector<double>> fill, int color, std::vector<double> mean,
         std::vector<double> std_dev, int num_threads) {
        const AugmentArgs a =
            augment_args(input, params, output, out_type, interpolation, fill, color, mean, std_dev, std::nullopt);
        ReleasedGil released;
        augment_cpu(a, num_threads);
      },
      py::arg("input"), py::arg("params"), py::arg("output"), py::arg("out_type"), py::arg("interpolation"),
      py::arg("fill"), py::arg("color"), py::arg("mean"), py::arg("std"), py::arg("num_threads"),
      "Host kernel of BatchAugment's engine (gpupipe.augment.fused).");
  m.def(
      "erase_boxes",
      [](std::vector<int64_t> images, std::vector<int64_t> boxes, std::vector<int64_t> values, int num_threads) {
        const EraseArgs a = erase_args(images, boxes, values);
        ReleasedGil released;
        erase_boxes_cpu(a, num_threads);
      },
      py::arg("x"), py::arg("boxes"), py::arg("values"), py::arg("num_threads"),
      "RandomErasing's host kernel: sets each box (top, left, height, width; height 0: none) of x, in "
      "place, to values (one element of x's type per channel).");
  m.def(
      "mixup_rolled",
      [](std::vector<int64_t> images, std::vector<int64_t> output, double lam, int num_threads) {
        const MixArgs a = mixup_args(images, &output, lam);
        ReleasedGil released;
        mixup_rolled_cpu(a.images, a.out, a.n, a.per_sample, a.lam, num_threads);
      },
      py::arg("images"), py::arg("out"), py::arg("lam"), py::arg("num_threads"),
      "MixUp's host kernel: out[i] = images[i - 1] * (1 - lam) + images[i] * lam (i - 1 mod N) for a "
      "contiguous float32 [N, C, H, W] batch, rounded as torchvision's expression.");
  m.def(
      "mixup_rolled_inplace",
      [](std::vector<int64_t> images, double lam, int num_threads) {
        const MixArgs a = mixup_args(images, nullptr, lam);
        ReleasedGil released;
        mixup_rolled_inplace_cpu(a.images, a.n, a.per_sample, a.lam, num_threads);
      },
      py::arg("images"), py::arg("lam"), py::arg("num_threads"),
      "mixup_rolled written over images (MixUp(inplace=True)): the same values.");
}

}  // namespace gpupipe
