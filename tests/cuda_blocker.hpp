// A kernel that holds multiprocessors until it is released, as a collective (an NCCL all-reduce,
// say) on another stream may: one block a multiprocessor, by its shared memory. A kernel of
// gradops that waited for blocks which cannot become resident beside it would never finish.
#pragma once

#include <cuda_runtime.h>

namespace gradops::check {

class Blocker {
 public:
  // Launches `blocks` holding blocks on `stream`; each gives up by itself after `limit_ms`.
  Blocker(int blocks, cudaStream_t stream, int limit_ms);
  Blocker(const Blocker&) = delete;
  Blocker& operator=(const Blocker&) = delete;
  ~Blocker();
  // Whether every block was running within `ms`.
  bool all_running(int ms) const;
  // Releases the blocks; false where any had given up first.
  bool release();

 private:
  int blocks_ = 0;
  volatile int* host_ = nullptr;  // [release, gave up, started per block], mapped
};

}  // namespace gradops::check
