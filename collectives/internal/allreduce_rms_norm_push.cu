// The push kernel of the fused all-reduce + residual add + RMSNorm (allreduce_rms_norm.h: why
// the data is its own flag, and why a slot is always cleared before it is written again).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "collectives/internal/allreduce_rms_norm.cuh"

namespace kiln {
namespace internal {
namespace {

using bf16 = __nv_bfloat16;

// Accesses to push slots: volatile (relaxed, system scope, not cached in L1), so a poll sees a
// peer's write as soon as it lands and a clear is not left in a cache.
__device__ __forceinline__ uint4 LoadPolled(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void StorePolled(uint4* p, const uint4& v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ bool LaneIsSentinel(uint32_t word) {
  return (word & 0xffffu) == 0xffffu || (word >> 16) == 0xffffu;
}

// Whether any bf16 lane still holds the sentinel (a 4-byte word lands whole, and every lane is
// checked, so a pack that arrives in pieces is waited for).
__device__ __forceinline__ bool Pending(const uint4& v) {
  return LaneIsSentinel(v.x) || LaneIsSentinel(v.y) || LaneIsSentinel(v.z) || LaneIsSentinel(v.w);
}

// Turns a sentinel lane of real data into 0x7fff (also a NaN: every sum with it is the same
// canonical NaN), so a reader never mistakes data for "not yet".
__device__ __forceinline__ uint32_t SanitizeWord(uint32_t w) {
  if ((w & 0xffffu) == 0xffffu) w &= 0xffff7fffu;
  if ((w >> 16) == 0xffffu) w &= 0x7fffffffu;
  return w;
}

__device__ __forceinline__ uint4 Sanitize(const uint4& v) {
  return make_uint4(SanitizeWord(v.x), SanitizeWord(v.y), SanitizeWord(v.z), SanitizeWord(v.w));
}

// Slot `from` of `buffer` for epoch parity `parity`.
template <int W>
__device__ __forceinline__ uint4* PushSlot(char* buffer, uint64_t parity, int from) {
  return reinterpret_cast<uint4*>(buffer + (parity * W + from) * kPushSlotBytes);
}

// Push this rank's rows into every peer's slot `rank`; then, per row, wait for every peer's
// values in the own buffer (clearing each slot entry once read), sum in rank order, add, norm.
// Each pack is waited for by the thread that sums it, so rows start as soon as their data is in.
template <int W, int kChunks>
__global__ void __launch_bounds__(kRmsNormMaxThreads)
    AllReduceRmsNormPushKernel(const AllReduceRmsNormArgs p) {
  const CustomAllReduceArgs& a = p.base;
  __shared__ uint64_t s_epoch;
  __shared__ int s_skip;
  __shared__ float scratch[32];
  const int row_packs = p.hidden / 8;

  uint4 gamma[kChunks];
  LoadGamma<kChunks>(p, gamma);
  WaitForPrerequisites();  // the partial sums, the residual and the control words
  // The next kernel (a GEMM that streams its weights before its own wait) is let in now, so its
  // weights arrive while this kernel's NVLink round and polls run. 4 x H200, 1B model, decode
  // graphs, tp_benchmark, two rounds, step ms at batch 1 / 8 / 16 / 32: TP=4 0.745 / 0.847 /
  // 0.898 / 1.04-1.13 when it was let in at this kernel's end, 0.677-0.683 / 0.793-0.804 /
  // 0.852-0.864 / 0.955-0.972 now; TP=2 0.819 / 0.936-0.941 / 0.989-0.999 / 1.158-1.174, now
  // 0.759-0.764 / 0.895-0.901 / 0.964-0.973 / 1.127-1.181. (On 2 x H200 with the GEMMs of an
  // earlier version, the end had been 0.02 ms faster at batch 1.)
  AllowDependentLaunch();

  if (threadIdx.x == 0) {
    const volatile AllReduceControl* control = a.control;
    s_skip = control->aborted != 0;
    s_epoch = control->epoch;
  }
  __syncthreads();
  if (s_skip) return;

  const uint64_t epoch = s_epoch;
  const uint64_t parity = epoch & 1;
  const int rank = a.rank;
  const uint4* in = static_cast<const uint4*>(a.in);

  for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    const uint64_t base = static_cast<uint64_t>(row) * row_packs;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = c * blockDim.x + threadIdx.x;
      if (col < row_packs) {
        const uint4 mine = Sanitize(in[base + col]);
#pragma unroll
        for (int w = 0; w < W; ++w) {
          if (w != rank) StorePolled(PushSlot<W>(p.push[w], parity, rank) + base + col, mine);
        }
      }
    }
  }

  int failed = 0;
  for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    const uint64_t base = static_cast<uint64_t>(row) * row_packs;
    uint4 res[kChunks];
    LoadResidualRow<kChunks>(p, base, res);  // before the polls (their asm orders it there)
    float v[kChunks][8];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = c * blockDim.x + threadIdx.x;
      if (col < row_packs) {
        const uint64_t i = base + col;
        float acc[8];
#pragma unroll
        for (int w = 0; w < W; ++w) {
          uint4 x;
          if (w == rank) {
            x = in[i];
          } else {
            uint4* slot = PushSlot<W>(p.push[rank], parity, w) + i;
            x = LoadPolled(slot);
            if (Pending(x) && !failed) {
              const uint64_t start = GlobalTimerNs();
              do {
                if (GlobalTimerNs() - start > a.timeout_ns) {
                  ReportTimeout(a, w, 0);
                  failed = 1;
                  break;
                }
                x = LoadPolled(slot);
              } while (Pending(x));
            }
            StorePolled(slot, make_uint4(~0u, ~0u, ~0u, ~0u));  // consumed: sentinel again
          }
          // The rank-order float sum of ReduceRanks, rounded to bf16 as the plain all-reduce
          // writes it.
          PackMath<bf16>::Add(x, acc, w == 0);
        }
        UnpackBf16x8(PackMath<bf16>::Pack(acc), v[c]);
      }
    }
    if (__syncthreads_or(failed)) return;  // a peer is gone: leave without writing
    AddNormRow<kChunks>(p, base, v, res, gamma, scratch);
  }
  FinishCall(a, epoch);
}

template <int W, int kChunks>
struct PushKernel {
  static constexpr auto kernel = &AllReduceRmsNormPushKernel<W, kChunks>;
};

}  // namespace

cudaError_t LaunchAllReduceRmsNormPush(const AllReduceRmsNormArgs& args, int world_size,
                                       int blocks, cudaStream_t stream) {
  if (static_cast<uint64_t>(args.tokens) * args.hidden * 2 > kPushSlotBytes) {
    return cudaErrorInvalidValue;
  }
  KILN_DISPATCH_WORLD_SIZE(world_size, W,
                           { return LaunchRmsNormKernel<PushKernel, W>(args, blocks, stream); });
}

}  // namespace internal
}  // namespace kiln
