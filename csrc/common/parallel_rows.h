// One parallel loop over the rows of a batch, cut into a few chunks per thread.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "common/thread_pool.h"

namespace gpupipe {

// Runs fn(begin, end) over [0, rows) in chunks: inline for one thread or few rows, else one
// parallel_for on the pool of num_threads.
template <typename Fn>
void parallel_rows(int64_t rows, int num_threads, Fn&& fn) {
  if (rows <= 0) return;
  if (num_threads <= 1 || rows < 16) {
    fn(int64_t{0}, rows);
    return;
  }
  const int64_t chunks = std::min<int64_t>(rows, 8LL * num_threads);
  get_pool(num_threads)->parallel_for(static_cast<size_t>(chunks), [&](size_t c) {
    fn(rows * static_cast<int64_t>(c) / chunks, rows * static_cast<int64_t>(c + 1) / chunks);
  });
}

}  // namespace gpupipe
