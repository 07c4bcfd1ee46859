// Times the model's GEMMs and a decode step without attention for the 1B shape.
//
//   bazel run -c opt //runtime/model:model_benchmark
//
// Part 1: each projection of the 1B model (qkv, o, gate_up, down, lm_head) at 1, 8, 32 and
// 128 rows through Gemm, captured in a CUDA graph that cycles over enough weight copies to
// defeat the L2 cache; median of the replays after warm-up, as time per GEMM, weight-read
// bandwidth and TFLOP/s. Part 2: a whole decode step minus attention (embedding, 16 x [norm,
// qkv, RoPE, o, add+norm, gate_up, SiLU·mul, down], final add+norm, float logits, greedy
// sample) on seeded random weights, eager and as one graph. Exits non-zero on any error.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"
#include "runtime/model/internal/benchmark_util.h"
#include "runtime/model/device_weights.h"
#include "runtime/model/embedding.h"
#include "runtime/model/gemm.h"
#include "runtime/model/llama_shape.h"
#include "runtime/model/rms_norm.h"
#include "runtime/model/rope.h"
#include "runtime/model/sampling.h"
#include "runtime/model/silu_mul.h"

namespace kiln {
namespace {

using benchmark_internal::ValueOrDie;

constexpr int kWarmup = 3;
constexpr int kReplays = 20;

// Captures `body` into a graph and returns the median milliseconds of a replay.
double TimeGraph(cudaStream_t stream, const std::function<void()>& body) {
  return benchmark_internal::TimeGraph(stream, body, kWarmup, kReplays);
}

// Returns the median milliseconds of `body` run eagerly.
double TimeEager(cudaStream_t stream, const std::function<void()>& body) {
  Event start = ValueOrDie(Event::Create(Event::kTiming));
  Event stop = ValueOrDie(Event::Create(Event::kTiming));
  std::vector<double> ms;
  for (int i = 0; i < kWarmup + kReplays; ++i) {
    CHECK_OK(start.Record(stream));
    body();
    CHECK_OK(stop.Record(stream));
    const float t = ValueOrDie(Event::ElapsedMs(start, stop));
    if (i >= kWarmup) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Fills a buffer with bf16 values in [-1, 1) (never zeros: they can run faster than real data).
void FillRandom(DeviceBuffer& buf, cudaStream_t stream, uint64_t seed) {
  std::vector<uint16_t> host(buf.size() / 2);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : host) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // bf16 in [-1, 1): sign, exponent 0x78..0x7e, random mantissa.
    v = static_cast<uint16_t>(((x >> 63) << 15) | ((0x78 + (x >> 40) % 7) << 7) |
                              ((x >> 20) & 0x7f));
  }
  CHECK_OK(CopyHostToDevice(buf.data(), host.data(), buf.size(), stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
}

void GemmTable(const LlamaShape& s, cudaStream_t stream) {
  struct Proj {
    const char* name;
    int64_t n, k;
  };
  const Proj projs[] = {{"qkv", s.qkv_rows(), s.hidden},
                        {"o", s.hidden, s.q_width()},
                        {"gate_up", 2 * int64_t{s.ffn}, s.hidden},
                        {"down", s.hidden, s.ffn},
                        {"lm_head", s.vocab, s.hidden}};
  std::unique_ptr<Gemm> gemm = ValueOrDie(Gemm::Create());
  std::printf("\nGEMMs of the 1B model (y = x W^T, bf16, graph replay, L2 defeated)\n");
  std::printf("%-8s %5s %7s %6s %10s %9s %9s  %s\n", "proj", "m", "n", "k", "time(us)", "GB/s",
              "TFLOP/s", "algorithm");
  for (const Proj& p : projs) {
    const size_t weight_bytes = static_cast<size_t>(p.n * p.k) * 2;
    const int copies = static_cast<int>(std::clamp<size_t>((256u << 20) / weight_bytes + 1, 1, 16));
    std::vector<DeviceBuffer> weights;
    for (int c = 0; c < copies; ++c) {
      weights.push_back(ValueOrDie(DeviceBuffer::Allocate(weight_bytes, "weights")));
      FillRandom(weights.back(), stream, c + 1);
    }
    for (int64_t m : {1, 8, 32, 128}) {
      DeviceBuffer x = ValueOrDie(DeviceBuffer::Allocate(m * p.k * 2, "x"));
      DeviceBuffer y = ValueOrDie(DeviceBuffer::Allocate(m * p.n * 2, "y"));
      FillRandom(x, stream, 99);
      CHECK_OK(gemm->Prepare(m, p.n, p.k));
      const int launches = std::max(copies, 8);
      const double ms = TimeGraph(stream, [&] {
        for (int i = 0; i < launches; ++i) {
          CHECK_OK(gemm->Run(x.as<__nv_bfloat16>(), weights[i % copies].as<__nv_bfloat16>(),
                             y.data(), m, p.n, p.k, stream));
        }
      }) / launches;
      const double bytes = weight_bytes + 2.0 * m * (p.k + p.n);
      std::printf("%-8s %5lld %7lld %6lld %10.2f %9.0f %9.1f  %s\n", p.name,
                  static_cast<long long>(m), static_cast<long long>(p.n),
                  static_cast<long long>(p.k), ms * 1e3, bytes / (ms * 1e6),
                  2.0 * m * p.n * p.k / (ms * 1e9),
                  gemm->Algorithm(m, p.n, p.k)->ToString().c_str());
    }
  }
}

void DecodeStepTable(const LlamaShape& s, cudaStream_t stream) {
  LlamaDeviceWeights w = ValueOrDie(LlamaDeviceWeights::Random(s, 1234, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::unique_ptr<Gemm> gemm = ValueOrDie(Gemm::Create());
  std::printf("\nDecode step without attention, 1B shape, %.2f GiB of weights (ms, median)\n",
              w.bytes() / double(1 << 30));
  std::printf("%6s %10s %10s %14s\n", "batch", "eager", "graph", "weights GB/s");
  const int max_m = 128;
  auto alloc = [&](int64_t elems, const char* name) {
    DeviceBuffer b = ValueOrDie(DeviceBuffer::Allocate(elems * 4, name));
    FillRandom(b, stream, elems);
    return b;
  };
  DeviceBuffer residual = alloc(max_m * s.hidden, "residual"), x = alloc(max_m * s.hidden, "x"),
               normed = alloc(max_m * s.hidden, "normed"), qkv = alloc(max_m * s.qkv_rows(), "qkv"),
               attn = alloc(max_m * s.q_width(), "attn"), gu = alloc(max_m * 2 * s.ffn, "gate_up"),
               act = alloc(max_m * s.ffn, "act"), logits = alloc(max_m * s.vocab, "logits");
  std::vector<int32_t> host_ids(max_m), host_pos(max_m);
  for (int i = 0; i < max_m; ++i) {
    host_ids[i] = (i * 7919) % s.vocab;
    host_pos[i] = 1000 + i;
  }
  DeviceBuffer ids = ValueOrDie(DeviceBuffer::Allocate(max_m * 4, "ids"));
  DeviceBuffer pos = ValueOrDie(DeviceBuffer::Allocate(max_m * 4, "positions"));
  DeviceBuffer next = ValueOrDie(DeviceBuffer::Allocate(max_m * 4, "next"));
  CHECK_OK(CopyHostToDevice(ids.data(), host_ids.data(), max_m * 4, stream));
  CHECK_OK(CopyHostToDevice(pos.data(), host_pos.data(), max_m * 4, stream));
  using bf = __nv_bfloat16;
  const float eps = static_cast<float>(s.rms_eps);
  for (int m : {1, 8, 32, 128}) {
    CHECK_OK(gemm->Prepare(m, s.qkv_rows(), s.hidden));
    CHECK_OK(gemm->Prepare(m, s.hidden, s.q_width()));
    CHECK_OK(gemm->Prepare(m, 2 * int64_t{s.ffn}, s.hidden));
    CHECK_OK(gemm->Prepare(m, s.hidden, s.ffn));
    CHECK_OK(gemm->Prepare(m, s.vocab, s.hidden, GemmOutput::kFloat32));
    auto step = [&] {
      CHECK_CUDA(LaunchEmbeddingGather(w.embedding(), s.vocab, s.hidden, ids.as<int32_t>(), m,
                                       residual.as<bf>(), stream));
      for (int l = 0; l < s.layers; ++l) {
        if (l == 0) {
          CHECK_CUDA(LaunchRmsNorm(residual.as<bf>(), w.input_norm(l), normed.as<bf>(), m, s.hidden,
                                   eps, stream));
        } else {
          CHECK_CUDA(LaunchFusedAddRmsNorm(x.as<bf>(), residual.as<bf>(), w.input_norm(l),
                                           normed.as<bf>(), m, s.hidden, eps, stream));
        }
        CHECK_OK(
            gemm->Run(normed.as<bf>(), w.qkv(l), qkv.data(), m, s.qkv_rows(), s.hidden, stream));
        CHECK_CUDA(LaunchRope(qkv.as<bf>(), pos.as<int32_t>(), m, s.heads, s.kv_heads, s.head_dim,
                              s.rope_theta, s.rope_scaling, stream));
        // (attention would read qkv and write attn here)
        CHECK_OK(gemm->Run(attn.as<bf>(), w.o(l), x.data(), m, s.hidden, s.q_width(), stream));
        CHECK_CUDA(LaunchFusedAddRmsNorm(x.as<bf>(), residual.as<bf>(), w.post_norm(l),
                                         normed.as<bf>(), m, s.hidden, eps, stream));
        CHECK_OK(gemm->Run(normed.as<bf>(), w.gate_up(l), gu.data(), m, 2 * int64_t{s.ffn},
                           s.hidden, stream));
        CHECK_CUDA(LaunchSiluMul(gu.as<bf>(), act.as<bf>(), m, s.ffn, stream));
        CHECK_OK(gemm->Run(act.as<bf>(), w.down(l), x.data(), m, s.hidden, s.ffn, stream));
      }
      CHECK_CUDA(LaunchFusedAddRmsNorm(x.as<bf>(), residual.as<bf>(), w.final_norm(),
                                       normed.as<bf>(), m, s.hidden, eps, stream));
      CHECK_OK(gemm->Run(normed.as<bf>(), w.lm_head(), logits.data(), m, s.vocab, s.hidden, stream,
                         GemmOutput::kFloat32));
      CHECK_CUDA(LaunchGreedySample(logits.as<float>(), m, s.vocab, next.as<int32_t>(), stream));
    };
    const double eager = TimeEager(stream, step);
    const double graph = TimeGraph(stream, step);
    std::printf("%6d %10.3f %10.3f %14.0f\n", m, eager, graph, w.bytes() / (graph * 1e6));
  }
}

}  // namespace
}  // namespace kiln

int main() {
  using namespace kiln;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  Stream stream = ValueOrDie(Stream::Create());
  const LlamaShape shape = LlamaShape::Llama1B();
  GemmTable(shape, stream.get());
  DecodeStepTable(shape, stream.get());
  return 0;
}
