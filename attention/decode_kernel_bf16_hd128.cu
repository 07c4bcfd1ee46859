// Decode attention kernels for bf16, head_dim 128, every supported group size (one file per
// dtype and head_dim so the instantiations compile in parallel).
#include "attention/internal/decode_kernel.cuh"

namespace kiln {
namespace attention_internal {

KILN_INSTANTIATE_DECODE(AttentionDtype::kBf16, 128)

}  // namespace attention_internal
}  // namespace kiln
