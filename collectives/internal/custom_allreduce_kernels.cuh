// Internal to //collectives:custom_allreduce: the one-shot and two-shot all-reduce kernels over
// CUDA IPC. Included only by the per-dtype .cu files.
//
// Ordering between ranks (why these instructions):
//  - A rank announces "my data for this stage is written" by storing the barrier value into a
//    flag in each peer's region with st.release.sys, after a __syncthreads that orders every
//    thread's data stores of the block before it. The release is system-scoped because the
//    reader is another GPU, which gpu-scope ordering says nothing about.
//  - The peer spins on its own (local) flag with ld.acquire.sys and then __syncthreads, so every
//    thread's later reads of the announcer's data see the stores the release covered.
//  - Peer data is read with ld.global.cg (L2, not L1): L1 is not coherent with writes from other
//    GPUs, and the same addresses are read again in later calls.
//  - No atomics cross the GPUs: only plain release stores and acquire loads, which NVLink (and
//    PCIe P2P, where it works at all) carry; remote atomics are not guaranteed over PCIe.
//
// Barrier values come from the per-rank call counter (epoch), never reset: value = 4 * epoch +
// stage + 1 in flag set (epoch & 1). A waiter accepts any value >= the one it expects, because a
// peer can only be ahead of it within the same call. The two sets alternate with the two staging
// halves: the half (and flag set) of call N is reused at call N + 2, and a rank can only start
// call N + 2 after every peer arrived at a barrier of call N + 1, which they do only after
// finishing call N. That is why staged calls need no closing barrier, and why replaying a graph
// (which re-runs the same kernels) is safe: the counter lives in device memory and advances on
// every execution, captured or not.
#ifndef KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_CUH_
#define KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "collectives/internal/custom_allreduce_kernels.h"

namespace kiln {
namespace internal {

__device__ __forceinline__ void StoreRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t* FlagSlot(char* region, uint64_t set, int block, int from) {
  return reinterpret_cast<uint64_t*>(region) + (set * kMaxBlocks + block) * kMaxRanks + from;
}

__device__ __forceinline__ uint4* StagingHalf(char* region, uint64_t set, uint64_t half_bytes) {
  return reinterpret_cast<uint4*>(region + kStagingOffset + set * half_bytes);
}

// 16-byte packs <-> floats, per element type.
template <typename T>
struct PackMath;

template <>
struct PackMath<__nv_bfloat16> {
  static constexpr int kFloats = 8;
  __device__ __forceinline__ static void Add(const uint4& p, float (&acc)[8], bool first) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(h[i]);
      acc[2 * i] = first ? v.x : acc[2 * i] + v.x;
      acc[2 * i + 1] = first ? v.y : acc[2 * i + 1] + v.y;
    }
  }
  __device__ __forceinline__ static uint4 Pack(const float (&acc)[8]) {
    uint4 p;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    return p;
  }
};

template <>
struct PackMath<__half> {
  static constexpr int kFloats = 8;
  __device__ __forceinline__ static void Add(const uint4& p, float (&acc)[8], bool first) {
    const __half2* h = reinterpret_cast<const __half2*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __half22float2(h[i]);
      acc[2 * i] = first ? v.x : acc[2 * i] + v.x;
      acc[2 * i + 1] = first ? v.y : acc[2 * i + 1] + v.y;
    }
  }
  __device__ __forceinline__ static uint4 Pack(const float (&acc)[8]) {
    uint4 p;
    __half2* h = reinterpret_cast<__half2*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(acc[2 * i], acc[2 * i + 1]);
    return p;
  }
};

template <>
struct PackMath<float> {
  static constexpr int kFloats = 4;
  __device__ __forceinline__ static void Add(const uint4& p, float (&acc)[4], bool first) {
    const float* f = reinterpret_cast<const float*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = first ? f[i] : acc[i] + f[i];
  }
  __device__ __forceinline__ static uint4 Pack(const float (&acc)[4]) {
    uint4 p;
    float* f = reinterpret_cast<float*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = acc[i];
    return p;
  }
};

// Sums packs in rank order 0, 1, ..., W-1 in float: the same order on every rank, so every rank
// (and, for two-shot, the rank owning each shard) produces the same bits.
template <typename T, int W>
__device__ __forceinline__ uint4 ReduceRanks(const uint4 (&v)[W]) {
  float acc[PackMath<T>::kFloats];
#pragma unroll
  for (int w = 0; w < W; ++w) PackMath<T>::Add(v[w], acc, w == 0);
  return PackMath<T>::Pack(acc);
}

__device__ __forceinline__ void ReportTimeout(const CustomAllReduceArgs& a, int peer, int stage) {
  volatile DeviceErrorWords* e = a.errors;
  e->timed_out_peer = peer;
  e->timed_out_stage = stage;
  __threadfence_system();
  e->timed_out = 1;
  volatile AllReduceControl* c = a.control;
  c->aborted = 1;
  __threadfence_system();
}

// Block-level barrier with the same block of every peer. Thread p (< W) signals peer p and waits
// for peer p's signal; the rest of the block waits at __syncthreads. Returns false if any wait
// exceeded the timeout (after reporting it): the caller must return without touching peers.
template <int W>
__device__ __forceinline__ bool BlockBarrier(const CustomAllReduceArgs& a, uint64_t set,
                                             uint64_t value, int stage) {
  __syncthreads();
  int failed = 0;
  const int peer = threadIdx.x;
  if (peer < W && peer != a.rank) {
    StoreRelease(FlagSlot(a.regions[peer], set, blockIdx.x, a.rank), value);
    const uint64_t* mine = FlagSlot(a.regions[a.rank], set, blockIdx.x, peer);
    if (LoadAcquire(mine) < value) {
      const uint64_t start = GlobalTimerNs();
      while (LoadAcquire(mine) < value) {
        if (GlobalTimerNs() - start > a.timeout_ns) {
          ReportTimeout(a, peer, stage);
          failed = 1;
          break;
        }
      }
    }
  }
  return __syncthreads_or(failed) == 0;
}

// Reads pack `i` of every rank's source (this rank's from its own input) and returns the sum.
template <typename T, int W>
__device__ __forceinline__ uint4 ReducePack(const uint4* const (&src)[W], const uint4* in,
                                            int rank, uint64_t i) {
  uint4 v[W];
#pragma unroll
  for (int w = 0; w < W; ++w) v[w] = (w == rank) ? in[i] : __ldcg(src[w] + i);
  return ReduceRanks<T, W>(v);
}

// One kernel for both algorithms and both input modes:
//   one-shot, staged:      copy in -> staging; barrier; reduce all packs from every staging.
//   one-shot, registered:  barrier; reduce from every rank's registered input; barrier (peers
//                          are done reading this rank's input before the caller may reuse it).
//   two-shot, staged:      copy in -> staging; barrier; reduce own shard into own staging and
//                          out; barrier; copy the other shards from their owners' staging.
//   two-shot, registered:  as staged without the copy; the reduced shard goes to staging.
// Block b handles the same packs on every rank (same grid everywhere), so each block only needs
// to meet the same block of its peers.
template <typename T, int W, bool kTwoShot>
__global__ void __launch_bounds__(1024) CustomAllReduceKernel(const CustomAllReduceArgs a) {
  __shared__ uint64_t s_epoch;
  __shared__ int s_skip;
  __shared__ const uint4* s_inputs[W];
  if (threadIdx.x == 0) {
    const volatile AllReduceControl* control = a.control;
    int skip = control->aborted != 0;
    s_epoch = control->epoch;
    if (!skip && a.registered != nullptr) {
      const volatile RegisteredInput* entry = a.registered;
      if (entry->ready == 0) {
        // Replayed before RegisterGraphBuffers: the peers' addresses are unknown. Touch nothing
        // (every rank skips alike, so the counters stay in step) and tell the host.
        volatile DeviceErrorWords* e = a.errors;
        e->unregistered_slot = a.slot;
        __threadfence_system();
        e->unregistered = 1;
        __threadfence_system();
        skip = 1;
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) s_inputs[w] = static_cast<const uint4*>(entry->ptrs[w]);
      }
    }
    s_skip = skip;
  }
  __syncthreads();
  if (s_skip) return;

  const uint64_t epoch = s_epoch;
  const uint64_t set = epoch & 1;
  const bool registered = a.registered != nullptr;
  const int rank = a.rank;
  const uint4* in = static_cast<const uint4*>(a.in);
  uint4* out = static_cast<uint4*>(a.out);
  const uint64_t n = a.packs;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4* my_staging = StagingHalf(a.regions[rank], set, a.half_bytes);
  const uint4* src[W];
#pragma unroll
  for (int w = 0; w < W; ++w) {
    src[w] = registered ? s_inputs[w] : StagingHalf(a.regions[w], set, a.half_bytes);
  }
  const uint64_t value = 4 * epoch + 1;

  if (!kTwoShot) {
    if (!registered) {
      for (uint64_t i = tid; i < n; i += stride) my_staging[i] = in[i];
    }
    if (!BlockBarrier<W>(a, set, value, 0)) return;
    for (uint64_t i = tid; i < n; i += stride) out[i] = ReducePack<T, W>(src, in, rank, i);
    if (registered && !BlockBarrier<W>(a, set, value + 1, 1)) return;
  } else {
    const uint64_t shard = (n + W - 1) / W;
    if (!registered) {
      for (uint64_t j = tid; j < shard; j += stride) {
#pragma unroll
        for (int s = 0; s < W; ++s) {
          const uint64_t g = s * shard + j;
          if (g < n) my_staging[g] = in[g];
        }
      }
    }
    if (!BlockBarrier<W>(a, set, value, 0)) return;
    for (uint64_t j = tid; j < shard; j += stride) {
      const uint64_t g = rank * shard + j;
      if (g >= n) break;
      const uint4 r = ReducePack<T, W>(src, in, rank, g);
      my_staging[g] = r;
      out[g] = r;
    }
    if (!BlockBarrier<W>(a, set, value + 1, 1)) return;
    for (uint64_t j = tid; j < shard; j += stride) {
#pragma unroll
      for (int s = 0; s < W; ++s) {
        const uint64_t g = s * shard + j;
        if (s != rank && g < n) out[g] = __ldcg(StagingHalf(a.regions[s], set, a.half_bytes) + g);
      }
    }
  }

  // The last block to finish advances the counter for the next call (stream order makes the
  // next kernel see it). Blocks all read the counter before any of them got here.
  if (threadIdx.x == 0) {
    const unsigned prev = atomicAdd(&a.control->blocks_done, 1u);
    if (prev == gridDim.x - 1) {
      volatile AllReduceControl* control = a.control;
      control->blocks_done = 0;
      control->epoch = epoch + 1;
    }
  }
}

// Dispatches on the world size; the host class only calls with supported sizes.
#define KILN_DISPATCH_WORLD_SIZE(world_size, W, ...)  \
  switch (world_size) {                               \
    case 2: {                                         \
      constexpr int W = 2;                            \
      __VA_ARGS__;                                    \
    }                                                 \
    case 4: {                                         \
      constexpr int W = 4;                            \
      __VA_ARGS__;                                    \
    }                                                 \
    case 6: {                                         \
      constexpr int W = 6;                            \
      __VA_ARGS__;                                    \
    }                                                 \
    case 8: {                                         \
      constexpr int W = 8;                            \
      __VA_ARGS__;                                    \
    }                                                 \
    default: /* unsupported world size */             \
      return cudaErrorInvalidValue;                   \
  }

template <typename T>
cudaError_t LaunchForType(const CustomAllReduceArgs& args, int world_size, bool two_shot,
                          int blocks, int threads, cudaStream_t stream) {
  KILN_DISPATCH_WORLD_SIZE(world_size, W, {
    if (two_shot) {
      CustomAllReduceKernel<T, W, true><<<blocks, threads, 0, stream>>>(args);
    } else {
      CustomAllReduceKernel<T, W, false><<<blocks, threads, 0, stream>>>(args);
    }
    return cudaGetLastError();
  });
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_CUH_
