#include "runtime/model/device_weights.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/status.h"
#include "runtime/model/internal/weight_init.h"

namespace kiln {
namespace {

// Fills `n` bf16 values; each thread writes 8 consecutive values with one 16-byte store
// (tensor offsets are 256-byte aligned; a ragged tail is written element by element).
__global__ void FillUniformKernel(uint16_t* __restrict__ out, int64_t n, internal::UniformInit init) {
  const int64_t first = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 8;
  if (first >= n) return;
  if (first + 8 <= n) {
    uint16_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = internal::InitValueBits(init, static_cast<uint64_t>(first + i));
    uint4 packed;
    packed.x = v[0] | (uint32_t{v[1]} << 16);
    packed.y = v[2] | (uint32_t{v[3]} << 16);
    packed.z = v[4] | (uint32_t{v[5]} << 16);
    packed.w = v[6] | (uint32_t{v[7]} << 16);
    *reinterpret_cast<uint4*>(out + first) = packed;
  } else {
    for (int64_t i = first; i < n; ++i) out[i] = internal::InitValueBits(init, static_cast<uint64_t>(i));
  }
}

}  // namespace

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::Allocate(const LlamaShape& shape) {
  ASSIGN_OR_RETURN(LlamaWeightLayout layout, LlamaWeightLayout::Create(shape));
  LlamaDeviceWeights weights;
  ASSIGN_OR_RETURN(weights.buffer_, DeviceBuffer::Allocate(layout.total_bytes(), "Llama weights"));
  weights.layout_ = std::move(layout);
  return weights;
}

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::Random(const LlamaShape& shape,
                                                              uint64_t seed, cudaStream_t stream) {
  ASSIGN_OR_RETURN(LlamaDeviceWeights weights, Allocate(shape));
  // Padding between tensors is zero, as on the host.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(weights.buffer_.data(), 0, weights.buffer_.size(), stream));
  for (const WeightTensor& t : weights.layout_.tensors()) {
    const WeightInitRange range = InitRangeFor(t);
    const internal::UniformInit init =
        internal::MakeUniformInit(seed, t.index, range.amplitude, range.centre);
    const int64_t n = t.elements();
    constexpr int kThreads = 256;
    const int64_t blocks = (n + 8 * kThreads - 1) / (8 * kThreads);
    uint16_t* out = reinterpret_cast<uint16_t*>(static_cast<char*>(weights.buffer_.data()) + t.offset);
    FillUniformKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out, n, init);
    RETURN_IF_ERROR(ToStatus(cudaGetLastError(), absl::StrCat("random init of weight '", t.name, "'")));
  }
  return weights;
}

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::Upload(const LlamaHostWeights& host,
                                                              cudaStream_t stream) {
  if (host.data.size() * 2 != host.layout.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaHostWeights hold ", host.data.size() * 2, " bytes but their layout needs ",
        host.layout.total_bytes(), "; build them with ReadLlamaSafetensors or "
        "RandomLlamaHostWeights"));
  }
  ASSIGN_OR_RETURN(LlamaDeviceWeights weights, Allocate(host.layout.shape()));
  RETURN_IF_ERROR(CopyHostToDevice(weights.buffer_.data(), host.data.data(),
                                   weights.buffer_.size(), stream));
  RETURN_IF_ERROR(CheckNotCapturing(stream, "LlamaDeviceWeights::Upload"));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return weights;
}

absl::StatusOr<LlamaHostWeights> LlamaDeviceWeights::Download(cudaStream_t stream) const {
  RETURN_IF_ERROR(CheckNotCapturing(stream, "LlamaDeviceWeights::Download"));
  LlamaHostWeights host;
  host.layout = layout_;
  host.data.resize(buffer_.size() / 2);
  RETURN_IF_ERROR(CopyDeviceToHost(host.data.data(), buffer_.data(), buffer_.size(), stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace kiln
