// Prefill attention instantiations for fp16, head_dim 128 (both tile sizes).
#include "attention/prefill_kernel_impl.cuh"

namespace kiln {
namespace prefill_internal {

KILN_INSTANTIATE_PREFILL(__half, 128, 64)
KILN_INSTANTIATE_PREFILL(__half, 128, 128)

}  // namespace prefill_internal
}  // namespace kiln
