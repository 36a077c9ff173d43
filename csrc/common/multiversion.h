// The CPU kernels at every x86-64 width, picked at run time: one wheel runs on any x86-64 CPU and
// still uses AVX2 or AVX-512 where the CPU has them, as torch does.
//
//   dispatch([&](auto isa) { ...rows... });
//
// runs the lambda built for the level in force (cpu_level()): each level's trampoline has the
// level's target attribute and `flatten`, so the lambda and every call inside it are inlined there
// and their loops vectorised at that width. `isa` is a tag type (isa::Baseline ... isa::Avx512Vbmi):
// code that needs explicit intrinsics (simd_avx512.h) picks them with `if constexpr`.
//
// Every level gives the same bits: the kernels' sources are built with -ffp-contract=off
// (CMakeLists.txt), so enabling FMA or wider vectors changes no rounding; float reductions are never
// reordered (no -ffast-math); explicit fused multiply-adds (policy_ops.h) are exact either way.
// GPUPIPE_CPU_CAPABILITY (or gpupipe.set_cpu_capability) lowers the level, like torch's
// ATEN_CPU_CAPABILITY, so that tests compare every path on the CPU that runs them.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

namespace gpupipe {

enum class CpuLevel : int {
  kBaseline = 0,    // x86-64 (SSE2), or any other architecture
  kAvx2 = 1,        // AVX2 + FMA (Haswell, Zen)
  kAvx512 = 2,      // AVX-512 F, BW, VL, DQ, CD (Skylake-SP)
  kAvx512Vbmi = 3,  // and VBMI: byte permutes over 128-byte tables (Ice Lake, Zen 4)
};
constexpr int kCpuLevels = 4;

const char* cpu_level_name(CpuLevel level);  // "default", "avx2", "avx512", "avx512_vbmi"
CpuLevel cpu_level_supported();              // the widest level this CPU runs
CpuLevel cpu_level();                        // the level the kernels use now
// Caps the level the kernels use (never above the CPU's) and returns the level in force.
CpuLevel set_cpu_level(CpuLevel cap);
// The level of a cpu_level_name(); InvalidArgument for any other name.
CpuLevel cpu_level_named(const std::string& name);
// The level a dispatched kernel is built for now (tests: the wider paths do run).
CpuLevel dispatch_level();

namespace isa {
struct Baseline {
  static constexpr CpuLevel level = CpuLevel::kBaseline;
  static constexpr bool fma = false;  // a hardware fused multiply-add instruction
};
struct Avx2 {
  static constexpr CpuLevel level = CpuLevel::kAvx2;
  static constexpr bool fma = true;
};
struct Avx512 {
  static constexpr CpuLevel level = CpuLevel::kAvx512;
  static constexpr bool fma = true;
};
struct Avx512Vbmi {
  static constexpr CpuLevel level = CpuLevel::kAvx512Vbmi;
  static constexpr bool fma = true;
};
template <typename Isa>
constexpr bool at_least(CpuLevel l) {
  return static_cast<int>(Isa::level) >= static_cast<int>(l);
}
}  // namespace isa

#if defined(__x86_64__) && defined(__GNUC__)  // gcc, and clang (the fuzz build)
#define GPUPIPE_X86_LEVELS 1
#if defined(__clang__)
#define GPUPIPE_PREFER_512  // clang takes no vector width in a target attribute
#else
#define GPUPIPE_PREFER_512 ",prefer-vector-width=512"  // gcc's generic tuning would stay at 256 bits
#endif
#define GPUPIPE_TARGET_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,lzcnt,popcnt,f16c")))
#define GPUPIPE_TARGET_AVX512                                                                        \
  __attribute__((target("avx2,fma,bmi,bmi2,lzcnt,popcnt,f16c,avx512f,avx512bw,avx512vl,avx512dq," \
                        "avx512cd" GPUPIPE_PREFER_512)))
#define GPUPIPE_TARGET_AVX512_VBMI                                                                   \
  __attribute__((target("avx2,fma,bmi,bmi2,lzcnt,popcnt,f16c,avx512f,avx512bw,avx512vl,avx512dq," \
                        "avx512cd,avx512vbmi" GPUPIPE_PREFER_512)))

namespace detail {
template <typename Fn>
__attribute__((flatten)) decltype(auto) run_baseline(Fn& fn) {
  return fn(isa::Baseline{});
}
template <typename Fn>
GPUPIPE_TARGET_AVX2 __attribute__((flatten)) decltype(auto) run_avx2(Fn& fn) {
  return fn(isa::Avx2{});
}
template <typename Fn>
GPUPIPE_TARGET_AVX512 __attribute__((flatten)) decltype(auto) run_avx512(Fn& fn) {
  return fn(isa::Avx512{});
}
template <typename Fn>
GPUPIPE_TARGET_AVX512_VBMI __attribute__((flatten)) decltype(auto) run_avx512_vbmi(Fn& fn) {
  return fn(isa::Avx512Vbmi{});
}
}  // namespace detail

// fn(isa tag), built for the level in force. Dispatch per row or per sample, not per pixel: the
// level is one relaxed atomic load.
template <typename Fn>
decltype(auto) dispatch(Fn&& fn) {
  switch (cpu_level()) {
    case CpuLevel::kAvx512Vbmi: return detail::run_avx512_vbmi(fn);
    case CpuLevel::kAvx512: return detail::run_avx512(fn);
    case CpuLevel::kAvx2: return detail::run_avx2(fn);
    default: return detail::run_baseline(fn);
  }
}
#else
#define GPUPIPE_X86_LEVELS 0
template <typename Fn>
decltype(auto) dispatch(Fn&& fn) {
  return fn(isa::Baseline{});
}
#endif

}  // namespace gpupipe
