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
//
// Pull or push (CustomAllReduceArgs::push_inputs, push_gather). Pulling, a rank reads what it
// needs from its peers' memory after a barrier: each read waits a round trip over NVLink.
// Pushing, the producer writes the data into the consumer's staging before the barrier and the
// consumer reads its own memory: the writes are posted, and the barrier's release waits for
// them to land. Where data lands in a staging half:
//   one-shot, push_inputs:   rank r's input at [r * n, (r + 1) * n) of every peer's half; the
//                            reduction reads the W - 1 copies locally (needs W * n packs).
//   two-shot, push_inputs:   pack j of shard s of rank r's input at [r * shard + j] of rank s's
//                            half (the "inbox", W * shard packs); the reduced shards then go to
//                            [W * shard, 2 * W * shard) (needs 2 * W * shard packs).
//   two-shot, push_gather:   the owner of shard s writes the reduced pack s * shard + j to the
//                            gather area of every peer's half (offset W * shard with
//                            push_inputs, else 0: where the peer's staged input of the same pack
//                            was, which only this thread read, just before).
//   two-shot, gather to outputs (registered calls whose table entry holds every rank's
//                            output): the owner writes the reduced pack straight into every
//                            peer's output, and the call ends at its second barrier.
// Pushing inputs writes into a peer's half before the first barrier of the call. That is safe
// for the reason the halves alternate at all: this rank started call N only after every block
// of its call N - 1 met every peer at a barrier, which each peer reached only after its call
// N - 2, the last user of this half, had ended. With pushed inputs no peer reads this rank's
// input, so registered inputs are not read and a one-shot call needs one barrier.
//
// Programmatic dependent launch: the kernel may start while the previous kernel of the stream
// still runs (the launcher asks for it). Before griddepcontrol.wait it reads only the graph-input
// table, which the host writes between replays and no kernel writes; everything else (the
// control block the previous all-reduce advanced, `in`, `out`, staging, peers) comes after the
// wait, which returns once the previous grid finished and its writes are visible. After its last
// barrier the kernel lets the next kernel start its own preamble
// (griddepcontrol.launch_dependents); that kernel waits for this one to finish before it
// touches memory. Since a kernel of call N + 1 passes the wait only after call N ended on that
// rank, the staging-half argument above holds block by block, whatever the grids of the two
// calls. Any other kernel that shares these halves and this control block must keep the same
// two rules: each of its blocks meets every peer at a barrier, and it touches staging or peer
// memory only after the previous kernel of the stream ended (stream order or the wait).
#ifndef KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_CUH_
#define KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "collectives/internal/custom_allreduce_kernels.h"
#include "runtime/cuda/device_helpers.cuh"

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

// Conversions of a pair of 16-bit values, per pair type.
template <typename Pair>
struct PairConvert;

template <>
struct PairConvert<__nv_bfloat162> {
  __device__ __forceinline__ static float2 ToFloats(const __nv_bfloat162& v) {
    return __bfloat1622float2(v);
  }
  __device__ __forceinline__ static __nv_bfloat162 FromFloats(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};

template <>
struct PairConvert<__half2> {
  __device__ __forceinline__ static float2 ToFloats(const __half2& v) { return __half22float2(v); }
  __device__ __forceinline__ static __half2 FromFloats(float a, float b) {
    return __floats2half2_rn(a, b);
  }
};

// A pack of four pairs of 16-bit values (bf16 or fp16).
template <typename Pair>
struct PairPackMath {
  static constexpr int kFloats = 8;
  __device__ __forceinline__ static void Add(const uint4& p, float (&acc)[8], bool first) {
    const Pair* h = reinterpret_cast<const Pair*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = PairConvert<Pair>::ToFloats(h[i]);
      acc[2 * i] = first ? v.x : acc[2 * i] + v.x;
      acc[2 * i + 1] = first ? v.y : acc[2 * i + 1] + v.y;
    }
  }
  __device__ __forceinline__ static uint4 Pack(const float (&acc)[8]) {
    uint4 p;
    Pair* h = reinterpret_cast<Pair*>(&p);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = PairConvert<Pair>::FromFloats(acc[2 * i], acc[2 * i + 1]);
    return p;
  }
};

template <>
struct PackMath<__nv_bfloat16> : PairPackMath<__nv_bfloat162> {};

template <>
struct PackMath<__half> : PairPackMath<__half2> {};

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

// Counts this block out of the call once it passed its last barrier; the last block of the grid
// advances the call counter for the next call (which reads it after stream order or its
// griddepcontrol.wait). Every block read the counter before its first barrier, so before any
// block got here. Thread 0 issues the atomic and uses its result only in FinishCall: the round
// trip overlaps the block's last phase instead of delaying the kernel's end.
struct CallCounter {
  unsigned prev = 0;
  __device__ __forceinline__ void Start(const CustomAllReduceArgs& a) {
    if (threadIdx.x == 0) prev = atomicAdd(&a.control->blocks_done, 1u);
  }
  __device__ __forceinline__ void Finish(const CustomAllReduceArgs& a, uint64_t epoch) const {
    if (threadIdx.x == 0 && prev == gridDim.x - 1) {
      volatile AllReduceControl* control = a.control;
      control->blocks_done = 0;
      control->epoch = epoch + 1;
    }
  }
};

// Packs each thread keeps in flight per rank: the loops below issue every load of kUnroll
// consecutive items (one item = one pack from each rank) before their first store. Stores may
// alias later loads (in place, or staging), so neither the compiler nor the hardware moves a
// load above an earlier store: without this, each item, and each rank's pack of a gather item,
// would cost a full (remote) round trip of its own. One-shot keeps 8 / W items (8 packs, 32
// registers) in flight; two-shot, whose loops hold more addresses, one item (two at W = 2):
// more spills registers under the 64 that __launch_bounds__(1024) leaves. An item is at most
// one pass over the grid below the sizes where two-shot runs (4 MiB at world 4), so its unroll
// matters less.
template <int W, bool kTwoShot>
constexpr int UnrollFor() {
  if (kTwoShot) return W == 2 ? 2 : 1;
  return W >= 8 ? 1 : 8 / W;
}

// Loads every rank's pack of one item into v: this rank's from in[i], rank w's from src[w][k].
template <int W>
__device__ __forceinline__ void LoadRanks(const uint4* const (&src)[W], const uint4* in, int rank,
                                          uint64_t i, uint64_t k, uint4 (&v)[W]) {
#pragma unroll
  for (int w = 0; w < W; ++w) v[w] = (w == rank) ? in[i] : __ldcg(src[w] + k);
}

// Reads pack `i` of every rank's source (this rank's from its own input) and returns the sum.
template <typename T, int W>
__device__ __forceinline__ uint4 ReducePack(const uint4* const (&src)[W], const uint4* in,
                                            int rank, uint64_t i) {
  uint4 v[W];
  LoadRanks<W>(src, in, rank, i, i, v);
  return ReduceRanks<T, W>(v);
}

// One kernel for both algorithms, both input modes and pull or push:
//   one-shot, staged:      copy in -> staging; barrier; reduce all packs from every staging.
//   one-shot, registered:  barrier; reduce from every rank's registered input; barrier (peers
//                          are done reading this rank's input before the caller may reuse it).
//   one-shot, push:        write in into every peer's staging; barrier; reduce from own staging.
//   two-shot:              reduce-scatter: the owner of each shard gathers its pieces (staged:
//                          copy in -> staging, barrier, read the peers' staging; registered:
//                          barrier, read the peers' inputs; push: write each piece into its
//                          owner's inbox, barrier, read own inbox), reduces them into out and
//                          the gather area; barrier; all-gather (pull: read the other shards
//                          from their owners' staging; push: the owner wrote them into every
//                          peer's gather area before the barrier, read own staging).
// Block b handles the same packs on every rank (same grid everywhere), so each block only needs
// to meet the same block of its peers.
template <typename T, int W, bool kTwoShot>
__global__ void __launch_bounds__(1024) CustomAllReduceKernel(const CustomAllReduceArgs a) {
  constexpr int kU = UnrollFor<W, kTwoShot>();
  __shared__ uint64_t s_epoch;
  __shared__ int s_skip;
  __shared__ const uint4* s_inputs[W];
  __shared__ uint4* s_outputs[W];
  const bool registered = a.registered != nullptr;
  // The table entry is written by the host (RegisterGraphBuffers), never by a kernel, so it is
  // read before the wait, in parallel with the control block after it.
  uint64_t ready = 1;
  if (registered) {
    if (threadIdx.x < W) {
      s_inputs[threadIdx.x] = static_cast<const uint4*>(a.registered->ptrs[threadIdx.x]);
      s_outputs[threadIdx.x] = static_cast<uint4*>(a.registered->outs[threadIdx.x]);
    }
    if (threadIdx.x == 0) ready = a.registered->ready;
  }
  WaitForPrerequisites();
  if (threadIdx.x == 0) {
    const volatile AllReduceControl* control = a.control;
    int skip = control->aborted != 0;
    s_epoch = control->epoch;
    if (!skip && ready == 0) {
      // Replayed before RegisterGraphBuffers: the peers' addresses are unknown. Touch nothing
      // (every rank skips alike, so the counters stay in step) and tell the host.
      volatile DeviceErrorWords* e = a.errors;
      e->unregistered_slot = a.slot;
      __threadfence_system();
      e->unregistered = 1;
      __threadfence_system();
      skip = 1;
    }
    s_skip = skip;
  }
  __syncthreads();
  if (s_skip) return;

  const uint64_t epoch = s_epoch;
  const uint64_t set = epoch & 1;
  const int rank = a.rank;
  const bool push_inputs = a.push_inputs != 0;
  const bool pull_peers = !push_inputs;                   // read peers' memory in the reduction
  const bool peer_inputs = registered && !push_inputs;    // ... their registered inputs
  const uint4* in = static_cast<const uint4*>(a.in);
  uint4* out = static_cast<uint4*>(a.out);
  const uint64_t n = a.packs;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4* my_staging = StagingHalf(a.regions[rank], set, a.half_bytes);
  const uint64_t value = 4 * epoch + 1;
  CallCounter counter;

  if (!kTwoShot) {
    // Rank w's packs: its registered input, its staging, or (push) slot w of this rank's staging.
    const uint4* src[W];
#pragma unroll
    for (int w = 0; w < W; ++w) {
      src[w] = push_inputs   ? my_staging + w * n
               : peer_inputs ? s_inputs[w]
                             : StagingHalf(a.regions[w], set, a.half_bytes);
    }
    if (push_inputs) {
      for (uint64_t i0 = tid; i0 < n; i0 += kU * stride) {
        uint4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (i0 + u * stride < n) v[u] = in[i0 + u * stride];
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (i0 + u * stride >= n) continue;
#pragma unroll
          for (int p = 0; p < W; ++p) {
            if (p != rank) {
              StagingHalf(a.regions[p], set, a.half_bytes)[rank * n + i0 + u * stride] = v[u];
            }
          }
        }
      }
    } else if (!registered) {
      constexpr int kCopy = kU * W;
      for (uint64_t i0 = tid; i0 < n; i0 += kCopy * stride) {
        uint4 v[kCopy];
#pragma unroll
        for (int u = 0; u < kCopy; ++u) {
          if (i0 + u * stride < n) v[u] = in[i0 + u * stride];
        }
#pragma unroll
        for (int u = 0; u < kCopy; ++u) {
          if (i0 + u * stride < n) my_staging[i0 + u * stride] = v[u];
        }
      }
    }
    if (!BlockBarrier<W>(a, set, value, 0)) return;
    if (!peer_inputs) {
      AllowDependentLaunch();
      counter.Start(a);
    }
    for (uint64_t i0 = tid; i0 < n; i0 += kU * stride) {
      uint4 v[kU][W];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint64_t i = i0 + u * stride;
        if (i < n) LoadRanks<W>(src, in, rank, i, i, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (i0 + u * stride < n) out[i0 + u * stride] = ReduceRanks<T, W>(v[u]);
      }
    }
    if (peer_inputs) {
      if (!BlockBarrier<W>(a, set, value + 1, 1)) return;
      counter.Start(a);
    }
  } else {
    // Item j is pack j of every shard: global pack s * shard + j of shard s (< n).
    const uint64_t shard = (n + W - 1) / W;
    // Where rank w's piece of this rank's shard is read, at index k (g, or j when pushed).
    const uint4* src[W];
#pragma unroll
    for (int w = 0; w < W; ++w) {
      src[w] = push_inputs   ? my_staging + w * shard
               : peer_inputs ? s_inputs[w]
                             : StagingHalf(a.regions[w], set, a.half_bytes);
    }
    const uint64_t gather = push_inputs ? W * shard : 0;  // gather area, in packs
    // Gather into the peers' outputs (registered with the inputs): see the comment at the
    // all-gather below.
    const bool to_outputs = registered && s_outputs[rank] != nullptr;
    if (push_inputs || !registered) {
      // Each piece of this rank's input goes to its shard's owner: into the owner's inbox
      // (push) or into this rank's staging for the owner to read (staged). This rank's own
      // shard comes from `in`.
      for (uint64_t j0 = tid; j0 < shard; j0 += kU * stride) {
        uint4 v[kU][W];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
#pragma unroll
          for (int s = 0; s < W; ++s) {
            const uint64_t g = s * shard + j0 + u * stride;
            if (s != rank && j0 + u * stride < shard && g < n) v[u][s] = in[g];
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
#pragma unroll
          for (int s = 0; s < W; ++s) {
            const uint64_t j = j0 + u * stride;
            const uint64_t g = s * shard + j;
            if (s == rank || j >= shard || g >= n) continue;
            if (push_inputs) {
              StagingHalf(a.regions[s], set, a.half_bytes)[rank * shard + j] = v[u][s];
            } else {
              my_staging[g] = v[u][s];
            }
          }
        }
      }
    }
    if (!BlockBarrier<W>(a, set, value, 0)) return;
    for (uint64_t j0 = tid; j0 < shard; j0 += kU * stride) {
      uint4 v[kU][W];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint64_t j = j0 + u * stride;
        const uint64_t g = rank * shard + j;
        if (j < shard && g < n) LoadRanks<W>(src, in, rank, g, pull_peers ? g : j, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const uint64_t g = rank * shard + j0 + u * stride;
        if (j0 + u * stride >= shard || g >= n) continue;
        const uint4 r = ReduceRanks<T, W>(v[u]);
        out[g] = r;
        if (to_outputs) {
#pragma unroll
          for (int p = 0; p < W; ++p) {
            if (p != rank) s_outputs[p][g] = r;
          }
        } else if (a.push_gather) {
#pragma unroll
          for (int p = 0; p < W; ++p) {
            if (p != rank) StagingHalf(a.regions[p], set, a.half_bytes)[gather + g] = r;
          }
        } else {
          my_staging[gather + g] = r;
        }
      }
    }
    if (!BlockBarrier<W>(a, set, value + 1, 1)) return;
    AllowDependentLaunch();
    counter.Start(a);
    if (to_outputs) {
      // Every peer wrote its shard into this rank's output before the barrier: the output is
      // whole. Pack g of peer p's output is written only by the owner of g's shard; where the
      // output is the input (in place), that pack of p's input was read only by that owner, by
      // the same thread, before it wrote it; and no peer writes here before this rank passed its
      // first barrier, after the previous kernel of its stream ended.
      counter.Finish(a, epoch);
      return;
    }
    for (uint64_t j0 = tid; j0 < shard; j0 += kU * stride) {
      uint4 v[kU][W];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int s = 0; s < W; ++s) {
          const uint64_t g = s * shard + j0 + u * stride;
          if (s == rank || j0 + u * stride >= shard || g >= n) continue;
          const uint4* from =
              a.push_gather ? my_staging : StagingHalf(a.regions[s], set, a.half_bytes);
          v[u][s] = __ldcg(from + gather + g);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int s = 0; s < W; ++s) {
          const uint64_t g = s * shard + j0 + u * stride;
          if (s != rank && j0 + u * stride < shard && g < n) out[g] = v[u][s];
        }
      }
    }
  }

  counter.Finish(a, epoch);
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

// Launches `kernel`, as a programmatic dependent of the stream's previous kernel when
// `programmatic` (the kernel then overlaps that kernel's tail; see the file comment).
inline cudaError_t LaunchAllReduceKernel(void (*kernel)(CustomAllReduceArgs),
                                         const CustomAllReduceArgs& args, int blocks, int threads,
                                         bool programmatic, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args);
}

template <typename T>
cudaError_t LaunchForType(const CustomAllReduceArgs& args, int world_size, bool two_shot,
                          int blocks, int threads, bool programmatic, cudaStream_t stream) {
  KILN_DISPATCH_WORLD_SIZE(world_size, W, {
    return LaunchAllReduceKernel(two_shot ? CustomAllReduceKernel<T, W, true>
                                          : CustomAllReduceKernel<T, W, false>,
                                 args, blocks, threads, programmatic, stream);
  });
}

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_CUSTOM_ALLREDUCE_KERNELS_CUH_
