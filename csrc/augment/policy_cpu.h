// Host kernels of the augmentation policies: one op slot of a batch, each sample with its own op
// (policy_ops.h's Kind) and parameter, uint8 [N, 3, H, W] in, uint8 out, any strides.
#pragma once

#include "augment/policy_kernels.h"

namespace gpupipe {

// Two passes on the process's pool (inline when num_threads <= 1): per sample, the statistics its op
// needs (channel histograms, gray sum) and its lookup table; then every output row.
void policy_apply_cpu(const PolicyArgs& args, int num_threads);

}  // namespace gpupipe
