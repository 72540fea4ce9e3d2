// pagewise: a debug timeline of decode attention's blocks, compiled in only with
// PAGEWISE_NVCC_FLAGS=-DPAGEWISE_DECODE_TIMELINE (otherwise every call here is empty). Thread 0
// of each block records when the block started and ended (%globaltimer, ns, comparable across
// SMs), its SM, and the SM cycles (clock64) from its start to each mark: the wait for the kernel
// before it, the first K/V tile landing in shared memory, the end of its tile loop, its end.
// Read back with pagewise_decode_timeline (paged_decode.cu); the kernel test `decode_timeline`
// prints a summary. Each launch overwrites the slots of its blocks.
#pragma once
#include <stdint.h>

namespace {

// Slots: split blocks in [0, kTimelineSplitSlots), merge blocks after them.
constexpr int kTimelineSlots = 4096;
constexpr int kTimelineSplitSlots = 3072;
constexpr int kTimelineFields = 8;

// Fields of a slot.
enum TimelineField {
  kStartNs = 0,   // %globaltimer at the block's start
  kEndNs = 1,     // %globaltimer at its end
  kSm = 2,        // the SM it ran on
  kWaited = 3,    // cycles from start to the end of the wait for the previous kernel
  kFirstTile = 4, // cycles to the first tile in shared memory (split blocks)
  kLoopEnd = 5,   // cycles to the end of the tile loop (split blocks)
  kEndCycles = 6, // cycles to the end
  kKind = 7,      // 1: split block, 2: merge block
};

#ifdef PAGEWISE_DECODE_TIMELINE
__device__ unsigned long long g_decode_timeline[kTimelineSlots * kTimelineFields];

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One block's record; only thread 0 writes.
struct BlockTimeline {
  unsigned long long* slot = nullptr;
  long long c0 = 0;
  __device__ BlockTimeline(int kind) {
    const int64_t id = blockIdx.x + (int64_t)gridDim.x * (blockIdx.y + (int64_t)gridDim.y * blockIdx.z);
    const int64_t index = kind == 1 ? id : kTimelineSplitSlots + id;
    const int64_t limit = kind == 1 ? kTimelineSplitSlots : kTimelineSlots;
    if (threadIdx.x != 0 || index >= limit) return;
    slot = g_decode_timeline + index * kTimelineFields;
    c0 = clock64();
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    slot[kStartNs] = global_ns();
    slot[kSm] = sm;
    slot[kKind] = kind;
  }
  __device__ void mark(TimelineField f) {
    if (slot) slot[f] = clock64() - c0;
  }
  __device__ void end() {
    if (!slot) return;
    slot[kEndCycles] = clock64() - c0;
    slot[kEndNs] = global_ns();
  }
};
#else
struct BlockTimeline {
  __device__ BlockTimeline(int) {}
  __device__ void mark(TimelineField) {}
  __device__ void end() {}
};
#endif

}  // namespace
