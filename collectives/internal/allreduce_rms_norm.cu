// The pull kernel of the fused all-reduce + residual add + RMSNorm (allreduce_rms_norm.h), and
// the launcher that picks pull or push. Barriers, staging halves, the epoch and graph-input
// registration are the one-shot kernel's (custom_allreduce_kernels.cuh, whose device helpers
// this file uses): a fused call is one more call in the same per-rank sequence, so plain and
// fused calls interleave freely.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "collectives/internal/allreduce_rms_norm.cuh"
#include "runtime/cuda/compute_capability.h"

namespace kiln {
namespace internal {
namespace {

using bf16 = __nv_bfloat16;

// Staged (eager, or in graphs unless registered):  copy own rows -> staging; barrier; per row
//   reduce from every rank's staging (own rows from the input), add, norm, write.
// Registered (graphs):  barrier; per row reduce from every rank's registered input, add, norm,
//   write; barrier (peers are done reading this rank's input before the next kernel may
//   overwrite it).
// Thread t of a block handles packs t, t + blockDim.x, ... of each of its rows, as rms_norm.cu
// does, so the sum of squares is accumulated and reduced in the same order. kChunks (1, 2 or 4)
// is the most packs a thread holds per row, ceil(packs / threads): rms_norm.cu always reserves
// 4, which changes nothing in the arithmetic (the other chunks are empty) but here, with the
// peers' packs in flight too, would spill registers.
template <int W, int kChunks>
__global__ void __launch_bounds__(kRmsNormMaxThreads)
    AllReduceRmsNormKernel(const AllReduceRmsNormArgs p) {
  const CustomAllReduceArgs& a = p.base;
  __shared__ uint64_t s_epoch;
  __shared__ int s_skip;
  __shared__ const uint4* s_inputs[W];
  __shared__ float scratch[32];
  const int row_packs = p.hidden / 8;

  uint4 gamma[kChunks];
  LoadGamma<kChunks>(p, gamma);
  AllowDependentLaunch();
  WaitForPrerequisites();  // the partial sums, the residual and the control words

  if (threadIdx.x == 0) {
    const volatile AllReduceControl* control = a.control;
    int skip = control->aborted != 0;
    s_epoch = control->epoch;
    if (!skip && a.registered != nullptr) {
      const volatile RegisteredInput* entry = a.registered;
      if (entry->ready == 0) {
        // Replayed before RegisterGraphBuffers: touch nothing (every rank skips alike, so the
        // counters stay in step) and tell the host.
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
  uint4* my_staging = StagingHalf(a.regions[rank], set, a.half_bytes);
  const uint4* src[W];
#pragma unroll
  for (int w = 0; w < W; ++w) {
    src[w] = registered ? s_inputs[w] : StagingHalf(a.regions[w], set, a.half_bytes);
  }
  const uint64_t value = 4 * epoch + 1;

  if (!registered) {
    for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
      const uint64_t base = static_cast<uint64_t>(row) * row_packs;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int col = c * blockDim.x + threadIdx.x;
        if (col < row_packs) my_staging[base + col] = in[base + col];
      }
    }
  }
  // The first row's residual loads before the barrier.
  uint4 res[kChunks];
  LoadResidualRow<kChunks>(p, static_cast<uint64_t>(blockIdx.x) * row_packs, res);
  if (!BlockBarrier<W>(a, set, value, 0)) return;

  for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    const uint64_t base = static_cast<uint64_t>(row) * row_packs;
    if (row != static_cast<int>(blockIdx.x)) LoadResidualRow<kChunks>(p, base, res);
    float v[kChunks][8];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = c * blockDim.x + threadIdx.x;
      // The all-reduced pack, rounded to bf16 as the plain all-reduce writes it.
      if (col < row_packs) UnpackBf16x8(ReducePack<bf16, W>(src, in, rank, base + col), v[c]);
    }
    AddNormRow<kChunks>(p, base, v, res, gamma, scratch);
  }
  if (registered && !BlockBarrier<W>(a, set, value + 1, 1)) return;
  FinishCall(a, epoch);
}

template <int W, int kChunks>
struct PullKernel {
  static constexpr auto kernel = &AllReduceRmsNormKernel<W, kChunks>;
};

}  // namespace

bool RmsNormSupportsProgrammaticLaunch() { return CurrentDeviceIsSm90OrLater(); }

int AllReduceRmsNormThreads(int hidden) {
  // rms_norm.cu: WarpRoundedThreads(hidden / 8, 1024).
  long long t = (hidden / 8 + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > kRmsNormMaxThreads) t = kRmsNormMaxThreads;
  return static_cast<int>(t);
}

cudaError_t LaunchAllReduceRmsNorm(const AllReduceRmsNormArgs& args, int world_size, int blocks,
                                   cudaStream_t stream) {
  if (args.hidden <= 0 || args.hidden % 8 != 0 || args.hidden > kRmsNormMaxHidden ||
      args.tokens < 1 || blocks < 1 || blocks > kMaxBlocks || blocks > args.tokens) {
    return cudaErrorInvalidValue;
  }
  if (args.push[0] != nullptr) return LaunchAllReduceRmsNormPush(args, world_size, blocks, stream);
  KILN_DISPATCH_WORLD_SIZE(world_size, W,
                           { return LaunchRmsNormKernel<PullKernel, W>(args, blocks, stream); });
}

}  // namespace internal
}  // namespace kiln
