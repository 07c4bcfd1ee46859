// Prefill attention instantiations for bf16, head_dim 64 (both tile sizes).
#include "attention/prefill_kernel_impl.cuh"

namespace kiln {
namespace prefill_internal {

KILN_INSTANTIATE_PREFILL(__nv_bfloat16, 64, 64)
KILN_INSTANTIATE_PREFILL(__nv_bfloat16, 64, 128)

}  // namespace prefill_internal
}  // namespace kiln
