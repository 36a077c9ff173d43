// A persistent pool of worker threads that runs parallel loops. Several callers may submit loops
// at once; each loop's indices are shared out through an atomic counter.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace gpupipe {

class ThreadPool {
 public:
  // Starts num_threads (1..kMaxThreads) workers. Throws InvalidArgument for a bad count and
  // InternalError when the system refuses a thread (the ones already started are joined first).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();  // finishes queued loops, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  // Runs fn(i) for every i in [0, n) on the pool's threads and returns when all are done. If fn
  // throws, the remaining indices are skipped and the first exception is rethrown here (a worker
  // thread never dies of it, and std::terminate is never reached).
  void parallel_for(size_t n, const std::function<void(size_t)>& fn);

 private:
  struct Loop;
  void worker_main();
  void stop_and_join();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Loop>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// The most threads one pool may have (the same bound as GPUPIPE_NUM_THREADS).
constexpr int kMaxThreads = 1024;

// Threads to use when the caller gives none: GPUPIPE_NUM_THREADS, else the CPU affinity count.
int default_num_threads();

// What a pool runs: file reads (waits on I/O) get pools of their own, so that they never queue
// behind a decode loop on a pool of the same size, nor hold up one.
enum class PoolUse : int { kCompute, kIo };

// The process's pool of `num_threads` workers (0: default_num_threads()) for `use`, created
// lazily, one per (use, size) asked for (the four most recently used are kept: decode, reads,
// augmentation and one more), and created anew in a forked child, whose copy of the parent's has
// no threads (a pthread_atfork handler keeps the registry's lock consistent across fork). Throws
// InvalidArgument when num_threads is outside 0..kMaxThreads.
std::shared_ptr<ThreadPool> get_pool(int num_threads, PoolUse use = PoolUse::kCompute);

// Worker threads alive in this process's pools (0 when none was created).
int pool_threads();

// Drops the process's pools; their threads exit once in-flight loops finish.
void shutdown_pool();

}  // namespace gpupipe
