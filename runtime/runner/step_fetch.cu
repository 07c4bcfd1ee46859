#include "runtime/runner/step_fetch.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kiln {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;     // 16-byte loads each thread has in flight
constexpr int kMaxCtas = 128;  // 2 MiB in one round of loads

// Copies bytes [begin, end) of `src` to `dst` (begin 16-byte aligned, end − begin a multiple
// of 4): 16-byte vectors over the grid, each thread issuing all its loads of a round before it
// stores any, then the last words.
__device__ void CopyRange(const char* src, char* dst, size_t begin, size_t end) {
  const size_t vectors = (end - begin) / 16;
  const uint4* s = reinterpret_cast<const uint4*>(src + begin);
  uint4* d = reinterpret_cast<uint4*>(dst + begin);
  const size_t thread = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t first = thread; first < vectors; first += stride * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * stride < vectors) v[u] = s[first + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * stride < vectors) d[first + u * stride] = v[u];
    }
  }
  const size_t tail = begin + vectors * 16;
  if (thread < (end - tail) / 4) {
    reinterpret_cast<int32_t*>(dst + tail)[thread] =
        reinterpret_cast<const int32_t*>(src + tail)[thread];
  }
}

__global__ void __launch_bounds__(kThreads)
    FetchStepMetadataKernel(const char* host, char* device, const MetadataFetch f) {
  // No AllowDependentLaunch: the next kernel launches only once the metadata is complete, since
  // kernels further down the step read it before their waits (step_fetch.h).
  CopyRange(host, device, 0, f.fixed_bytes);
  if (f.row_bytes == 0) return;
  // The step's sequences: the first negative entry of last_token_rows.
  __shared__ int num_seqs;
  if (threadIdx.x == 0) num_seqs = f.max_rows;
  __syncthreads();
  const int32_t* last = reinterpret_cast<const int32_t*>(host + f.last_token_rows);
  for (int i = threadIdx.x; i < f.max_rows; i += blockDim.x) {
    if (last[i] < 0) atomicMin(&num_seqs, i);
  }
  __syncthreads();
  CopyRange(host, device, f.table_offset, f.table_offset + size_t(num_seqs) * f.row_bytes);
}

bool Aligned(const void* p, size_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

}  // namespace

cudaError_t LaunchFetchStepMetadata(const void* host, void* device, const MetadataFetch& fetch,
                                    cudaStream_t stream) {
  if (host == nullptr || device == nullptr || !Aligned(host, 16) || !Aligned(device, 16) ||
      fetch.fixed_bytes % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  size_t most = fetch.fixed_bytes;
  if (fetch.row_bytes > 0) {
    if (fetch.table_offset % 16 != 0 || fetch.row_bytes % 4 != 0 ||
        fetch.last_token_rows % 4 != 0 || fetch.max_rows < 1) {
      return cudaErrorInvalidValue;
    }
    most += fetch.row_bytes * static_cast<size_t>(fetch.max_rows);
  }
  if (most == 0) return cudaSuccess;
  constexpr size_t kRound = size_t{kThreads} * 16 * kUnroll;  // bytes one CTA loads per round
  const int ctas = static_cast<int>(
      std::min<size_t>(kMaxCtas, std::max<size_t>(1, (most + kRound - 1) / kRound)));
  const char* src = static_cast<const char*>(host);
  char* dst = static_cast<char*>(device);
  MetadataFetch f = fetch;
  void* args[] = {&src, &dst, &f};
  return cudaLaunchKernel(reinterpret_cast<const void*>(FetchStepMetadataKernel), dim3(ctas),
                          dim3(kThreads), args, 0, stream);
}

}  // namespace kiln
