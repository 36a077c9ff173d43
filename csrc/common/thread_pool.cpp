#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <list>
#include <utility>
#include <string>
#include <system_error>

#include "common/errors.h"

namespace gpupipe {

struct ThreadPool::Loop {
  size_t n = 0;
  std::function<void(size_t)> fn;
  std::function<void()> done_callback;
  std::atomic<size_t> next{0};
  int participants = 0;  // workers that will join this loop
  int finished = 0;      // guarded by done_mutex
  std::exception_ptr error;  // the first exception thrown by fn, guarded by done_mutex
  std::mutex done_mutex;
  std::condition_variable done;
};

ThreadPool::ThreadPool(int num_threads, const char* name) {
  if (num_threads < 1 || num_threads > kMaxThreads)
    throw InvalidArgument("num_threads must be within 1.." + std::to_string(kMaxThreads) + ", got " +
                          std::to_string(num_threads));
  workers_.reserve(num_threads);
  try {
    for (int i = 0; i < num_threads; ++i) {
      workers_.emplace_back([this] { worker_main(); });
      // best effort (a name over 15 characters is refused); set here, so `name` is read only now
      pthread_setname_np(workers_.back().native_handle(), name);
    }
  } catch (const std::system_error& e) {
    // Never let a joinable std::thread be destroyed (std::terminate): stop and join what started.
    const size_t started = workers_.size();
    stop_and_join();
    throw InternalError("could not start " + std::to_string(num_threads) + " decode threads (" +
                        std::to_string(started) + " started: " + e.what() + "); ask for fewer threads");
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  wait(start(n, [&fn](size_t i) { fn(i); }));
}

std::shared_ptr<ThreadPool::Loop> ThreadPool::start(size_t n, std::function<void(size_t)> fn, std::function<void()> done) {
  auto loop = std::make_shared<Loop>();
  loop->n = n;
  loop->fn = std::move(fn);
  loop->done_callback = std::move(done);
  loop->participants = static_cast<int>(std::min<size_t>(n, workers_.size()));
  if (loop->participants == 0) {  // nothing to run: finished already (done's error for wait, as a worker keeps it)
    if (loop->done_callback) {
      try {
        loop->done_callback();
      } catch (...) {
        loop->error = std::current_exception();
      }
    }
    return loop;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < loop->participants; ++i) queue_.push_back(loop);
  }
  if (loop->participants == 1) wake_.notify_one();
  else wake_.notify_all();
  return loop;
}

void ThreadPool::wait_quietly(const std::shared_ptr<Loop>& loop) noexcept {
  std::unique_lock<std::mutex> lock(loop->done_mutex);
  loop->done.wait(lock, [&] { return loop->finished == loop->participants; });
}

void ThreadPool::wait(const std::shared_ptr<Loop>& loop) {
  std::unique_lock<std::mutex> lock(loop->done_mutex);
  loop->done.wait(lock, [&] { return loop->finished == loop->participants; });
  if (loop->error) std::rethrow_exception(loop->error);
}

void ThreadPool::worker_main() {
  for (;;) {
    std::shared_ptr<Loop> loop;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and nothing left
      loop = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      for (size_t i = loop->next.fetch_add(1); i < loop->n; i = loop->next.fetch_add(1)) loop->fn(i);
    } catch (...) {
      error = std::current_exception();
      loop->next.store(loop->n);  // the other participants stop taking indices
    }
    bool last;
    {
      std::lock_guard<std::mutex> lock(loop->done_mutex);
      if (error && !loop->error) loop->error = error;
      last = ++loop->finished == loop->participants;
      if (last && loop->done_callback) {
        try {
          loop->done_callback();  // before waiters wake: what it releases, they may then free
        } catch (...) {
          if (!loop->error) loop->error = std::current_exception();
        }
      }
    }
    if (last) loop->done.notify_all();
  }
}

int default_num_threads() {
  if (const char* env = std::getenv("GPUPIPE_NUM_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= kMaxThreads) return static_cast<int>(v);
    throw InvalidArgument("GPUPIPE_NUM_THREADS must be an integer in 1.." + std::to_string(kMaxThreads) + ", got '" +
                          std::string(env) + "'");
  }
  return cpu_share().threads;
}

CpuShare cpu_share() {
  CpuShare s;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  s.online = online > 0 ? static_cast<int>(std::min<long>(online, 1 << 20)) : 1;
  cpu_set_t set;
  s.affinity = sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : s.online;
  if (const char* env = std::getenv("LOCAL_WORLD_SIZE")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 1 << 16) s.local_world_size = static_cast<int>(v);
  }
  s.threads = s.affinity;
  if (s.local_world_size > 1 && static_cast<long>(s.affinity) * s.local_world_size > s.online)
    s.threads = std::max(1, s.affinity / s.local_world_size);
  s.threads = std::min(s.threads, kMaxThreads);
  return s;
}

namespace {
std::mutex g_pool_mutex;  // guards g_pools; held across fork() by the atfork handlers below
// A pool per requested size, the most recently used first: the decoder and the augmentation
// kernels may ask for different sizes in alternation, which must not tear pools down and rebuild
// them every batch; at most kCachedPools sizes are kept, so a sweep over thread counts cannot pile
// up threads. Heap-held so that a forked child can abandon the parent's (never touch or destroy
// it: its threads are gone and its mutexes may be held).
// Keyed by (use, size): file reads never queue behind a decode of the same thread count.
using Pools = std::list<std::pair<std::pair<PoolUse, int>, std::shared_ptr<ThreadPool>>>;
constexpr size_t kCachedPools = 4;
Pools* g_pools = nullptr;
pid_t g_pools_pid = 0;

Pools& pools_locked() {
  if (!g_pools || g_pools_pid != getpid()) {
    g_pools = new Pools();
    g_pools_pid = getpid();
  }
  return *g_pools;
}

// fork() copies one thread; a lock another thread held at that moment would stay locked forever in
// the child. Taking the lock around fork() means the child's copy is consistent and unlocked; the
// child then abandons the parent's pools (their threads do not exist there).
void before_fork() { g_pool_mutex.lock(); }
void after_fork_parent() { g_pool_mutex.unlock(); }
void after_fork_child() {
  g_pools = nullptr;  // leaked on purpose: destroying it would join threads that are gone
  g_pool_mutex.unlock();
}

const bool g_atfork_registered = [] {
  return pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0;
}();
}  // namespace

std::shared_ptr<ThreadPool> get_pool(int num_threads, PoolUse use) {
  if (num_threads < 0 || num_threads > kMaxThreads)
    throw InvalidArgument("num_threads must be within 1.." + std::to_string(kMaxThreads) + ", got " +
                          std::to_string(num_threads));
  if (num_threads == 0) num_threads = default_num_threads();
  std::shared_ptr<ThreadPool> evicted;  // released after the lock: its destructor joins threads
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  Pools& pools = pools_locked();
  for (auto it = pools.begin(); it != pools.end(); ++it) {
    if (it->first == std::make_pair(use, num_threads)) {
      pools.splice(pools.begin(), pools, it);  // most recently used first
      return pools.front().second;
    }
  }
  auto pool = std::make_shared<ThreadPool>(num_threads, use == PoolUse::kIo ? "gpupipe-io-pool" : "gpupipe-pool");
  pools.emplace_front(std::make_pair(use, num_threads), pool);
  if (pools.size() > kCachedPools) {
    evicted = std::move(pools.back().second);  // callers still holding it keep it alive
    pools.pop_back();
  }
  return pool;
}

int pool_threads() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pools || g_pools_pid != getpid()) return 0;
  int total = 0;
  for (const auto& kv : *g_pools) total += kv.second ? kv.second->size() : 0;
  return total;
}

void shutdown_pool() {
  Pools old;
  {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!g_pools || g_pools_pid != getpid()) return;
    old.swap(*g_pools);
  }
  // The pools join here unless a caller still holds one, whose release then joins it.
}

size_t pool_selftest(int num_threads, size_t n, int64_t throw_at) {
  std::atomic<size_t> ran{0};
  get_pool(num_threads)->parallel_for(n, [&](size_t i) {
    if (static_cast<int64_t>(i) == throw_at) throw std::runtime_error("selftest failure at index " + std::to_string(i));
    ran.fetch_add(1);
  });
  return ran.load();
}

}  // namespace gpupipe
