// Element types of the tensors the augmentation kernels read and write, defined once here and
// exported to Python (gpupipe._C.ELEM_TYPES), which maps torch dtypes onto them.
#pragma once

#include <stdint.h>

namespace gpupipe {

enum ElemType : int { kUInt8 = 0, kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3, kFloat64 = 4, kInt64 = 5 };

inline int64_t elem_size(int type) {
  switch (type) {
    case kUInt8: return 1;
    case kFloat32: return 4;
    case kBFloat16:
    case kFloat16: return 2;
    case kFloat64:
    case kInt64: return 8;
    default: return 0;
  }
}

inline const char* elem_name(int type) {
  static const char* names[] = {"uint8", "float32", "bfloat16", "float16", "float64", "int64"};
  return type >= 0 && type <= kInt64 ? names[type] : "unknown";
}

}  // namespace gpupipe
