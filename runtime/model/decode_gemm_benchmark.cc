// Times the decode and prefetch GEMMs against cuBLASLt and the skinny kernel on the 1B model's
// projections (--preset: another model preset's, e.g. llama-3.1-8b).
//
//   bazel run -c opt //runtime/model:decode_gemm_benchmark [-- --rows=1,8,32 --sweep=true]
//
// For each projection (qkv, o, gate_up, down, down through SiLU·mul, the float LM head) and each
// row count: microseconds per GEMM of cuBLASLt, of the skinny kernel (up to 8 rows), of the
// decode GEMM with ChooseDecodeGemmConfig's configuration, and (with --sweep) of the fastest of
// every configuration, with the weight-read bandwidth; then (up to 8 rows) of the prefetch GEMM
// with ChoosePrefetchGemmConfig's configuration and (with --prefetch_sweep) the fastest of one or
// two CTAs per SM with 1 to 6 ring stages; then (bf16 plain projections up to 64 rows) of the
// TMA GEMM with ChooseTmaGemmConfig's configuration at two and at one CTA per SM, and (with
// --tma_sweep) with half and twice its k slices. Each time is the median replay of a CUDA
// graph of back-to-back GEMMs that cycle over enough weight copies (>= 256 MiB) to defeat the L2
// cache, divided by the GEMMs in it; the decode, skinny and prefetch GEMMs run with programmatic
// dependent launch as in a model step, so one GEMM's first weights stream in while the one before
// finishes. Random
// data, never zeros. Exits non-zero on any error.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "runtime/config/presets.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/event.h"
#include "runtime/cuda/status.h"
#include "runtime/cuda/stream.h"
#include "runtime/model/internal/benchmark_util.h"
#include "runtime/model/decode_gemm.h"
#include "runtime/model/gemm.h"
#include "runtime/model/prefetch_gemm.h"
#include "runtime/model/skinny_gemm.h"
#include "runtime/model/tma_gemm.h"

ABSL_FLAG(std::string, preset, "llama-3.2-1b",
          "Model preset whose projections are timed: llama-3.2-1b, llama-3.1-8b, ...");
ABSL_FLAG(std::string, rows, "1,2,4,8,16,32", "Rows of x (decode batch sizes, at most 256)");
ABSL_FLAG(bool, sweep, true, "Also time every decode GEMM configuration and report the fastest");
ABSL_FLAG(bool, prefetch_sweep, true,
          "Also time the prefetch GEMM at 1 and 2 CTAs per SM with 1 to 6 stages");
ABSL_FLAG(int, cublas_candidates, 0,
          "Also time up to this many of cuBLASLt's heuristic candidates per plain shape");
ABSL_FLAG(bool, tma_sweep, true,
          "Also time the TMA GEMM (bf16 plain projections, up to 64 rows) at 1 and 2 CTAs per "
          "SM, with half and twice the chosen k slices");

namespace kiln {
namespace {

using benchmark_internal::ValueOrDie;

constexpr int kWarmup = 3;
constexpr int kReplays = 15;

// Captures `body` into a graph and returns the median milliseconds of a replay.
double TimeGraph(cudaStream_t stream, const std::function<void()>& body) {
  return benchmark_internal::TimeGraph(stream, body, kWarmup, kReplays);
}

// Fills a buffer with bf16 values in [-1, 1) (never zeros: they can run faster than real data).
void FillRandom(DeviceBuffer& buf, cudaStream_t stream, uint64_t seed) {
  std::vector<uint16_t> host(buf.size() / 2);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : host) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<uint16_t>(((x >> 63) << 15) | ((0x78 + (x >> 40) % 7) << 7) |
                              ((x >> 20) & 0x7f));
  }
  CHECK_OK(CopyHostToDevice(buf.data(), host.data(), buf.size(), stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
}

struct Proj {
  const char* name;
  int n, k;
  DecodeGemmInput input;
  bool float_output;
};

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> rows;
  if (!benchmark_internal::ParseIntList("rows", absl::GetFlag(FLAGS_rows), 1, 256, &rows)) {
    return 2;
  }
  if (rows.empty()) {
    std::fprintf(stderr, "--rows: no row count given\n");
    return 2;
  }
  const int max_candidates = absl::GetFlag(FLAGS_cublas_candidates);
  if (max_candidates < 0 || max_candidates > kMaxGemmCandidates) {
    std::fprintf(stderr, "--cublas_candidates: %d is outside [0, %d]\n", max_candidates,
                 kMaxGemmCandidates);
    return 2;
  }
  const absl::StatusOr<config::ModelShape> model = ModelPreset(absl::GetFlag(FLAGS_preset));
  if (!model.ok()) {
    std::fprintf(stderr, "--preset: %s\n", std::string(model.status().message()).c_str());
    return 2;
  }
  const bool sweep = absl::GetFlag(FLAGS_sweep);
  const DeviceInfo info = ValueOrDie(DeviceInfo::Query(0));
  std::printf("device: %s\n", info.ToString().c_str());
  Stream stream_owner = ValueOrDie(Stream::Create());
  cudaStream_t stream = stream_owner.get();
  std::unique_ptr<Gemm> gemm = ValueOrDie(Gemm::Create());

  // The preset's projections (1B: hidden 2048, 32/8 heads of 64, ffn 8192, vocab 128256).
  const int hidden = model->hidden_size(), ffn = model->intermediate_size();
  const int q_width = model->num_heads() * model->head_dim();
  const int qkv_rows = (model->num_heads() + 2 * model->num_kv_heads()) * model->head_dim();
  const int vocab = model->vocab_size();
  std::printf("projections of %s: hidden %d, qkv rows %d, ffn %d, vocab %d\n",
              model->name().c_str(), hidden, qkv_rows, ffn, vocab);
  const Proj projs[] = {{"qkv", qkv_rows, hidden, DecodeGemmInput::kPlain, false},
                        {"o", hidden, q_width, DecodeGemmInput::kPlain, false},
                        {"gate_up", 2 * ffn, hidden, DecodeGemmInput::kPlain, false},
                        {"down", hidden, ffn, DecodeGemmInput::kPlain, false},
                        {"down+silu", hidden, ffn, DecodeGemmInput::kSiluMul, false},
                        {"lm_head", vocab, hidden, DecodeGemmInput::kPlain, true}};
  const int max_m = *std::max_element(rows.begin(), rows.end());
  int max_n = 0;
  for (const Proj& p : projs) max_n = std::max(max_n, p.n);
  DeviceBuffer workspace = ValueOrDie(
      DeviceBuffer::Allocate(size_t{8} * max_m * max_n * sizeof(float), "workspace"));
  DeviceBuffer counters =
      ValueOrDie(DeviceBuffer::Allocate((max_n / 16 + 1) * sizeof(int32_t), "counters"));
  CHECK_CUDA(cudaMemset(counters.data(), 0, counters.size()));

  const bool prefetch_sweep = absl::GetFlag(FLAGS_prefetch_sweep);
  std::printf("\nus per GEMM (graph of back-to-back GEMMs, L2 defeated); GB/s of weights for the "
              "decode and prefetch GEMMs' chosen configs\n");
  std::printf("%-10s %3s %9s %9s %9s %7s %9s %-6s %8s %9s %-8s %9s %-8s %8s\n", "proj", "m",
              "cuBLASLt", "skinny", "decode", "config", "best", "best", "GB/s", "prefetch",
              "config", "pf best", "pf best", "GB/s");
  for (const Proj& p : projs) {
    const size_t weight_bytes = static_cast<size_t>(p.n) * p.k * 2;
    const int copies =
        static_cast<int>(std::clamp<size_t>((256u << 20) / weight_bytes + 1, 1, 16));
    std::vector<DeviceBuffer> weights;
    for (int c = 0; c < copies; ++c) {
      weights.push_back(ValueOrDie(DeviceBuffer::Allocate(weight_bytes, "weights")));
      FillRandom(weights.back(), stream, c + 1);
    }
    const int launches = std::max(copies, 8);
    const int x_cols = p.input == DecodeGemmInput::kSiluMul ? 2 * p.k : p.k;
    for (int m : rows) {
      DeviceBuffer x = ValueOrDie(DeviceBuffer::Allocate(size_t{2} * m * x_cols, "x"));
      DeviceBuffer act = ValueOrDie(DeviceBuffer::Allocate(size_t{2} * m * p.k, "act"));
      DeviceBuffer y = ValueOrDie(DeviceBuffer::Allocate(size_t{4} * m * p.n, "y"));
      FillRandom(x, stream, 99);
      FillRandom(act, stream, 98);
      const auto* xp = x.as<__nv_bfloat16>();
      const auto* ap = act.as<__nv_bfloat16>();  // cuBLASLt and skinny: an x of k columns
      const GemmOutput out = p.float_output ? GemmOutput::kFloat32 : GemmOutput::kBf16;

      CHECK_OK(gemm->Prepare(m, p.n, p.k, out));
      const double cublas_us = 1e3 / launches * TimeGraph(stream, [&] {
        for (int i = 0; i < launches; ++i) {
          CHECK_OK(gemm->Run(ap, weights[i % copies].as<__nv_bfloat16>(), y.data(), m, p.n, p.k,
                             stream, out));
        }
      });
      double skinny_us = std::numeric_limits<double>::quiet_NaN();
      if (m <= kSkinnyGemmMaxRows) {
        skinny_us = 1e3 / launches * TimeGraph(stream, [&] {
          for (int i = 0; i < launches; ++i) {
            CHECK_CUDA(LaunchSkinnyGemm(ap, weights[i % copies].as<__nv_bfloat16>(), y.data(), m,
                                        p.n, p.k, p.float_output, stream));
          }
        });
      }
      auto time_decode = [&](const DecodeGemmConfig& config) {
        DecodeGemmArgs a;
        a.x = xp;
        a.y = y.data();
        a.m = m;
        a.n = p.n;
        a.k = p.k;
        a.input = p.input;
        a.float_output = p.float_output;
        a.w = weights[0].as<__nv_bfloat16>();
        if (!DecodeGemmSupports(a, config)) return std::numeric_limits<double>::quiet_NaN();
        // One eager launch first: it sets the kernel's shared-memory limit where needed.
        CHECK_CUDA(LaunchDecodeGemm(a, config, workspace.as<float>(), counters.as<int32_t>(),
                                    stream));
        return 1e3 / launches * TimeGraph(stream, [&] {
          for (int i = 0; i < launches; ++i) {
            a.w = weights[i % copies].as<__nv_bfloat16>();
            CHECK_CUDA(LaunchDecodeGemm(a, config, workspace.as<float>(),
                                        counters.as<int32_t>(), stream));
          }
        });
      };
      const DecodeGemmConfig chosen = ChooseDecodeGemmConfig(m, p.n, p.k, info.sm_count);
      const double decode_us = time_decode(chosen);
      double best_us = decode_us;
      DecodeGemmConfig best = chosen;
      if (sweep) {
        for (int row_warps : {1, 2, 4}) {
          for (int splits : {1, 2, 4, 8}) {
            const DecodeGemmConfig c{row_warps, splits};
            const double us = time_decode(c);
            if (us < best_us) {
              best_us = us;
              best = c;
            }
          }
        }
      }
      auto time_prefetch = [&](const PrefetchGemmConfig& config) {
        PrefetchGemmArgs a;
        a.x = xp;
        a.y = y.data();
        a.m = m;
        a.n = p.n;
        a.k = p.k;
        a.input = p.input == DecodeGemmInput::kSiluMul ? PrefetchGemmInput::kSiluMul
                                                       : PrefetchGemmInput::kPlain;
        a.float_output = p.float_output;
        a.w = weights[0].as<__nv_bfloat16>();
        if (!PrefetchGemmSupports(a, config)) return std::numeric_limits<double>::quiet_NaN();
        CHECK_CUDA(LaunchPrefetchGemm(a, config, stream));  // eager first: shared-memory limits
        return 1e3 / launches * TimeGraph(stream, [&] {
          for (int i = 0; i < launches; ++i) {
            a.w = weights[i % copies].as<__nv_bfloat16>();
            CHECK_CUDA(LaunchPrefetchGemm(a, config, stream));
          }
        });
      };
      const PrefetchGemmConfig pf_chosen = ChoosePrefetchGemmConfig(m, p.n, p.k, info.sm_count);
      const double pf_us = time_prefetch(pf_chosen);
      double pf_best_us = pf_us;
      PrefetchGemmConfig pf_best = pf_chosen;
      if (prefetch_sweep && m <= kPrefetchGemmMaxRows) {
        for (int ctas : {info.sm_count, 2 * info.sm_count}) {
          for (int stages = 1; stages <= 6; ++stages) {
            const PrefetchGemmConfig c{ctas, stages};
            const double us = time_prefetch(c);
            if (!std::isnan(us) && (std::isnan(pf_best_us) || us < pf_best_us)) {
              pf_best_us = us;
              pf_best = c;
            }
          }
        }
      }
      std::printf("%-10s %3d %9.2f %9.2f %9.2f %7s %9.2f %-6s %8.0f %9.2f %-8s %9.2f %-8s %8.0f\n",
                  p.name, m, cublas_us, skinny_us, decode_us, chosen.ToString().c_str(), best_us,
                  best.ToString().c_str(), weight_bytes / (decode_us * 1e3), pf_us,
                  pf_chosen.ToString().c_str(), pf_best_us, pf_best.ToString().c_str(),
                  weight_bytes / (pf_us * 1e3));
      std::fflush(stdout);
      if (p.input == DecodeGemmInput::kPlain && !p.float_output && m <= kTmaGemmMaxRows) {
        auto time_tma = [&](const TmaGemmConfig& config) {
          TmaGemmArgs a;
          a.x = ap;
          a.w = weights[0].as<__nv_bfloat16>();
          a.y = y.as<__nv_bfloat16>();
          a.m = m;
          a.n = p.n;
          a.k = p.k;
          if (!TmaGemmSupports(a, config)) return std::numeric_limits<double>::quiet_NaN();
          CHECK_CUDA(LaunchTmaGemm(a, config, stream));  // eager first: shared-memory limits
          return 1e3 / launches * TimeGraph(stream, [&] {
            for (int i = 0; i < launches; ++i) {
              a.w = weights[i % copies].as<__nv_bfloat16>();
              CHECK_CUDA(LaunchTmaGemm(a, config, stream));
            }
          });
        };
        std::printf("  tma:");
        for (int per_sm : {2, 1}) {
          const TmaGemmConfig chosen_tma = ChooseTmaGemmConfig(m, p.n, p.k, info.sm_count, per_sm);
          std::vector<TmaGemmConfig> configs = {chosen_tma};
          if (absl::GetFlag(FLAGS_tma_sweep)) {
            configs.push_back(TmaGemmConfig{std::max(1, chosen_tma.splits / 2), chosen_tma.stages});
            configs.push_back(TmaGemmConfig{2 * chosen_tma.splits, chosen_tma.stages});
          }
          for (const TmaGemmConfig& c : configs) {
            const double us = time_tma(c);
            std::printf(" %d/SM %s %.2f us (%.0f GB/s);", per_sm, c.ToString().c_str(), us,
                        weight_bytes / (us * 1e3));
          }
        }
        std::printf("\n");
        std::fflush(stdout);
      }
      if (max_candidates > 0 && p.input == DecodeGemmInput::kPlain) {
        const std::vector<GemmAlgorithmInfo> candidates =
            ValueOrDie(gemm->Candidates(m, p.n, p.k, out, max_candidates));
        for (int c = 0; c < static_cast<int>(candidates.size()); ++c) {
          CHECK_OK(gemm->UseCandidate(m, p.n, p.k, out, c));
          const double us = 1e3 / launches * TimeGraph(stream, [&] {
            for (int i = 0; i < launches; ++i) {
              CHECK_OK(gemm->Run(ap, weights[i % copies].as<__nv_bfloat16>(), y.data(), m, p.n,
                                 p.k, stream, out));
            }
          });
          std::printf("  candidate %2d: %8.2f us %6.0f GB/s  %s\n", c, us,
                      weight_bytes / (us * 1e3), candidates[c].ToString().c_str());
        }
        CHECK_OK(gemm->UseCandidate(m, p.n, p.k, out, 0));
        std::fflush(stdout);
      }
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
