// A persistent pool of worker threads that runs parallel loops. Several callers may submit loops
// at once; each loop's indices are shared out through an atomic counter.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
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
  // The threads are named `name` (at most 15 characters shown: top -H, py-spy, /proc/self/task).
  explicit ThreadPool(int num_threads, const char* name = "gpupipe-pool");
  ~ThreadPool();  // finishes queued loops, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  // Runs fn(i) for every i in [0, n) on the pool's threads and returns when all are done. If fn
  // throws, the remaining indices are skipped and the first exception is rethrown here (a worker
  // thread never dies of it, and std::terminate is never reached).
  void parallel_for(size_t n, const std::function<void(size_t)>& fn);

  // The same loop, started: returns at once. The workers take loops in the order they were started,
  // a worker done with one loop's indices going on to the next, so a caller that starts the next
  // batch before waiting for this one keeps every thread busy across the boundary. The loop owns fn;
  // `done` (if any) runs on the worker that finishes the loop, after every index.
  struct Loop;
  std::shared_ptr<Loop> start(size_t n, std::function<void(size_t)> fn, std::function<void()> done = nullptr);
  // Returns when the loop has finished, rethrowing its first exception (wait_quietly: dropping it).
  static void wait(const std::shared_ptr<Loop>& loop);
  static void wait_quietly(const std::shared_ptr<Loop>& loop) noexcept;

 private:
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

// This process's share of the machine's cores. Under a launcher that starts several ranks per node
// (torchrun sets LOCAL_WORLD_SIZE) and leaves each the same cores, every rank's default pool would be
// the whole machine: 8 ranks, 8x the cores. When this process sees more than its fair share of the
// online cores (affinity > online / local ranks), the affinity count is divided by the local ranks; a
// launcher that binds each rank to its own cores (srun --cpu-bind) already gave it its share.
struct CpuShare {
  int threads = 1;           // the share: the default thread count
  int affinity = 1;          // cores in this process's affinity mask
  int online = 1;            // cores online in the machine
  int local_world_size = 1;  // ranks on this node (LOCAL_WORLD_SIZE, 1 when unset or invalid)
};
CpuShare cpu_share();

// Threads to use when the caller gives none: GPUPIPE_NUM_THREADS, else cpu_share().threads.
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

// Test hook: a parallel_for over n indices on the pool of num_threads whose body throws at throw_at
// (-1: never); returns how many indices ran. The exception must come back to the caller, never
// reach std::terminate.
size_t pool_selftest(int num_threads, size_t n, int64_t throw_at);

}  // namespace gpupipe
