// The kernels' threads: one pool for the whole process, whichever thread calls (MindSpore launches kernels from
// its actor threads and from the Python thread; OpenMP would start a team per calling thread), whose workers spin
// only briefly after a task and then sleep, so that they do not take the cores from the MindSpore ops that run
// between the kernels (OpenMP's workers spin for milliseconds by default).
#pragma once

#include <cstdint>
#include <functional>

namespace msw {

int threads();       // the pool's threads, the calling one included
bool in_parallel();  // inside a pool task: a nested parallel call runs inline, in this thread

// body(begin, end) on contiguous ranges covering [0, n), one range per thread (the calling thread takes the
// first); inline when n is small (below `serial`) or when nested.
void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t)> &body, int64_t serial = 1);

// body(i) for i in [0, n), indices handed out one at a time (for tasks of unequal size).
void parallel_each(int64_t n, const std::function<void(int64_t)> &body);

}  // namespace msw
