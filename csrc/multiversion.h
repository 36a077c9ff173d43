// GPUPIPE_MULTIVERSION: compile a hot function twice (AVX2 and baseline x86-64) and pick at load
// time, so one wheel runs on every x86-64 CPU and still gets 8-lane math where the CPU has it.
// Functions marked with it must give the same results on both paths: no FMA contraction is
// enabled by "avx2" alone (FMA is a separate target), so float rounding does not depend on the CPU.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GPUPIPE_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define GPUPIPE_MULTIVERSION
#endif
