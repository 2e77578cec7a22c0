// What the CPU kernels share: an 8-float vector type and a parallel loop over XLA's intra-op threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace spiral {

// GCC's vector extension: AVX2 on x86, a pair of NEON registers on ARM. Unaligned loads allowed.
typedef float Vec __attribute__((vector_size(32), aligned(4)));
typedef int32_t VecI __attribute__((vector_size(32), aligned(4)));
constexpr int kLanes = 8;

inline Vec Load(const float* p) { return *reinterpret_cast<const Vec*>(p); }
inline void Store(float* p, Vec v) { *reinterpret_cast<Vec*>(p) = v; }

// Calls fn(begin, end) over [0, n) in chunks of `chunk`, on the calling thread and the pool's. Chunks
// are claimed one at a time; the caller waits only for chunks already claimed, so a pool task that
// starts late (or never) cannot stall it, and one that starts after the call returned finds no chunk
// left and touches nothing else (fn must be safe to copy, and is not called then).
template <typename Fn>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, int64_t chunk, Fn fn) {
  struct Work {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> finished{0};
    int64_t chunks = 0;
  };
  auto work = std::make_shared<Work>();
  work->chunks = (n + chunk - 1) / chunk;
  auto drain = [=]() {
    for (int64_t c; (c = work->next.fetch_add(1)) < work->chunks;) {
      fn(c * chunk, std::min(n, (c + 1) * chunk));
      work->finished.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), work->chunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(drain)(drain));
  drain();
  while (work->finished.load(std::memory_order_acquire) < work->chunks) std::this_thread::yield();
}

}  // namespace spiral
