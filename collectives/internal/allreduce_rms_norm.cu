// The one-shot all-reduce fused with the residual add and RMSNorm (allreduce_rms_norm.h).
// Barriers, staging halves, the epoch and graph-input registration are the one-shot kernel's
// (custom_allreduce_kernels.cuh, whose device helpers this file uses): a fused call is one more
// call in the same per-rank sequence, so plain and fused calls interleave freely.
#include "collectives/internal/allreduce_rms_norm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "collectives/internal/custom_allreduce_kernels.cuh"

namespace kiln {
namespace internal {
namespace {

using bf16 = __nv_bfloat16;

// Programmatic dependent launch (sm_90+). The kernel after this one may start now and run its
// independent prologue (a GEMM streams its first weights while this kernel waits on NVLink); it
// still waits for this kernel's completion before reading what this one writes.
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the kernel before this one completed and its memory is visible (at once when
// launched without PDL). Every block waits, so this kernel completes only after its
// predecessor: completion stays transitive along the stream, which the epoch protocol (a rank
// reaches call N + 2 only after its peers finished call N) relies on.
__device__ __forceinline__ void WaitForPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// 16 bytes of bf16 <-> 8 floats, as runtime/model's LoadBf16<8> / StoreBf16<8>.
__device__ __forceinline__ void Unpack(const uint4& raw, float (&out)[8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ uint4 Pack(const float (&in)[8]) {
  uint4 raw;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return raw;
}

// The block sum of rms_norm.cu (runtime/model/internal/vec.cuh BlockSum), in the same order:
// a butterfly within each warp, the warps' sums through shared memory, a butterfly over them.
__device__ __forceinline__ float BlockSum(float value, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? scratch[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

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

  // The norm weights: no kernel writes them, so they load before the wait.
  uint4 gamma[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int col = c * blockDim.x + threadIdx.x;
    if (col < row_packs) gamma[c] = __ldg(static_cast<const uint4*>(p.weight) + col);
  }
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
  uint4* out = static_cast<uint4*>(a.out);
  uint4* residual = static_cast<uint4*>(p.residual);
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
  if (!BlockBarrier<W>(a, set, value, 0)) return;

  for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    const uint64_t base = static_cast<uint64_t>(row) * row_packs;
    float v[kChunks][8];
    float sum_sq = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = c * blockDim.x + threadIdx.x;
      if (col < row_packs) {
        // The all-reduced pack, rounded to bf16 as the plain all-reduce writes it.
        Unpack(ReducePack<bf16, W>(src, in, rank, base + col), v[c]);
        float r[8];
        Unpack(residual[base + col], r);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[c][i] += r[i];
        residual[base + col] = Pack(v[c]);
        // Normalise the stored (rounded) residual, not the float sum.
#pragma unroll
        for (int i = 0; i < 8; ++i) v[c][i] = __bfloat162float(__float2bfloat16_rn(v[c][i]));
#pragma unroll
        for (int i = 0; i < 8; ++i) sum_sq += v[c][i] * v[c][i];
      }
    }
    const float total = BlockSum(sum_sq, scratch);
    const float scale = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = c * blockDim.x + threadIdx.x;
      if (col < row_packs) {
        float w[8];
        Unpack(gamma[c], w);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[c][i] = v[c][i] * scale * w[i];
        out[base + col] = Pack(v[c]);
      }
    }
    __syncthreads();  // every thread read `scratch` before the next row's sum overwrites it
  }
  if (registered && !BlockBarrier<W>(a, set, value + 1, 1)) return;

  // The last block to finish advances the counter for the next call (stream order, and for a
  // PDL successor griddepcontrol.wait, makes the next kernel see it).
  if (threadIdx.x == 0) {
    const unsigned prev = atomicAdd(&a.control->blocks_done, 1u);
    if (prev == gridDim.x - 1) {
      volatile AllReduceControl* control = a.control;
      control->blocks_done = 0;
      control->epoch = epoch + 1;
    }
  }
}

bool SupportsProgrammaticLaunch() {
  static const bool supported = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return supported;
}

template <int W>
cudaError_t Launch(const AllReduceRmsNormArgs& args, int blocks, cudaStream_t stream) {
  const int threads = AllReduceRmsNormThreads(args.hidden);
  const int chunks = (args.hidden / 8 + threads - 1) / threads;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = SupportsProgrammaticLaunch() ? 1 : 0;
  switch (chunks) {
    case 1:
      return cudaLaunchKernelEx(&config, AllReduceRmsNormKernel<W, 1>, args);
    case 2:
      return cudaLaunchKernelEx(&config, AllReduceRmsNormKernel<W, 2>, args);
    default:
      return cudaLaunchKernelEx(&config, AllReduceRmsNormKernel<W, kRmsNormChunks>, args);
  }
}

}  // namespace

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
  KILN_DISPATCH_WORLD_SIZE(world_size, W, { return Launch<W>(args, blocks, stream); });
}

}  // namespace internal
}  // namespace kiln
