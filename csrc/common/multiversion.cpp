#include "common/multiversion.h"

#include <algorithm>
#include <atomic>

#include "common/errors.h"

#if GPUPIPE_X86_LEVELS
#include <cpuid.h>
#endif

namespace gpupipe {
namespace {

CpuLevel detect() {
#if GPUPIPE_X86_LEVELS
  __builtin_cpu_init();
  // Everything GPUPIPE_TARGET_AVX2 lets the compiler use (gcc emits shlx/shrx from BMI2): a VM's CPU
  // model may offer AVX2 + FMA without the rest. F16C and LZCNT from CPUID: clang's
  // __builtin_cpu_supports knows neither name.
  unsigned a, b, c, d;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
  const bool lzcnt = __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c >> 5 & 1);
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
        __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt") && f16c && lzcnt))
    return CpuLevel::kBaseline;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd")))
    return CpuLevel::kAvx2;
  return __builtin_cpu_supports("avx512vbmi") ? CpuLevel::kAvx512Vbmi : CpuLevel::kAvx512;
#else
  return CpuLevel::kBaseline;
#endif
}

std::atomic<int>& level_in_force() {
  static std::atomic<int> level{static_cast<int>(cpu_level_supported())};
  return level;
}

}  // namespace

const char* cpu_level_name(CpuLevel level) {
  switch (level) {
    case CpuLevel::kAvx2: return "avx2";
    case CpuLevel::kAvx512: return "avx512";
    case CpuLevel::kAvx512Vbmi: return "avx512_vbmi";
    default: return "default";
  }
}

CpuLevel cpu_level_supported() {
  static const CpuLevel supported = detect();
  return supported;
}

CpuLevel cpu_level() { return static_cast<CpuLevel>(level_in_force().load(std::memory_order_relaxed)); }

CpuLevel set_cpu_level(CpuLevel cap) {
  const int level = std::min(static_cast<int>(cap), static_cast<int>(cpu_level_supported()));
  level_in_force().store(level, std::memory_order_relaxed);
  return static_cast<CpuLevel>(level);
}

CpuLevel cpu_level_named(const std::string& name) {
  for (int l = 0; l < kCpuLevels; ++l)
    if (name == cpu_level_name(static_cast<CpuLevel>(l))) return static_cast<CpuLevel>(l);
  throw InvalidArgument("unknown CPU capability '" + name + "': expected default, avx2, avx512 or avx512_vbmi");
}

CpuLevel dispatch_level() {
  return dispatch([](auto isa) { return decltype(isa)::level; });
}

}  // namespace gpupipe
