// The decode GEMM kernels for up to 8 rows of x (1 x tile(s) of 8), every row-warp count and
// input/output kind (see internal/decode_gemm_kernel.cuh).
#include "runtime/model/internal/decode_gemm_kernel.cuh"

namespace kiln {
namespace internal {

template cudaError_t LaunchDecodeGemmTiles<1>(const DecodeGemmParams&, int, bool, bool,
                                               cudaStream_t);

}  // namespace internal
}  // namespace kiln
