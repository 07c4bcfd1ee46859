#include "runtime/model/device_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda/capture_check.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/status.h"
#include "runtime/model/internal/weight_init.h"
#include "runtime/model/tensor_parallel.h"

namespace kiln {
namespace {

// Fills `n` bf16 values; each thread writes 8 consecutive values with one 16-byte store
// (tensor offsets are 256-byte aligned; a ragged tail is written element by element).
__global__ void FillUniformKernel(uint16_t* __restrict__ out, int64_t n,
                                  internal::UniformInit init) {
  const int64_t first = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 8;
  if (first >= n) return;
  if (first + 8 <= n) {
    uint16_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[i] = internal::InitValueBits(init, static_cast<uint64_t>(first + i));
    }
    uint4 packed;
    packed.x = v[0] | (uint32_t{v[1]} << 16);
    packed.y = v[2] | (uint32_t{v[3]} << 16);
    packed.z = v[4] | (uint32_t{v[5]} << 16);
    packed.w = v[6] | (uint32_t{v[7]} << 16);
    *reinterpret_cast<uint4*>(out + first) = packed;
  } else {
    for (int64_t i = first; i < n; ++i) {
      out[i] = internal::InitValueBits(init, static_cast<uint64_t>(i));
    }
  }
}

// Where a shard's rows come from (tensor_parallel.h's WeightShardMap, flattened for a kernel).
struct ShardFillArgs {
  int64_t local_cols = 0;
  int num_runs = 0;
  int64_t local_first[3] = {};
  int64_t full_first[3] = {};
  int64_t count[3] = {};
  int64_t full_cols = 0;
  int64_t col_offset = 0;
};

// Fills `n` bf16 values of a shard with the values the full tensor has at the same places: the
// initialiser is a function of the full tensor's flat index, so no full copy is ever made.
__global__ void FillUniformShardKernel(uint16_t* __restrict__ out, int64_t n, ShardFillArgs a,
                                       internal::UniformInit init) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t row = i / a.local_cols;
    const int64_t col = i - row * a.local_cols;
    int64_t full_row = row;
    for (int k = 0; k < a.num_runs; ++k) {
      if (row >= a.local_first[k] && row < a.local_first[k] + a.count[k]) {
        full_row = a.full_first[k] + (row - a.local_first[k]);
      }
    }
    out[i] = internal::InitValueBits(
        init, static_cast<uint64_t>(full_row * a.full_cols + a.col_offset + col));
  }
}

}  // namespace

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::RandomShard(const LlamaShape& full,
                                                                   int tp_size, int rank,
                                                                   uint64_t seed,
                                                                   cudaStream_t stream) {
  ASSIGN_OR_RETURN(LlamaShape local, RankShape(full, tp_size));
  ASSIGN_OR_RETURN(LlamaWeightLayout full_layout, LlamaWeightLayout::Create(full));
  // Every tensor's map, with the split and the rank checked once: a bad rank is refused here,
  // before the weights are allocated and the stream is given any work.
  ASSIGN_OR_RETURN(const std::vector<WeightShardMap> maps, ShardMapsFor(full, tp_size, rank));
  ASSIGN_OR_RETURN(LlamaWeightLayout local_layout, LlamaWeightLayout::Create(local));
  ASSIGN_OR_RETURN(LlamaDeviceWeights weights, Allocate(std::move(local_layout)));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(weights.buffer_.data(), 0, weights.buffer_.size(), stream));
  for (const WeightTensor& t : weights.layout_.tensors()) {
    const WeightShardMap& map = maps[t.index];
    // The full tensor decides the range (its fan-in) and the stream (its index).
    const WeightTensor& full_tensor = full_layout.tensors()[t.index];
    const WeightInitRange range = InitRangeFor(full_tensor);
    const internal::UniformInit init =
        internal::MakeUniformInit(seed, full_tensor.index, range.amplitude, range.centre);
    const int64_t n = t.elements();
    constexpr int kThreads = 256;
    uint16_t* out =
        reinterpret_cast<uint16_t*>(static_cast<char*>(weights.buffer_.data()) + t.offset);
    if (map.identity) {
      const int64_t blocks = (n + 8 * kThreads - 1) / (8 * kThreads);
      FillUniformKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out, n, init);
    } else {
      ShardFillArgs args;
      args.local_cols = t.cols;
      args.num_runs = static_cast<int>(map.rows.size());
      for (int k = 0; k < args.num_runs && k < 3; ++k) {
        args.local_first[k] = map.rows[k].local_first;
        args.full_first[k] = map.rows[k].full_first;
        args.count[k] = map.rows[k].count;
      }
      args.full_cols = map.full_cols;
      args.col_offset = map.col_offset;
      const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 8192);
      FillUniformShardKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out, n, args,
                                                                                    init);
    }
    RETURN_IF_ERROR(
        ToStatus(cudaGetLastError(), absl::StrCat("random init of weight shard '", t.name, "'")));
  }
  return weights;
}

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::Allocate(LlamaWeightLayout layout) {
  LlamaDeviceWeights weights;
  ASSIGN_OR_RETURN(weights.buffer_, DeviceBuffer::Allocate(layout.total_bytes(), "Llama weights"));
  weights.layout_ = std::move(layout);
  return weights;
}

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::Random(const LlamaShape& shape,
                                                              uint64_t seed, cudaStream_t stream) {
  ASSIGN_OR_RETURN(LlamaWeightLayout layout, LlamaWeightLayout::Create(shape));
  ASSIGN_OR_RETURN(LlamaDeviceWeights weights, Allocate(std::move(layout)));
  // Padding between tensors is zero, as on the host.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(weights.buffer_.data(), 0, weights.buffer_.size(), stream));
  for (const WeightTensor& t : weights.layout_.tensors()) {
    const WeightInitRange range = InitRangeFor(t);
    const internal::UniformInit init =
        internal::MakeUniformInit(seed, t.index, range.amplitude, range.centre);
    const int64_t n = t.elements();
    constexpr int kThreads = 256;
    const int64_t blocks = (n + 8 * kThreads - 1) / (8 * kThreads);
    uint16_t* out =
        reinterpret_cast<uint16_t*>(static_cast<char*>(weights.buffer_.data()) + t.offset);
    FillUniformKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out, n, init);
    RETURN_IF_ERROR(
        ToStatus(cudaGetLastError(), absl::StrCat("random init of weight '", t.name, "'")));
  }
  return weights;
}

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::Upload(const LlamaHostWeights& host,
                                                              cudaStream_t stream) {
  // Default-constructed weights (no tensors, no data) would pass a size comparison alone.
  RETURN_IF_ERROR(host.Validate());
  // A copy of the layout: `host` keeps its own.
  ASSIGN_OR_RETURN(LlamaDeviceWeights weights, Allocate(host.layout));
  RETURN_IF_ERROR(CopyHostToDevice(weights.buffer_.data(), host.data.data(),
                                   weights.buffer_.size(), stream));
  RETURN_IF_ERROR(CheckNotCapturing(stream, "LlamaDeviceWeights::Upload"));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return weights;
}

absl::StatusOr<LlamaDeviceWeights> LlamaDeviceWeights::Load(const LlamaShardReader& reader,
                                                            cudaStream_t stream,
                                                            const ReadProgress& progress,
                                                            const WeightLoadOptions& options) {
  RETURN_IF_ERROR(CheckNotCapturing(stream, "LlamaDeviceWeights::Load"));
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("WeightLoadOptions::threads is ", options.threads,
                                                   "; read with at least 1 thread"));
  }
  // Each copy takes whole rows; a stage holds at least the widest row and no more than the
  // largest block (a small model pins no more than it copies).
  size_t widest_row = 0, largest_block = 0;
  for (const LlamaShardReader::Block& b : reader.blocks()) {
    const size_t row_bytes =
        static_cast<size_t>(reader.layout().tensors()[b.tensor_index].cols) * 2;
    widest_row = std::max(widest_row, row_bytes);
    largest_block = std::max(largest_block, row_bytes * static_cast<size_t>(b.rows));
  }
  const size_t stage_bytes = std::max(std::min(options.staging_bytes, largest_block), widest_row);
  // A copy of the layout: `reader` keeps its own for ReadRows.
  ASSIGN_OR_RETURN(LlamaDeviceWeights weights, Allocate(reader.layout()));
  // Padding between tensors is zero, as on the host.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(weights.buffer_.data(), 0, weights.buffer_.size(), stream));

  // The copies, each of whole rows of one block, at most a stage each.
  struct Chunk {
    const LlamaShardReader::Block* block;
    int64_t first;
    int64_t rows;
    char* dst;
    size_t bytes;
  };
  std::vector<Chunk> chunks;
  for (const LlamaShardReader::Block& b : reader.blocks()) {
    const WeightTensor& t = weights.layout_.tensors()[b.tensor_index];
    const size_t row_bytes = static_cast<size_t>(t.cols) * 2;
    const int64_t rows_per_stage = static_cast<int64_t>(stage_bytes / row_bytes);
    for (int64_t first = 0; first < b.rows; first += rows_per_stage) {
      const int64_t rows = std::min(rows_per_stage, b.rows - first);
      chunks.push_back({&b, first, rows,
                        static_cast<char*>(weights.buffer_.data()) + t.offset +
                            static_cast<size_t>(b.local_row + first) * row_bytes,
                        static_cast<size_t>(rows) * row_bytes});
    }
  }
  // Each thread takes every threads-th chunk and owns two pinned stages: it reads into one while
  // the other's copy runs.
  const int threads = static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(options.threads), chunks.size())));
  std::vector<PinnedHostBuffer> stages(2 * threads);
  std::vector<Event> copied(2 * threads);
  for (int i = 0; i < 2 * threads; ++i) {
    ASSIGN_OR_RETURN(stages[i], PinnedHostBuffer::Allocate(stage_bytes, "weight staging buffer"));
    ASSIGN_OR_RETURN(copied[i], Event::Create());
  }
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::mutex mu;  // guards first_error, bytes_done and the progress calls
  absl::Status first_error;
  std::atomic<bool> failed{false};
  int64_t bytes_done = 0;
  // Waits for the stage's last copy (if any), reads the chunk into it and starts its copy.
  auto copy = [&](const Chunk& c, PinnedHostBuffer& buffer, Event& event,
                  bool in_flight) -> absl::Status {
    if (in_flight) RETURN_IF_ERROR(event.Synchronize());
    RETURN_IF_ERROR(reader.ReadRows(*c.block, c.first, c.rows, buffer.as<uint16_t>()));
    RETURN_IF_ERROR(CopyHostToDevice(c.dst, buffer.data(), c.bytes, stream));
    return event.Record(stream);
  };
  auto work = [&](int thread) {
    auto fail = [&](absl::Status status) {
      std::lock_guard<std::mutex> lock(mu);
      first_error.Update(status);  // keeps the first
      failed = true;
    };
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return fail(ToStatus(e, "cudaSetDevice in a weight reading thread"));
    }
    bool in_flight[2] = {false, false};
    int stage = 0;
    for (size_t i = static_cast<size_t>(thread); i < chunks.size() && !failed;
         i += static_cast<size_t>(threads)) {
      const Chunk& c = chunks[i];
      PinnedHostBuffer& buffer = stages[2 * thread + stage];
      Event& event = copied[2 * thread + stage];
      absl::Status status = copy(c, buffer, event, in_flight[stage]);
      if (!status.ok()) return fail(std::move(status));
      in_flight[stage] = true;
      stage ^= 1;
      std::lock_guard<std::mutex> lock(mu);
      bytes_done += static_cast<int64_t>(c.bytes);
      if (progress) progress(bytes_done, reader.bytes());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& t : pool) t.join();
  // Every copy ends before the stages are freed, whatever happened.
  const cudaError_t synced = cudaStreamSynchronize(stream);
  RETURN_IF_ERROR(first_error);
  CUDA_RETURN_IF_ERROR(synced);
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
