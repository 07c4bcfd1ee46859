// Loads Llama weights from Hugging Face safetensors files into kiln's fused layout, and writes
// kiln weights back out under Hugging Face names.
//
//   ASSIGN_OR_RETURN(kiln::LlamaHostWeights w,
//                    kiln::ReadLlamaSafetensors({"/models/llama-1b/model.safetensors"},
//                                               kiln::LlamaShape::Llama1B()));
//   ASSIGN_OR_RETURN(kiln::LlamaDeviceWeights dw, kiln::LlamaDeviceWeights::Upload(w, stream));
//   // Rank 1 of 4: its heads' QKV rows, its O columns, ... (a quarter of those bytes read).
//   ASSIGN_OR_RETURN(kiln::LlamaHostWeights mine,
//                    kiln::ReadLlamaSafetensorsShard(paths, shape_70b, 4, 1));
//
// Names (HF LlamaForCausalLM): model.embed_tokens.weight,
// model.layers.{l}.input_layernorm.weight, model.layers.{l}.self_attn.{q,k,v,o}_proj.weight,
// model.layers.{l}.post_attention_layernorm.weight,
// model.layers.{l}.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight (only when
// the shape does not tie embeddings). q, k and v are fused row-wise into qkv, gate and up into
// gate_up. With LlamaShape::qkv_bias (Qwen2), model.layers.{l}.self_attn.{q,k,v}_proj.bias too,
// fused into qkv_bias; with LlamaShape::qk_norm (Qwen3), model.layers.{l}.self_attn.{q,k}_norm.weight.
// HF's q/k rows are already in rotate-half order, which is the RoPE kiln
// applies.
// Tensors named *.rotary_emb.inv_freq (buffers some old checkpoints carry) are ignored.
//
// Every tensor must be BF16, or F16 or F32 (each value rounded to the nearest bf16 as it is read:
// kiln's model runs bf16), with exactly the shape LlamaShape implies; a missing, unexpected or
// duplicated name, a wrong shape or another dtype is InvalidArgument naming the tensor, what was
// expected and which LlamaShape field to check; so is a finite F32 value too large for bf16 (it
// would load as infinity); a truncated or corrupt file is DataLoss. Messages quote tensor names as
// 'name' and paths as "path", with quoted.h's escapes, so each stays one clean line.
// Host-only; thread-compatible.
#ifndef KILN_RUNTIME_MODEL_LLAMA_CHECKPOINT_H_
#define KILN_RUNTIME_MODEL_LLAMA_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/model/llama_shape.h"
#include "runtime/model/llama_weights.h"
#include "runtime/model/safetensors.h"

namespace kiln {

// One HF tensor and the rows of a kiln tensor it fills.
struct HfTensorSlice {
  std::string hf_name;        // "model.layers.0.self_attn.k_proj.weight"
  int tensor_index = 0;       // index into LlamaWeightLayout::tensors()
  int64_t first_row = 0;      // first row of the kiln tensor this HF tensor fills
  int64_t rows = 0;
  int64_t cols = 0;           // 0 for a 1-D tensor (a norm weight)
  std::string dims;           // what the shape is made of: "[kv_heads * head_dim, hidden]"
};

// Returns the HF tensors that make up `layout`, in file order (none for a default-constructed
// layout, which has no tensors).
std::vector<HfTensorSlice> HfTensorSlices(const LlamaWeightLayout& layout);

// Called after each block of rows is read with the bytes read so far and the total (the same
// every call); the last call has bytes_read == total_bytes.
using ReadProgress = std::function<void(int64_t bytes_read, int64_t total_bytes)>;

// One rank's shard of a checkpoint, checked and ready to read: the files' headers matched against
// the whole model's shape (every name, dtype and shape, as above) and, for each of the rank's
// tensors, the blocks of rows it reads (tensor_parallel.h's split; the whole model at one rank).
// ReadLlamaSafetensorsShard reads them into host memory; LlamaDeviceWeights::Load
// (device_weights.h) streams them to the GPU through small pinned buffers. Host-only; move-only
// (the blocks point into the reader's files); reading is const and may run from several threads.
class LlamaShardReader {
 public:
  // A run of rows of one of the rank's tensors, all from one HF tensor.
  struct Block {
    int tensor_index = 0;   // into layout().tensors()
    int64_t local_row = 0;  // the first row it fills in the rank's tensor
    int64_t rows = 0;
    const SafetensorsReader* file = nullptr;
    const SafetensorsTensor* tensor = nullptr;
    int source_bytes = 2;     // of one value in the file: 2 (BF16, F16) or 4 (F32)
    uint64_t offset = 0;      // byte of the first row's first value within the HF tensor
    uint64_t row_stride = 0;  // bytes of one of the HF tensor's rows
  };

  // Opens the files and checks them against `shape` (the whole model's) for rank `rank` of
  // `tp_size`: InvalidArgument as ReadLlamaSafetensors and ShardMapFor describe and for a path
  // that is not a regular file (a directory, a FIFO, a device), DataLoss for a corrupt header,
  // NotFound for a missing file.
  static absl::StatusOr<LlamaShardReader> Open(absl::Span<const std::string> paths,
                                               const LlamaShape& shape, int tp_size = 1,
                                               int rank = 0);

  LlamaShardReader(LlamaShardReader&&) = default;
  LlamaShardReader& operator=(LlamaShardReader&&) = default;
  LlamaShardReader(const LlamaShardReader&) = delete;
  LlamaShardReader& operator=(const LlamaShardReader&) = delete;

  // The rank's layout (RankShape of the whole shape).
  const LlamaWeightLayout& layout() const { return layout_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  // The bytes the blocks hold: the rank's tensors without the layout's alignment.
  int64_t bytes() const { return bytes_; }
  // The dtypes other than BF16 among the rank's tensors ("F16", "F32"), converted as they are read.
  const std::set<std::string>& converted_dtypes() const { return converted_; }

  // Reads rows [first, first + rows) of `block` (counted from its first row) into `dst`, packed:
  // rows × the tensor's cols bf16 values (F16 and F32 rounded to nearest, ties to even).
  // InvalidArgument for rows outside the block, for a block that is not one of blocks() (of this
  // reader, copies included) and for a finite F32 value beyond bf16's range; DataLoss if a file
  // shrank since Open.
  absl::Status ReadRows(const Block& block, int64_t first, int64_t rows, uint16_t* dst) const;

 private:
  LlamaShardReader() = default;

  LlamaWeightLayout layout_;
  std::vector<SafetensorsReader> files_;  // the blocks point into these
  std::vector<Block> blocks_;
  int64_t bytes_ = 0;
  std::set<std::string> converted_;
};

// Reads the weights for `shape` from one or more safetensors files (the shards of one
// checkpoint; every tensor must appear in exactly one of them). Every name, dtype and shape is
// checked before any tensor data is read; `progress` (optional) follows the data's reading.
absl::StatusOr<LlamaHostWeights> ReadLlamaSafetensors(absl::Span<const std::string> paths,
                                                      const LlamaShape& shape,
                                                      const ReadProgress& progress = nullptr);

// Reads rank `rank`'s shard of a tensor-parallel split over `tp_size` ranks (tensor_parallel.h)
// straight from the files: the same bits as ShardLlamaHostWeights of ReadLlamaSafetensors' result,
// with 1 / tp_size of the column- and row-parallel projections read and held instead of the whole
// model. `shape` is the whole model's; the checks are ReadLlamaSafetensors' (on the whole
// checkpoint's names, dtypes and shapes) and ShardMapFor's; `progress` counts this rank's bytes.
absl::StatusOr<LlamaHostWeights> ReadLlamaSafetensorsShard(absl::Span<const std::string> paths,
                                                           const LlamaShape& shape, int tp_size,
                                                           int rank,
                                                           const ReadProgress& progress = nullptr);

// Writes `weights` to one safetensors file under HF names (q/k/v and gate/up unfused), as BF16
// or, widened exactly, as F32 (a float32 checkpoint of the same model). InvalidArgument for
// another dtype and for weights that LlamaHostWeights::Validate refuses.
absl::Status WriteLlamaSafetensors(const std::string& path, const LlamaHostWeights& weights,
                                   absl::string_view dtype = "BF16");

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_LLAMA_CHECKPOINT_H_
