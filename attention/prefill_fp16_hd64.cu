// Prefill attention instantiations for fp16, head_dim 64 (both tile sizes).
#include "attention/prefill_kernel_impl.cuh"

namespace kiln {
namespace prefill_internal {

KILN_INSTANTIATE_PREFILL(__half, 64, 64)
KILN_INSTANTIATE_PREFILL(__half, 64, 128)

}  // namespace prefill_internal
}  // namespace kiln
