#include "runtime/model/llama_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "runtime/config/quoted.h"
#include "runtime/cuda/status_macros.h"
#include "runtime/model/bf16.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_parallel.h"

namespace kiln {
namespace {

// Quotes a tensor name from a file or the caller for a message: '...', escaped (a name may hold a
// newline or a NUL; JSON allows both). Paths are Quoted: "...", as safetensors.cc quotes them.
std::string Quote(absl::string_view text) { return Quoted(text, '\''); }

std::vector<int64_t> SliceShape(const HfTensorSlice& s) {
  if (s.cols == 0) return {s.rows};
  return {s.rows, s.cols};
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The bytes of one value of a dtype the reader takes (BF16 as it is, F16 and F32 rounded to bf16),
// or 0 for any other.
int SourceBytes(absl::string_view dtype) {
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "F32") return 4;
  return 0;
}

// Explains why `name` is not part of the checkpoint `shape` describes.
std::string UnexpectedReason(absl::string_view name, const LlamaShape& shape) {
  if (name == "lm_head.weight" && shape.tie_embeddings) {
    return "the LlamaShape ties the LM head to the embedding; set tie_embeddings = false to load "
           "a separate lm_head.weight";
  }
  if (!shape.qkv_bias && absl::EndsWith(name, "_proj.bias")) {
    return "the LlamaShape has no QKV bias; set qkv_bias = true (config.json's attention_bias, "
           "which Qwen2 models have) to load it";
  }
  if (!shape.qk_norm &&
      (absl::EndsWith(name, "self_attn.q_norm.weight") || absl::EndsWith(name, "self_attn.k_norm.weight"))) {
    return "the LlamaShape has no QK norm; set qk_norm = true (Qwen3 models have it) to load it";
  }
  constexpr absl::string_view kLayers = "model.layers.";
  if (absl::StartsWith(name, kLayers)) {
    absl::string_view rest = name.substr(kLayers.size());
    int layer = -1;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer) && layer >= shape.layers) {
      return absl::StrCat("it belongs to layer ", layer, " but LlamaShape.layers is ",
                          shape.layers, "; set layers to the checkpoint's num_hidden_layers");
    }
  }
  return "kiln's Llama decoder has no such weight; check that the checkpoint is a "
         "LlamaForCausalLM with HF names";
}

}  // namespace

std::vector<HfTensorSlice> HfTensorSlices(const LlamaWeightLayout& layout) {
  const LlamaShape& s = layout.shape();
  std::vector<HfTensorSlice> slices;
  if (layout.tensors().empty()) return slices;  // default-constructed: no tensors to name
  auto add = [&](std::string name, const WeightTensor& t, int64_t first_row, int64_t rows,
                 std::string dims) {
    HfTensorSlice slice;
    slice.hf_name = std::move(name);
    slice.tensor_index = t.index;
    slice.first_row = first_row;
    slice.rows = rows;
    slice.cols = t.kind == WeightKind::kNorm || t.kind == WeightKind::kBias ? 0 : t.cols;
    slice.dims = std::move(dims);
    slices.push_back(std::move(slice));
  };
  add("model.embed_tokens.weight", layout.embedding(), 0, s.vocab, "[vocab, hidden]");
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", layout.input_norm(l), 0, s.hidden, "[hidden]");
    add(p + "self_attn.q_proj.weight", layout.qkv(l), 0, s.q_width(),
        "[heads * head_dim, hidden]");
    add(p + "self_attn.k_proj.weight", layout.qkv(l), s.q_width(), s.kv_width(),
        "[kv_heads * head_dim, hidden]");
    add(p + "self_attn.v_proj.weight", layout.qkv(l), s.q_width() + s.kv_width(), s.kv_width(),
        "[kv_heads * head_dim, hidden]");
    if (s.qkv_bias) {
      add(p + "self_attn.q_proj.bias", layout.qkv_bias(l), 0, s.q_width(), "[heads * head_dim]");
      add(p + "self_attn.k_proj.bias", layout.qkv_bias(l), s.q_width(), s.kv_width(),
          "[kv_heads * head_dim]");
      add(p + "self_attn.v_proj.bias", layout.qkv_bias(l), s.q_width() + s.kv_width(),
          s.kv_width(), "[kv_heads * head_dim]");
    }
    if (s.qk_norm) {
      add(p + "self_attn.q_norm.weight", layout.q_norm(l), 0, s.head_dim, "[head_dim]");
      add(p + "self_attn.k_norm.weight", layout.k_norm(l), 0, s.head_dim, "[head_dim]");
    }
    add(p + "self_attn.o_proj.weight", layout.o(l), 0, s.hidden, "[hidden, heads * head_dim]");
    add(p + "post_attention_layernorm.weight", layout.post_norm(l), 0, s.hidden, "[hidden]");
    add(p + "mlp.gate_proj.weight", layout.gate_up(l), 0, s.ffn, "[ffn, hidden]");
    add(p + "mlp.up_proj.weight", layout.gate_up(l), s.ffn, s.ffn, "[ffn, hidden]");
    add(p + "mlp.down_proj.weight", layout.down(l), 0, s.hidden, "[hidden, ffn]");
  }
  add("model.norm.weight", layout.final_norm(), 0, s.hidden, "[hidden]");
  if (!s.tie_embeddings) add("lm_head.weight", layout.lm_head(), 0, s.vocab, "[vocab, hidden]");
  return slices;
}

absl::StatusOr<LlamaShardReader> LlamaShardReader::Open(absl::Span<const std::string> paths,
                                                        const LlamaShape& shape, int tp_size,
                                                        int rank) {
  if (paths.empty()) {
    return absl::InvalidArgumentError(
        "No safetensors files given; pass the checkpoint's model*.safetensors files");
  }
  // Each tensor's rows and columns this rank holds (the whole tensor without a split).
  ASSIGN_OR_RETURN(LlamaWeightLayout full_layout, LlamaWeightLayout::Create(shape));
  // At one rank every map is the identity.
  ASSIGN_OR_RETURN(const LlamaShape local_shape, RankShape(shape, tp_size));
  ASSIGN_OR_RETURN(const std::vector<WeightShardMap> maps, ShardMapsFor(shape, tp_size, rank));
  LlamaShardReader out;
  out.files_.reserve(paths.size());
  for (const std::string& path : paths) {
    // SafetensorsReader refuses a path that is not a regular file before opening it.
    ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
    out.files_.push_back(std::move(reader));
  }
  // Name → (reader, tensor); a name in two shards is ambiguous.
  absl::flat_hash_map<std::string, std::pair<const SafetensorsReader*, const SafetensorsTensor*>>
      found;
  for (const SafetensorsReader& reader : out.files_) {
    for (const SafetensorsTensor& t : reader.tensors()) {
      auto [it, inserted] = found.try_emplace(t.name, &reader, &t);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("Checkpoint tensor ", Quote(t.name), " appears in both ",
                         Quoted(it->second.first->path()), " and ", Quoted(reader.path()),
                         "; pass each shard of one checkpoint once"));
      }
    }
  }
  const std::vector<HfTensorSlice> slices = HfTensorSlices(full_layout);
  absl::flat_hash_map<std::string, const HfTensorSlice*> expected;
  for (const HfTensorSlice& s : slices) expected[s.hf_name] = &s;

  // Unexpected names first: a checkpoint for a different shape usually shows up here with the
  // most useful message (extra layers, an lm_head the shape ties away).
  std::vector<std::string> names;
  for (const auto& [name, where] : found) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (expected.contains(name) || absl::EndsWith(name, ".rotary_emb.inv_freq")) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("Checkpoint tensor ", Quote(name), " in ", Quoted(found[name].first->path()),
                     " is unexpected: ", UnexpectedReason(name, shape)));
  }
  for (const HfTensorSlice& s : slices) {
    auto it = found.find(s.hf_name);
    if (it == found.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Checkpoint lacks tensor ", Quote(s.hf_name), " that a Llama with ", shape.ToString(),
          " needs; check LlamaShape (layers, tie_embeddings) and that every shard is given"));
    }
    const SafetensorsTensor& t = *it->second.second;
    if (SourceBytes(t.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Checkpoint tensor ", Quote(s.hf_name), " has dtype ", t.dtype,
          "; kiln loads BF16 weights, and F16 or F32 ones converted to BF16: convert the "
          "checkpoint to bfloat16 (for example model.to(torch.bfloat16).save_pretrained(...))"));
    }
    const std::vector<int64_t> want = SliceShape(s);
    if (t.shape != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("Checkpoint tensor ", Quote(s.hf_name), " has shape ", t.ShapeString(),
                       " but LlamaShape needs ", s.dims, " = ", ShapeString(want),
                       "; set those LlamaShape fields to the checkpoint's "
                       "config.json values"));
    }
  }
  ASSIGN_OR_RETURN(out.layout_, LlamaWeightLayout::Create(local_shape));
  // What this rank reads of each HF tensor: for each run of rows its map keeps, the rows the
  // tensor covers, each read as the rank's columns from column col_offset of a full row.
  for (const HfTensorSlice& s : slices) {
    const WeightShardMap& map = maps[s.tensor_index];
    const int64_t cols = out.layout_.tensors()[s.tensor_index].cols;
    const auto& [file, tensor] = found[s.hf_name];
    for (const WeightShardMap::Rows& run : map.rows) {
      const int64_t begin = std::max(run.full_first, s.first_row);
      const int64_t end = std::min(run.full_first + run.count, s.first_row + s.rows);
      if (begin >= end) continue;
      Block b;
      b.tensor_index = s.tensor_index;
      b.local_row = run.local_first + (begin - run.full_first);
      b.rows = end - begin;
      b.file = file;
      b.tensor = tensor;
      b.source_bytes = SourceBytes(tensor->dtype);
      b.row_stride = static_cast<uint64_t>(map.full_cols) * b.source_bytes;
      b.offset = static_cast<uint64_t>(begin - s.first_row) * b.row_stride +
                 static_cast<uint64_t>(map.col_offset) * b.source_bytes;
      if (tensor->dtype != "BF16") out.converted_.insert(tensor->dtype);
      out.blocks_.push_back(b);
      out.bytes_ += b.rows * cols * 2;
    }
  }
  return out;
}

absl::Status LlamaShardReader::ReadRows(const Block& block, int64_t first, int64_t rows,
                                        uint16_t* dst) const {
  // A Block is a plain struct a caller could forge or take from another reader; its fields decide
  // how many bytes land in `dst` and where a file is read, so check that it is one of ours.
  const std::less<const void*> before;
  const bool ours =
      block.tensor_index >= 0 &&
      block.tensor_index < static_cast<int>(layout_.tensors().size()) &&
      block.file != nullptr && !before(block.file, files_.data()) &&
      before(block.file, files_.data() + files_.size()) && block.tensor != nullptr &&
      !before(block.tensor, block.file->tensors().data()) &&
      before(block.tensor, block.file->tensors().data() + block.file->tensors().size()) &&
      block.source_bytes == SourceBytes(block.tensor->dtype) && block.rows >= 0 &&
      block.row_stride > 0;
  if (!ours) {
    return absl::InvalidArgumentError(
        "The block is not one of this LlamaShardReader's; pass one of its blocks()");
  }
  // rows > block.rows - first, not first + rows > block.rows: the sum may overflow.
  if (first < 0 || rows < 0 || first > block.rows || rows > block.rows - first) {
    return absl::InvalidArgumentError(absl::StrCat(rows, " rows from row ", first,
                                                   " are outside the block's ", block.rows,
                                                   "; read rows within [0, ", block.rows, ")"));
  }
  const int64_t cols = layout_.tensors()[block.tensor_index].cols;
  auto read = [&](int64_t from, int64_t count, void* to) {
    return block.file->ReadStrided(
        *block.tensor, block.offset + static_cast<uint64_t>(from) * block.row_stride,
        static_cast<uint64_t>(cols) * block.source_bytes, block.row_stride, count, to);
  };
  if (block.tensor->dtype == "BF16") return read(first, rows, dst);
  // F16 or F32: read a few MiB of rows at a time and round each value to bf16.
  const int64_t row_bytes = cols * block.source_bytes;
  const int64_t rows_per_read = std::max<int64_t>(1, (int64_t{8} << 20) / row_bytes);
  std::vector<char> raw(static_cast<size_t>(std::min(rows, rows_per_read) * row_bytes));
  const bool half = block.source_bytes == 2;
  for (int64_t done = 0; done < rows; done += rows_per_read) {
    const int64_t count = std::min(rows_per_read, rows - done);
    RETURN_IF_ERROR(read(first + done, count, raw.data()));
    uint16_t* out = dst + done * cols;
    for (int64_t i = 0; i < count * cols; ++i) {
      float value;
      if (half) {
        uint16_t bits;
        std::memcpy(&bits, raw.data() + 2 * i, 2);
        value = Fp16BitsToFloat(bits);
      } else {
        std::memcpy(&value, raw.data() + 4 * i, 4);
      }
      out[i] = FloatToBf16Bits(value);
      // An F32 value above bfloat16's largest (about 3.39e38) rounds to infinity: a finite weight
      // would load as inf and silently turn the model's outputs into NaN. (F16 values all fit.)
      if ((out[i] & 0x7fffu) == 0x7f80u && std::isfinite(value)) {
        const uint64_t hf_row = block.offset / block.row_stride +
                                static_cast<uint64_t>(first + done + i / cols);
        const uint64_t hf_col =
            block.offset % block.row_stride / static_cast<uint64_t>(block.source_bytes) +
            static_cast<uint64_t>(i % cols);
        return absl::InvalidArgumentError(absl::StrCat(
            "Checkpoint tensor ", Quote(block.tensor->name), " holds ", value, " at [", hf_row,
            ", ", hf_col, "], beyond bfloat16's largest finite value 3.38953e+38, so it would "
            "load as infinity; kiln runs bf16 weights: fix or rescale that tensor"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaHostWeights> ReadLlamaSafetensors(absl::Span<const std::string> paths,
                                                      const LlamaShape& shape,
                                                      const ReadProgress& progress) {
  return ReadLlamaSafetensorsShard(paths, shape, 1, 0, progress);
}

absl::StatusOr<LlamaHostWeights> ReadLlamaSafetensorsShard(absl::Span<const std::string> paths,
                                                           const LlamaShape& shape, int tp_size,
                                                           int rank,
                                                           const ReadProgress& progress) {
  ASSIGN_OR_RETURN(LlamaShardReader reader, LlamaShardReader::Open(paths, shape, tp_size, rank));
  // Allocated only once the files are known to fit the shape, in the reader's rank layout: a
  // copy, since the reader keeps its own for ReadRows.
  ASSIGN_OR_RETURN(LlamaHostWeights weights, ZeroLlamaHostWeights(reader.layout()));
  int64_t bytes_read = 0;
  for (const LlamaShardReader::Block& b : reader.blocks()) {
    const WeightTensor& dst = weights.layout.tensors()[b.tensor_index];
    RETURN_IF_ERROR(
        reader.ReadRows(b, 0, b.rows, weights.mutable_tensor(dst) + b.local_row * dst.cols));
    bytes_read += b.rows * dst.cols * 2;
    if (progress) progress(bytes_read, reader.bytes());
  }
  return weights;
}

absl::Status WriteLlamaSafetensors(const std::string& path, const LlamaHostWeights& weights,
                                   absl::string_view dtype) {
  if (dtype != "BF16" && dtype != "F32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteLlamaSafetensors writes dtype BF16 or F32 (each bf16 value exactly), not ",
        Quoted(dtype)));
  }
  RETURN_IF_ERROR(weights.Validate());
  const std::vector<HfTensorSlice> slices = HfTensorSlices(weights.layout);
  const bool widen = dtype == "F32";
  std::vector<std::vector<float>> widened;  // F32 only: each tensor's values
  widened.reserve(widen ? slices.size() : 0);
  std::vector<SafetensorsEntry> entries;
  for (const HfTensorSlice& s : slices) {
    const WeightTensor& t = weights.layout.tensors()[s.tensor_index];
    const uint16_t* bits = weights.tensor(t) + s.first_row * t.cols;
    const size_t count = static_cast<size_t>(s.rows * t.cols);
    SafetensorsEntry e;
    e.name = s.hf_name;
    e.dtype = std::string(dtype);
    e.shape = SliceShape(s);
    if (widen) {
      std::vector<float>& values = widened.emplace_back(count);
      for (size_t i = 0; i < count; ++i) values[i] = Bf16BitsToFloat(bits[i]);
      e.data = values.data();
      e.bytes = count * 4;
    } else {
      e.data = bits;
      e.bytes = count * 2;
    }
    entries.push_back(std::move(e));
  }
  return WriteSafetensors(path, entries, {{"format", "pt"}});
}

}  // namespace kiln
