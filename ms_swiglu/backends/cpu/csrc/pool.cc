// The process-wide thread pool (pool.h). Workers wait on a futex for the next task's generation, after spinning
// kSpin for it; a parallel call runs one task per thread, the calling thread taking task 0. Only one call runs at a
// time: a second caller (another MindSpore thread) and nested calls run their tasks inline.
#include "pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace msw {
namespace {

// How long a worker spins for the next task before it sleeps: long enough for the back-to-back parallel calls of
// one kernel and of consecutive kernels, short against a MindSpore op's time between them (longer spins gained
// nothing: waking a worker is not where an MLP's time goes).
constexpr auto kSpin = std::chrono::microseconds(10);

thread_local bool t_in_task = false;

void futex_wait(std::atomic<uint32_t> *word, uint32_t seen) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t> *word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

int cpu_count() {
  if (const char *env = std::getenv("MS_SWIGLU_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int t = 1; t < n_; ++t) workers_.emplace_back([this, t] { work(t, 0); });  // waits for generation 1
  }

  // task(t) for t in [0, n): the workers take 1..n-1, the caller 0.
  void run(const std::function<void(int)> &task) {
    std::unique_lock<std::mutex> call(call_, std::try_to_lock);
    if (n_ == 1 || t_in_task || !call.owns_lock()) {
      const bool outer = t_in_task;
      t_in_task = true;
      for (int t = 0; t < n_; ++t) task(t);
      t_in_task = outer;
      return;
    }
    task_ = &task;
    pending_.store(n_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    futex_wake_all(&generation_);
    t_in_task = true;
    task(0);
    t_in_task = false;
    while (pending_.load(std::memory_order_acquire) > 0) _mm_pause();
  }

  int size() const { return n_; }

 private:
  [[noreturn]] void work(int t, uint32_t seen) {
    t_in_task = true;  // a worker's own parallel calls run inline
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      uint32_t now;
      while ((now = generation_.load(std::memory_order_acquire)) == seen) {
        if (std::chrono::steady_clock::now() - start < kSpin) {
          _mm_pause();
        } else {
          futex_wait(&generation_, seen);
        }
      }
      seen = now;
      (*task_)(t);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  const int n_;
  std::vector<std::thread> workers_;  // never joined: they live as long as the process
  std::mutex call_;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int)> *task_ = nullptr;
};

Pool &pool() {
  static Pool *p = new Pool(cpu_count());  // leaked on purpose: workers must outlive every static destructor
  return *p;
}

}  // namespace

int threads() { return pool().size(); }

bool in_parallel() { return t_in_task; }

void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t)> &body, int64_t serial) {
  const int nt = threads();
  if (n <= 0) return;
  if (nt == 1 || n < serial || n == 1 || t_in_task) {
    body(0, n);
    return;
  }
  pool().run([&](int t) {
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) body(begin, end);
  });
}

void parallel_each(int64_t n, const std::function<void(int64_t)> &body) {
  if (n <= 0) return;
  if (threads() == 1 || n == 1 || t_in_task) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<int64_t> next{0};
  pool().run([&](int) {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) body(i);
  });
}

}  // namespace msw
