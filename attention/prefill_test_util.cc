#include "attention/prefill_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace prefill_testing {
namespace {

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

template <typename T>
absl::StatusOr<DeviceBuffer> UploadVector(const std::vector<T>& v, const char* name,
                                          cudaStream_t stream, size_t min_elems = 1) {
  const size_t bytes = std::max(v.size(), min_elems) * sizeof(T);
  ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(bytes, name));
  RETURN_IF_ERROR(CopyHostToDevice(buffer.data(), v.data(), v.size() * sizeof(T), stream));
  return buffer;
}

template <typename T>
absl::Status CopyVector(const DeviceBuffer& dst, const std::vector<T>& v, cudaStream_t stream) {
  if (v.size() * sizeof(T) > dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Update of '", dst.name(), "' with ",
                                                   v.size() * sizeof(T), " bytes exceeds its ",
                                                   dst.size(), "; upload a larger batch first"));
  }
  return CopyHostToDevice(dst.data(), v.data(), v.size() * sizeof(T), stream);
}

std::vector<AttentionWorkItem> PadItems(const TestPlan& plan, int capacity) {
  std::vector<AttentionWorkItem> items = plan.items;
  items.resize(std::max<size_t>(capacity, 1), AttentionWorkItem{-1, 0, 0, 0, 0, -1});
  return items;
}

}  // namespace

TestPlan BuildPlan(const std::vector<SeqSpec>& seqs, int group, int tile_rows, int kv_chunk,
                   bool extra_empty_chunk) {
  TestPlan plan;
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    const int rows = seqs[s].q_len * group;
    const int prefix = seqs[s].kv_len - seqs[s].q_len;
    for (int rb = 0; rb < rows; rb += tile_rows) {
      const int re = std::min(rb + tile_rows, rows);
      const int visible_end = prefix + (re - 1) / group + 1;
      if (kv_chunk <= 0 || visible_end <= kv_chunk) {
        plan.items.push_back({s, rb, re, 0, seqs[s].kv_len, -1});
        continue;
      }
      const int chunks = CeilDiv(visible_end, kv_chunk) + (extra_empty_chunk ? 1 : 0);
      plan.merges.push_back({s, rb, re, plan.num_slots, chunks});
      for (int c = 0; c < chunks; ++c) {
        const int begin = c * kv_chunk;
        const int end = begin < seqs[s].kv_len ? std::min(begin + kv_chunk, seqs[s].kv_len)
                                               : begin + kv_chunk;
        plan.items.push_back({s, rb, re, begin, end, plan.num_slots++});
      }
    }
  }
  auto extent = [&](const AttentionWorkItem& it) {
    const SeqSpec& q = seqs[it.seq];
    const int visible_end = q.kv_len - q.q_len + (it.row_end - 1) / group + 1;
    return std::max(0, std::min(it.kv_end, visible_end) - it.kv_begin);
  };
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [&](const AttentionWorkItem& a, const AttentionWorkItem& b) {
                     return extent(a) > extent(b);
                   });
  return plan;
}

absl::StatusOr<TestPlan> PlanWithPlanner(const SplitKvPlanner& planner,
                                         const std::vector<SeqSpec>& seqs, int* capacity) {
  const PlanLayout& layout = planner.layout();
  std::vector<uint64_t> blob((layout.plan_bytes + 15) / 8 + 2);  // 16-byte aligned below
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(blob.data()) + 15) &
                                          ~uintptr_t{15});
  std::vector<SeqLens> lens;
  for (const SeqSpec& s : seqs) lens.push_back({s.q_len, s.kv_len});
  ASSIGN_OR_RETURN(PlanSummary summary, planner.Plan(lens, aligned));
  const char* base = static_cast<const char*>(aligned);
  const int32_t* q_start = reinterpret_cast<const int32_t*>(base + layout.seq_q_start_offset);
  const int32_t* kv_len = reinterpret_cast<const int32_t*>(base + layout.seq_kv_len_offset);
  int tokens = 0;
  for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
    if (q_start[i] != tokens || kv_len[i] != seqs[i].kv_len) {
      return absl::InternalError(absl::StrCat("Planner's arrays disagree at sequence ", i));
    }
    tokens += seqs[i].q_len;
  }
  const PlanPartView view = ViewPart(aligned, layout.prefill);
  TestPlan plan;
  plan.items.assign(view.work_items, view.work_items + summary.prefill.num_work_items);
  plan.merges.assign(view.merge_items, view.merge_items + summary.prefill.num_merge_items);
  plan.num_slots = layout.prefill.slot_capacity;
  for (int j = summary.prefill.num_work_items; j < layout.prefill.work_capacity; ++j) {
    if (view.work_items[j].seq != -1) {
      return absl::InternalError(absl::StrCat("Planner's padding item ", j, " is not seq -1"));
    }
  }
  *capacity = layout.prefill.work_capacity;
  return plan;
}

int TileCapacity(int max_tokens, int max_seqs, int group, int tile_rows) {
  return std::min(CeilDiv(max_tokens * group, tile_rows) + max_seqs - 1, max_tokens);
}

uint16_t FloatToBits(float value, AttentionDtype dtype) {
  uint32_t x;
  std::memcpy(&x, &value, sizeof(x));
  if (std::isnan(value)) return dtype == AttentionDtype::kBf16 ? 0x7FC0 : 0x7E00;
  if (dtype == AttentionDtype::kBf16) {
    x += 0x7FFFu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
  }
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const float a = std::fabs(value);
  if (a >= 65520.0f) return sign | 0x7C00;
  if (a < 6.103515625e-05f) {  // below the smallest normal: multiples of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  uint32_t ax;
  std::memcpy(&ax, &a, sizeof(ax));
  const uint32_t exponent = (ax >> 23) - 127 + 15;
  const uint32_t mantissa = ax & 0x7FFFFFu;
  uint32_t h = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float BitsToFloat(uint16_t bits, AttentionDtype dtype) {
  if (dtype == AttentionDtype::kBf16) {
    const uint32_t x = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &x, sizeof(f));
    return f;
  }
  const int sign = (bits >> 15) & 1;
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  float f;
  if (exponent == 0) {
    f = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    f = mantissa != 0 ? std::numeric_limits<float>::quiet_NaN()
                      : std::numeric_limits<float>::infinity();
  } else {
    f = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
  }
  return sign ? -f : f;
}

const float* HostBatch::K(int s, int pos, int kv_head) const {
  const int block =
      block_table[static_cast<size_t>(s) * max_blocks_per_seq + pos / shape.block_size];
  const size_t index =
      ((static_cast<size_t>(block) * shape.num_kv_heads + kv_head) * shape.block_size +
       pos % shape.block_size) *
      shape.head_dim;
  return &kf[index];
}

const float* HostBatch::V(int s, int pos, int kv_head) const {
  return K(s, pos, kv_head) - kf.data() + vf.data();
}

HostBatch MakeRandomBatch(const Shape& shape, const std::vector<SeqSpec>& seqs, uint64_t seed,
                          const BatchSizes& sizes) {
  HostBatch b;
  b.shape = shape;
  b.seqs = seqs;
  b.max_seqs = std::max<int>(sizes.max_seqs, static_cast<int>(seqs.size()));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);

  b.seq_q_start.assign(b.max_seqs + 1, 0);
  b.seq_kv_len.assign(b.max_seqs, 0);
  int needed_blocks = 0;
  int longest = 1;
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    b.seq_q_start[s + 1] = b.seq_q_start[s] + seqs[s].q_len;
    b.seq_kv_len[s] = seqs[s].kv_len;
    const int blocks = CeilDiv(seqs[s].kv_len, shape.block_size);
    needed_blocks += blocks;
    longest = std::max(longest, blocks);
  }
  b.num_tokens = b.seq_q_start[seqs.size()];
  for (int s = static_cast<int>(seqs.size()); s < b.max_seqs; ++s) {
    b.seq_q_start[s + 1] = b.num_tokens;
  }
  b.q_rows = std::max(sizes.num_tokens, b.num_tokens);
  b.max_blocks_per_seq = std::max(sizes.max_blocks_per_seq, longest);
  b.num_blocks = sizes.num_blocks > 0 ? std::max(sizes.num_blocks, needed_blocks)
                                      : needed_blocks + needed_blocks / 4 + 3;

  // Scatter the sequences' blocks over the cache; invalid entries point far outside it.
  std::vector<int32_t> physical(b.num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  b.block_table.assign(static_cast<size_t>(b.max_seqs) * b.max_blocks_per_seq,
                       b.num_blocks + (1 << 20));
  int next = 0;
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    for (int i = 0; i < CeilDiv(seqs[s].kv_len, shape.block_size); ++i) {
      b.block_table[static_cast<size_t>(s) * b.max_blocks_per_seq + i] = physical[next++];
    }
  }

  const size_t q_elems = static_cast<size_t>(b.q_rows) * shape.num_q_heads * shape.head_dim;
  b.q.resize(q_elems);
  b.qf.resize(q_elems);
  for (size_t i = 0; i < q_elems; ++i) {
    b.q[i] = FloatToBits(uniform(rng), shape.dtype);
    b.qf[i] = BitsToFloat(b.q[i], shape.dtype);
  }
  const size_t kv_elems = static_cast<size_t>(b.num_blocks) * shape.num_kv_heads *
                          shape.block_size * shape.head_dim;
  const uint16_t nan_bits = FloatToBits(std::numeric_limits<float>::quiet_NaN(), shape.dtype);
  b.k_cache.assign(kv_elems, nan_bits);
  b.v_cache.assign(kv_elems, nan_bits);
  b.kf.assign(kv_elems, std::numeric_limits<float>::quiet_NaN());
  b.vf.assign(kv_elems, std::numeric_limits<float>::quiet_NaN());
  for (int s = 0; s < static_cast<int>(seqs.size()); ++s) {
    for (int pos = 0; pos < seqs[s].kv_len; ++pos) {
      for (int h = 0; h < shape.num_kv_heads; ++h) {
        const size_t base = b.K(s, pos, h) - b.kf.data();
        for (int d = 0; d < shape.head_dim; ++d) {
          b.k_cache[base + d] = FloatToBits(uniform(rng), shape.dtype);
          b.kf[base + d] = BitsToFloat(b.k_cache[base + d], shape.dtype);
          b.v_cache[base + d] = FloatToBits(uniform(rng), shape.dtype);
          b.vf[base + d] = BitsToFloat(b.v_cache[base + d], shape.dtype);
        }
      }
    }
  }
  return b;
}

double ReferenceRow(const HostBatch& batch, int s, int j, int h, int kv_begin, int kv_end,
                    float softmax_scale, double* out) {
  const Shape& shape = batch.shape;
  const int dim = shape.head_dim;
  const double scale =
      softmax_scale > 0.0f ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(dim));
  const int prefix = batch.seqs[s].kv_len - batch.seqs[s].q_len;
  const int lo = kv_begin;
  const int hi = std::min(kv_end, prefix + j + 1);
  std::fill(out, out + dim, 0.0);
  if (hi <= lo) return -std::numeric_limits<double>::infinity();
  const int kv_head = h / shape.group();
  const float* q =
      &batch.qf[(static_cast<size_t>(batch.seq_q_start[s] + j) * shape.num_q_heads + h) * dim];
  std::vector<double> scores(hi - lo);
  double max_score = -std::numeric_limits<double>::infinity();
  for (int pos = lo; pos < hi; ++pos) {
    const float* k = batch.K(s, pos, kv_head);
    double dot = 0.0;
    for (int d = 0; d < dim; ++d) dot += static_cast<double>(q[d]) * k[d];
    scores[pos - lo] = dot * scale;
    max_score = std::max(max_score, scores[pos - lo]);
  }
  double sum = 0.0;
  for (int pos = lo; pos < hi; ++pos) {
    const double w = std::exp(scores[pos - lo] - max_score);
    sum += w;
    const float* v = batch.V(s, pos, kv_head);
    for (int d = 0; d < dim; ++d) out[d] += w * v[d];
  }
  for (int d = 0; d < dim; ++d) out[d] /= sum;
  return (max_score + std::log(sum)) / std::log(2.0);
}

std::vector<double> ReferenceOutput(const HostBatch& batch, float softmax_scale) {
  const Shape& shape = batch.shape;
  const size_t token_elems = static_cast<size_t>(shape.num_q_heads) * shape.head_dim;
  std::vector<double> out(static_cast<size_t>(batch.num_tokens) * token_elems, 0.0);
  std::vector<std::pair<int, int>> tokens;  // (sequence, new-token index)
  for (int s = 0; s < static_cast<int>(batch.seqs.size()); ++s) {
    for (int j = 0; j < batch.seqs[s].q_len; ++j) tokens.push_back({s, j});
  }
  const int workers =
      static_cast<int>(std::max(1u, std::min(64u, std::thread::hardware_concurrency())));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      // Long sequences' last tokens cost most: stride so every worker gets a share of them.
      for (size_t t = w; t < tokens.size(); t += workers) {
        const auto [s, j] = tokens[t];
        const size_t token = batch.seq_q_start[s] + j;
        for (int h = 0; h < shape.num_q_heads; ++h) {
          ReferenceRow(batch, s, j, h, 0, batch.seqs[s].kv_len, softmax_scale,
                       &out[token * token_elems + static_cast<size_t>(h) * shape.head_dim]);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

double MaxTokenRelativeError(const std::vector<float>& out, const std::vector<double>& ref,
                             int num_tokens, int token_elems) {
  double worst = 0.0;
  for (int t = 0; t < num_tokens; ++t) {
    double err = 0.0, norm = 0.0;
    for (int i = 0; i < token_elems; ++i) {
      const size_t idx = static_cast<size_t>(t) * token_elems + i;
      if (!std::isfinite(out[idx])) return std::numeric_limits<double>::infinity();
      const double diff = out[idx] - ref[idx];
      err += diff * diff;
      norm += ref[idx] * ref[idx];
    }
    worst = std::max(worst, norm > 0.0 ? std::sqrt(err / norm) : std::sqrt(err));
  }
  return worst;
}

absl::StatusOr<DeviceBatch> DeviceBatch::Upload(const HostBatch& batch, const TestPlan& plan,
                                                int capacity, int max_slots) {
  if (capacity < static_cast<int>(plan.items.size())) {
    return absl::InvalidArgumentError(absl::StrCat("Plan has ", plan.items.size(),
                                                   " items but the capacity is ", capacity,
                                                   "; raise the capacity"));
  }
  DeviceBatch d;
  d.shape_ = batch.shape;
  d.capacity_ = capacity;
  d.q_rows_ = batch.q_rows;
  d.max_seqs_ = batch.max_seqs;
  d.max_blocks_per_seq_ = batch.max_blocks_per_seq;
  d.num_slots_ = std::max(plan.num_slots, max_slots);
  const cudaStream_t stream = nullptr;
  ASSIGN_OR_RETURN(d.q_, UploadVector(batch.q, "q", stream));
  ASSIGN_OR_RETURN(d.k_, UploadVector(batch.k_cache, "k_cache", stream));
  ASSIGN_OR_RETURN(d.v_, UploadVector(batch.v_cache, "v_cache", stream));
  ASSIGN_OR_RETURN(d.block_table_, UploadVector(batch.block_table, "block_table", stream));
  ASSIGN_OR_RETURN(d.q_start_, UploadVector(batch.seq_q_start, "seq_q_start", stream));
  ASSIGN_OR_RETURN(d.kv_len_, UploadVector(batch.seq_kv_len, "seq_kv_len", stream));
  ASSIGN_OR_RETURN(d.items_, UploadVector(PadItems(plan, capacity), "work_items", stream));
  ASSIGN_OR_RETURN(d.o_, DeviceBuffer::Allocate(batch.q.size() * sizeof(uint16_t), "o"));
  const size_t slot_rows = static_cast<size_t>(std::max(d.num_slots_, 1)) *
                           batch.shape.num_kv_heads * batch.shape.tile_rows;
  ASSIGN_OR_RETURN(
      d.partial_o_,
      DeviceBuffer::Allocate(slot_rows * batch.shape.head_dim * sizeof(float), "partial_o"));
  ASSIGN_OR_RETURN(d.partial_lse_,
                   DeviceBuffer::Allocate(slot_rows * sizeof(float), "partial_lse"));
  RETURN_IF_ERROR(d.Poison(stream));
  RETURN_IF_ERROR(ToStatus(cudaStreamSynchronize(stream), "upload"));
  return d;
}

PrefillAttentionParams DeviceBatch::Params() const {
  PrefillAttentionParams p;
  p.dtype = shape_.dtype;
  p.head_dim = shape_.head_dim;
  p.tile_rows = shape_.tile_rows;
  p.num_q_heads = shape_.num_q_heads;
  p.num_kv_heads = shape_.num_kv_heads;
  p.block_size = shape_.block_size;
  p.max_blocks_per_seq = max_blocks_per_seq_;
  p.q = q_.data();
  p.o = o_.data();
  p.k_cache = k_.data();
  p.v_cache = v_.data();
  p.block_table = block_table_.as<int32_t>();
  p.seq_q_start = q_start_.as<int32_t>();
  p.seq_kv_len = kv_len_.as<int32_t>();
  p.work_items = items_.as<AttentionWorkItem>();
  p.num_work_items = capacity_;
  p.partial_o = partial_o_.as<float>();
  p.partial_lse = partial_lse_.as<float>();
  return p;
}

absl::Status DeviceBatch::Poison(cudaStream_t stream) {
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o_.data(), 0xFF, o_.size(), stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(partial_o_.data(), 0xFF, partial_o_.size(), stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(partial_lse_.data(), 0xFF, partial_lse_.size(), stream));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint16_t>> DeviceBatch::DownloadOutputBits(cudaStream_t stream) const {
  std::vector<uint16_t> bits(o_.size() / sizeof(uint16_t));
  RETURN_IF_ERROR(CopyDeviceToHost(bits.data(), o_.data(), o_.size(), stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return bits;
}

absl::StatusOr<std::vector<float>> DeviceBatch::DownloadOutput(cudaStream_t stream) const {
  ASSIGN_OR_RETURN(std::vector<uint16_t> bits, DownloadOutputBits(stream));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = BitsToFloat(bits[i], shape_.dtype);
  return out;
}

absl::StatusOr<std::vector<float>> DeviceBatch::DownloadPartialO(cudaStream_t stream) const {
  std::vector<float> out(partial_o_.size() / sizeof(float));
  RETURN_IF_ERROR(CopyDeviceToHost(out.data(), partial_o_.data(), partial_o_.size(), stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return out;
}

absl::StatusOr<std::vector<float>> DeviceBatch::DownloadPartialLse(cudaStream_t stream) const {
  std::vector<float> out(partial_lse_.size() / sizeof(float));
  RETURN_IF_ERROR(CopyDeviceToHost(out.data(), partial_lse_.data(), partial_lse_.size(), stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return out;
}

absl::Status DeviceBatch::Update(const HostBatch& batch, const TestPlan& plan,
                                 cudaStream_t stream) {
  if (batch.q_rows != q_rows_ || batch.max_seqs != max_seqs_ ||
      batch.max_blocks_per_seq != max_blocks_per_seq_ ||
      static_cast<int>(plan.items.size()) > capacity_ || plan.num_slots > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Batch of ", batch.q_rows, " rows, ", batch.max_seqs, " sequences and ",
        plan.items.size(), " items does not fit buffers of ", q_rows_, " rows, ", max_seqs_,
        " sequences and capacity ", capacity_, "; build it with the same BatchSizes"));
  }
  RETURN_IF_ERROR(CopyVector(q_, batch.q, stream));
  RETURN_IF_ERROR(CopyVector(k_, batch.k_cache, stream));
  RETURN_IF_ERROR(CopyVector(v_, batch.v_cache, stream));
  RETURN_IF_ERROR(CopyVector(block_table_, batch.block_table, stream));
  RETURN_IF_ERROR(CopyVector(q_start_, batch.seq_q_start, stream));
  RETURN_IF_ERROR(CopyVector(kv_len_, batch.seq_kv_len, stream));
  RETURN_IF_ERROR(CopyVector(items_, PadItems(plan, capacity_), stream));
  return ToStatus(cudaStreamSynchronize(stream), "update");
}

}  // namespace prefill_testing
}  // namespace kiln
