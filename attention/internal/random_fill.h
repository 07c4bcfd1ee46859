// Internal: fills device memory with seeded pseudo-random bf16 or fp16 values in [-1, 1), on the
// device (benchmarks need gigabytes of KV; drawing them on the host would take minutes).
#ifndef KILN_ATTENTION_INTERNAL_RANDOM_FILL_H_
#define KILN_ATTENTION_INTERNAL_RANDOM_FILL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kiln {
namespace attention_internal {

// Writes `count` 2-byte values (bf16 if `bf16`, else fp16) derived from `seed` to `data`.
cudaError_t FillRandom16(void* data, size_t count, uint64_t seed, bool bf16, cudaStream_t stream);

}  // namespace attention_internal
}  // namespace kiln

#endif  // KILN_ATTENTION_INTERNAL_RANDOM_FILL_H_
