#include "augment/augment_params.h"

#include <cmath>
#include <string>
#include <vector>

#include "augment/augment_kernels.h"
#include "common/errors.h"

namespace gpupipe {

void augment_params_from_uniforms(int64_t n, const double* u, const AugmentRanges& r, const AugmentParamsOut& out) {
  const auto between = [](const double* lo_hi, double v) { return lo_hi[0] + (lo_hi[1] - lo_hi[0]) * v; };
  for (int64_t i = 0; i < n; ++i) {
    const double* d = u + i * draw::kCount;
    out.hflip[i] = d[draw::kHflip] < r.hflip;
    out.vflip[i] = d[draw::kVflip] < r.vflip;
    out.angle[i] = between(r.rotation, d[draw::kAngle]);
    for (int k = 0; k < 2; ++k) out.translate[2 * i + k] = (2 * d[draw::kTranslate + k] - 1) * r.translate[k];
    out.scale[i] = between(r.scale, d[draw::kScale]);
    out.shear[2 * i] = between(r.shear, d[draw::kShear]);
    out.shear[2 * i + 1] = between(r.shear + 2, d[draw::kShear + 1]);
    out.brightness[i] = between(r.brightness, d[draw::kBrightness]);
    out.contrast[i] = between(r.contrast, d[draw::kContrast]);
    out.saturation[i] = between(r.saturation, d[draw::kSaturation]);
    out.hue[i] = between(r.hue, d[draw::kHue]);
    // a stable argsort of the 4 draws (insertion sort: equal draws keep their order)
    int64_t* order = out.order + 4 * i;
    const double* rank = d + draw::kOrder;
    for (int64_t k = 0; k < 4; ++k) {
      int64_t j = k;
      for (; j > 0 && rank[order[j - 1]] > rank[k]; --j) order[j] = order[j - 1];
      order[j] = k;
    }
    out.grayscale[i] = d[draw::kGrayscale] < r.grayscale;
  }
}

AugmentParamsOut drawn_params_out(int64_t n, double* floats, bool* flags, int64_t* order) {
  double* f = floats;
  return AugmentParamsOut{flags,     flags + n, f,         f + n,     f + 3 * n, f + 4 * n,
                          f + 6 * n, f + 7 * n, f + 8 * n, f + 9 * n, order,     flags + 2 * n};
}

AugmentParams drawn_params(int64_t n, const double* floats, const bool* flags, const int64_t* order) {
  const double* f = floats;
  return AugmentParams{flags,     flags + n, f,         f + n,     f + 3 * n, f + 4 * n,
                       f + 6 * n, f + 7 * n, f + 8 * n, f + 9 * n, order,     flags + 2 * n};
}

void inverse_affine(int64_t n, const AffineParams& p, int64_t height, int64_t width, double* out) {
  constexpr double kRadians = M_PI / 180;
  for (int64_t i = 0; i < n; ++i) {
    const double rot = p.angle[i] * kRadians, sx = p.shear[2 * i] * kRadians, sy = p.shear[2 * i + 1] * kRadians;
    // sincos gives sin's and cos's values; without shear (the common case) one call does it all:
    // cos(0) = 1 and tan(+-0) = +-0 exactly, and rot - 0 is rot.
    double sin_rot, cos_rot;
    sincos(rot, &sin_rot, &cos_rot);
    double sin_rot_sy = sin_rot, cos_rot_sy = cos_rot;
    if (sy != 0) sincos(rot - sy, &sin_rot_sy, &cos_rot_sy);
    const double cos_sy = sy != 0 ? std::cos(sy) : 1.0, tan_sx = sx != 0 ? std::tan(sx) : sx;
    const double a = cos_rot_sy / cos_sy;
    const double b = -(a * tan_sx + sin_rot);
    const double c = sin_rot_sy / cos_sy;
    const double d = cos_rot - c * tan_sx;
    const double s = p.scale[i];
    const double m00 = d / s, m01 = -b / s, m10 = -c / s, m11 = a / s;  // torchvision's inverse, scaled
    const double cx = p.center[2 * i] - 0.5, cy = p.center[2 * i + 1] - 0.5;  // the centre's index coordinates
    double ox = -cx - p.translate[2 * i], oy = -cy - p.translate[2 * i + 1];
    const bool hf = p.hflip[i], vf = p.vflip[i];  // flips after the affine: x -> W - 1 - x, y -> H - 1 - y
    ox += hf ? static_cast<double>(width) - 1.0 : 0.0;
    oy += vf ? static_cast<double>(height) - 1.0 : 0.0;
    const double sign_x = hf ? -1.0 : 1.0, sign_y = vf ? -1.0 : 1.0;
    double* row = out + 6 * i;
    row[0] = m00 * sign_x;
    row[1] = m01 * sign_y;
    row[2] = m00 * ox + m01 * oy + cx;
    row[3] = m10 * sign_x;
    row[4] = m11 * sign_y;
    row[5] = m10 * ox + m11 * oy + cy;
  }
}

namespace {

void require(bool ok, const char* message) {
  if (!ok) throw InvalidArgument(message);
}

void require(bool ok, const char* name, const char* what) {  // the message built only on failure
  if (!ok) throw InvalidArgument("params['" + std::string(name) + "'] " + what);
}

bool all_finite(const double* v, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(v[i])) return false;
  return true;
}

bool all_at_least_zero(const double* v, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (!(v[i] >= 0)) return false;
  return true;
}

}  // namespace

void check_augment_params(int64_t n, const AugmentParams& p) {
  const struct { const char* name; const double* v; int64_t width; } floats[] = {
      {"angle", p.angle, 1},           {"translate", p.translate, 2},   {"shear", p.shear, 2},
      {"scale", p.scale, 1},           {"brightness", p.brightness, 1}, {"contrast", p.contrast, 1},
      {"saturation", p.saturation, 1}, {"hue", p.hue, 1}};
  for (const auto& f : floats) require(all_finite(f.v, n * f.width), f.name, "must be finite");
  for (const auto* f : {&floats[4], &floats[5], &floats[6]}) require(all_at_least_zero(f->v, n), f->name, "must be >= 0");
  for (int64_t i = 0; i < n; ++i) require(std::abs(p.hue[i]) <= 0.5, "params['hue'] must be within [-0.5, 0.5]");
  for (int64_t i = 0; i < n; ++i) require(p.scale[i] > 0, "params['scale'] must be > 0");
  for (int64_t i = 0; i < 2 * n; ++i)
    require(std::abs(p.shear[i]) < 90, "params['shear'] must be within (-90, 90) degrees");
  for (int64_t i = 0; i < n; ++i) {
    unsigned seen = 0;
    for (int k = 0; k < 4; ++k) {
      const int64_t op = p.order[4 * i + k];
      if (op >= 0 && op < 4) seen |= 1u << op;
    }
    require(seen == 0xF, "params['order'] rows must be permutations of 0, 1, 2, 3");
  }
}

void pack_augment_params(int64_t n, const AugmentParams& p, int64_t height, int64_t width, float* out) {
  check_augment_params(n, p);
  std::vector<double> angle(n), shift(2 * n), center(2 * n), matrix(6 * n);
  for (int64_t i = 0; i < n; ++i) {
    angle[i] = -p.angle[i];  // BatchAugment's counter-clockwise degrees -> torchvision affine's
    shift[2 * i] = std::nearbyint(p.translate[2 * i] * static_cast<double>(width));  // half to even, as torch.round
    shift[2 * i + 1] = std::nearbyint(p.translate[2 * i + 1] * static_cast<double>(height));
    center[2 * i] = static_cast<double>(width) / 2;
    center[2 * i + 1] = static_cast<double>(height) / 2;
  }
  AffineParams affine{angle.data(), shift.data(), p.scale, p.shear, center.data(), p.hflip, p.vflip};
  inverse_affine(n, affine, height, width, matrix.data());
  for (int64_t i = 0; i < n; ++i) {
    float* row = out + i * param::kCount;
    for (int k = 0; k < param::kCount; ++k) row[k] = 0.0f;
    for (int k = 0; k < 6; ++k) row[param::kMatrix + k] = static_cast<float>(matrix[6 * i + k]);
    const double factors[4] = {p.brightness[i], p.contrast[i], p.saturation[i], p.hue[i]};
    for (int k = 0; k < 4; ++k) row[param::kFactors + k] = static_cast<float>(factors[k]);
    for (int k = 0; k < 4; ++k) row[param::kOrder + k] = static_cast<float>(p.order[4 * i + k]);
    row[param::kGrayscale] = p.grayscale[i] ? 1.0f : 0.0f;
  }
}

}  // namespace gpupipe
