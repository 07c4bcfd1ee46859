// The weights of a Llama decoder on the GPU: one device allocation in LlamaWeightLayout's
// layout, filled from host weights, straight from a checkpoint's files (Load) or by the seeded
// random initialiser.
//
//   ASSIGN_OR_RETURN(kiln::LlamaDeviceWeights w,
//                    kiln::LlamaDeviceWeights::Random(kiln::LlamaShape::Llama1B(), /*seed=*/1,
//                                                     stream));
//   RETURN_IF_ERROR(gemm.Run(x, w.qkv(layer), qkv, n, shape.qkv_rows(), shape.hidden, stream));
//
// Random(seed) writes exactly the bits RandomLlamaHostWeights(shape, seed) computes on the
// host (the initialiser is a pure function of seed, tensor and index), so a test can run the
// CPU reference on the same weights without copying gigabytes back. Creating or filling the
// weights allocates and is not callable during capture; the accessors are, and the pointers
// stay valid for the object's lifetime (the graphs that read them must not outlive it).
// Movable, not copyable; not thread-safe to fill, safe to read from many threads.
#ifndef KILN_RUNTIME_MODEL_DEVICE_WEIGHTS_H_
#define KILN_RUNTIME_MODEL_DEVICE_WEIGHTS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/llama_checkpoint.h"
#include "runtime/model/llama_shape.h"
#include "runtime/model/llama_weights.h"

namespace kiln {

// How LlamaDeviceWeights::Load reads: `threads` threads each read every threads-th chunk of the
// files into one of its two pinned stages of `staging_bytes` (at least one row of the widest
// tensor) while the other's copy to the GPU runs, so host memory holds 2 × threads stages
// whatever the model's size.
struct WeightLoadOptions {
  int threads = 4;
  size_t staging_bytes = size_t{32} << 20;
};

class LlamaDeviceWeights {
 public:
  // Allocates the weights for `shape` and fills them with the seeded values on `stream`
  // (asynchronous; order later work on the same stream).
  static absl::StatusOr<LlamaDeviceWeights> Random(const LlamaShape& shape, uint64_t seed,
                                                   cudaStream_t stream);

  // Allocates rank `rank`'s shard of the seeded random weights of `full` split over `tp_size`
  // ranks (runtime/model/tensor_parallel.h; laid out for RankShape(full, tp_size)) and fills it
  // on `stream` (asynchronous) with exactly the bits
  // ShardLlamaHostWeights(RandomLlamaHostWeights(full, seed), tp_size, rank) holds, so every
  // tensor-parallel size runs the same logical model. InvalidArgument, before anything is
  // allocated or enqueued, when `full` does not split or `rank` is outside [0, tp_size).
  static absl::StatusOr<LlamaDeviceWeights> RandomShard(const LlamaShape& full, int tp_size,
                                                        int rank, uint64_t seed,
                                                        cudaStream_t stream);

  // Allocates the weights and copies `host` in (waits for the copy: `host` may be freed after).
  static absl::StatusOr<LlamaDeviceWeights> Upload(const LlamaHostWeights& host,
                                                   cudaStream_t stream);

  // Allocates the weights of `reader`'s rank and streams its blocks from the files to the GPU on
  // `stream` as `options` says. Waits for the last copy; `progress` (optional) follows the bytes,
  // called from the reading threads one at a time. The bits of Upload(ReadLlamaSafetensorsShard(
  // ...)). DataLoss if a file shrank since the reader opened it; InvalidArgument for threads < 1;
  // FailedPrecondition during capture.
  static absl::StatusOr<LlamaDeviceWeights> Load(const LlamaShardReader& reader,
                                                 cudaStream_t stream,
                                                 const ReadProgress& progress = nullptr,
                                                 const WeightLoadOptions& options = {});

  // Copies the weights back to the host (waits for the copy).
  absl::StatusOr<LlamaHostWeights> Download(cudaStream_t stream) const;

  LlamaDeviceWeights() = default;
  LlamaDeviceWeights(LlamaDeviceWeights&&) = default;
  LlamaDeviceWeights& operator=(LlamaDeviceWeights&&) = default;

  const LlamaWeightLayout& layout() const { return layout_; }
  const LlamaShape& shape() const { return layout_.shape(); }
  // Returns the device bytes the weights occupy.
  size_t bytes() const { return buffer_.size(); }

  // Returns the device address of `t` (a tensor of this layout).
  const __nv_bfloat16* tensor(const WeightTensor& t) const {
    return reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(buffer_.data()) +
                                                  t.offset);
  }
  // The tensors, with their shapes.
  // [vocab, hidden]
  const __nv_bfloat16* embedding() const { return tensor(layout_.embedding()); }
  // [hidden]
  const __nv_bfloat16* input_norm(int l) const { return tensor(layout_.input_norm(l)); }
  // [qkv_rows, hidden]
  const __nv_bfloat16* qkv(int l) const { return tensor(layout_.qkv(l)); }
  // [hidden, q_width]
  const __nv_bfloat16* o(int l) const { return tensor(layout_.o(l)); }
  // [hidden]
  const __nv_bfloat16* post_norm(int l) const { return tensor(layout_.post_norm(l)); }
  // [2 ffn, hidden]
  const __nv_bfloat16* gate_up(int l) const { return tensor(layout_.gate_up(l)); }
  // [hidden, ffn]
  const __nv_bfloat16* down(int l) const { return tensor(layout_.down(l)); }
  // [hidden]
  const __nv_bfloat16* final_norm() const { return tensor(layout_.final_norm()); }
  // [vocab, hidden]
  const __nv_bfloat16* lm_head() const { return tensor(layout_.lm_head()); }
  // [qkv_rows], or nullptr for a shape without qkv_bias
  const __nv_bfloat16* qkv_bias(int l) const {
    return shape().qkv_bias ? tensor(layout_.qkv_bias(l)) : nullptr;
  }
  // [head_dim] each, or nullptr for a shape without qk_norm
  const __nv_bfloat16* q_norm(int l) const {
    return shape().qk_norm ? tensor(layout_.q_norm(l)) : nullptr;
  }
  const __nv_bfloat16* k_norm(int l) const {
    return shape().qk_norm ? tensor(layout_.k_norm(l)) : nullptr;
  }

 private:
  // Allocates the region of `layout` (from LlamaWeightLayout::Create), which the weights keep:
  // moved in, it is taken over; passed as an lvalue, it is copied (one name per tensor).
  static absl::StatusOr<LlamaDeviceWeights> Allocate(LlamaWeightLayout layout);
  LlamaWeightLayout layout_;
  DeviceBuffer buffer_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_DEVICE_WEIGHTS_H_
