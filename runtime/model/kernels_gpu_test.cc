// GPU tests of the per-token kernels (embedding gather, RMSNorm, RoPE, SiLU·mul, bias add,
// greedy sampling) against CPU float64 references, over fresh random inputs, poisoned outputs and
// odd sizes that take the scalar paths. One binary for the six kernels: they share the
// reference helpers, and one gtest compile and link is cheaper than six.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "attention/rope_frequency.h"
#include "runtime/model/bf16.h"
#include "runtime/model/bias_add.h"
#include "runtime/model/qk_norm.h"
#include "runtime/model/embedding.h"
#include "runtime/model/internal/gpu_test_helpers.h"
#include "runtime/model/rms_norm.h"
#include "runtime/model/rope.h"
#include "runtime/model/sampling.h"
#include "runtime/model/silu_mul.h"

namespace kiln {
namespace {

using testing_internal::Bf16ToDouble;
using testing_internal::DeviceVector;
using testing_internal::GpuTest;
using testing_internal::RelativeError;
using testing_internal::ToDouble;

__nv_bfloat16* Bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// bf16 storage with float arithmetic, checked against float64: a relative error well under
// bf16's half-ulp (2^-9) in the norm.
constexpr double kBf16Tolerance = 4e-3;

// ---------------------------------------------------------------- embedding

class EmbeddingGpuTest : public GpuTest {};

TEST_F(EmbeddingGpuTest, GathersRowsZeroesInvalidIdsAndClearsRows) {
  struct Case { int table_rows, width, num_rows; };
  for (const Case c : {Case{1000, 2048, 7}, Case{50, 8, 1}, Case{300, 1000, 130},
                       Case{97, 37, 33}, Case{5, 1, 4}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.table_rows << " width " << c.width
                                      << " n " << c.num_rows);
    const std::vector<uint16_t> table = RandomBf16(size_t{1} * c.table_rows * c.width, -3, 3);
    std::vector<int32_t> ids(c.num_rows);
    for (auto& id : ids) id = RandomInt(0, c.table_rows - 1);
    if (c.num_rows > 2) {
      ids[1] = -1;            // padding slot
      ids[2] = c.table_rows;  // out of range
    }
    DeviceVector<uint16_t> d_table(table, stream());
    DeviceVector<int32_t> d_ids(ids, stream());
    DeviceVector<uint16_t> d_out(size_t{1} * c.num_rows * c.width);
    d_out.Poison(stream());
    // Rows to clear, 8 wider than the table (16-byte stores where the width allows them), and
    // one row more than the gather's, which must keep its poison.
    const int clear_width = c.width + 8;
    DeviceVector<uint16_t> d_clear(size_t{1} * (c.num_rows + 1) * clear_width);
    d_clear.Poison(stream());
    ASSERT_EQ(LaunchEmbeddingGather(Bf(d_table.get()), c.table_rows, c.width, d_ids.get(),
                                    c.num_rows, Bf(d_out.get()), stream(), Bf(d_clear.get()),
                                    clear_width),
              cudaSuccess);
    const std::vector<uint16_t> out = d_out.Download(stream());
    const std::vector<uint16_t> cleared = d_clear.Download(stream());
    for (size_t i = 0; i < cleared.size(); ++i) {
      const bool in_rows = i < size_t{1} * c.num_rows * clear_width;
      ASSERT_EQ(cleared[i] == 0, in_rows) << "clear element " << i << ": " << cleared[i];
    }
    for (int r = 0; r < c.num_rows; ++r) {
      const bool valid = ids[r] >= 0 && ids[r] < c.table_rows;
      for (int i = 0; i < c.width; ++i) {
        const uint16_t want = valid ? table[size_t{1} * ids[r] * c.width + i] : 0;
        ASSERT_EQ(out[size_t{1} * r * c.width + i], want) << "row " << r << " col " << i;
      }
    }
  }
  EXPECT_EQ(LaunchEmbeddingGather(nullptr, 1, 0, nullptr, 1, nullptr, stream()),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchEmbeddingGather(nullptr, 1, 8, nullptr, 0, nullptr, stream()), cudaSuccess);
  EXPECT_EQ(LaunchEmbeddingGather(nullptr, 1, 8, nullptr, 1, nullptr, stream(), nullptr, -1),
            cudaErrorInvalidValue);
}

// ---------------------------------------------------------------- RMSNorm

class RmsNormGpuTest : public GpuTest {};

TEST_F(RmsNormGpuTest, MatchesReferenceWithAndWithoutResidual) {
  struct Case { int tokens, hidden; };
  const float eps = 1e-5f;
  for (const Case c : {Case{1, 2048}, Case{3, 8192}, Case{67, 2048}, Case{5, 16384}, Case{2, 32768},
                       Case{9, 24}, Case{4, 1000}, Case{7, 1001}, Case{3, 4096 + 3}}) {
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " hidden " << c.hidden
                                        << (fused ? " fused" : ""));
      const size_t n = size_t{1} * c.tokens * c.hidden;
      const std::vector<uint16_t> x = RandomBf16(n, -2, 2);
      const std::vector<uint16_t> res = RandomBf16(n, -2, 2);
      const std::vector<uint16_t> w = RandomBf16(c.hidden, 0.5, 1.5);
      DeviceVector<uint16_t> d_x(x, stream()), d_res(res, stream()), d_w(w, stream());
      DeviceVector<uint16_t> d_out(n);
      d_out.Poison(stream());
      const cudaError_t err =
          fused ? LaunchFusedAddRmsNorm(Bf(d_x.get()), Bf(d_res.get()), Bf(d_w.get()),
                                        Bf(d_out.get()), c.tokens, c.hidden, eps, stream())
                : LaunchRmsNorm(Bf(d_x.get()), Bf(d_w.get()), Bf(d_out.get()), c.tokens,
                                c.hidden, eps, stream());
      if (c.hidden == 4096 + 3) {  // unaligned rows above the scalar path's limit
        EXPECT_EQ(err, cudaErrorInvalidValue);
        continue;
      }
      ASSERT_EQ(err, cudaSuccess);
      const std::vector<uint16_t> out = d_out.Download(stream());
      const std::vector<uint16_t> res_out = d_res.Download(stream());
      std::vector<double> ref(n);
      for (int t = 0; t < c.tokens; ++t) {
        std::vector<double> v(c.hidden);
        double ss = 0;
        for (int i = 0; i < c.hidden; ++i) {
          const size_t k = size_t{1} * t * c.hidden + i;
          v[i] = ToDouble(x[k]);
          if (fused) {
            // The GPU rounds the float sum to bf16; float(x + r) is the exact sum rounded once.
            const uint16_t want = FloatToBf16Bits(static_cast<float>(v[i] + ToDouble(res[k])));
            ASSERT_EQ(res_out[k], want) << "residual " << k;
            v[i] = ToDouble(want);
          }
          ss += v[i] * v[i];
        }
        const double scale = 1.0 / std::sqrt(ss / c.hidden + eps);
        for (int i = 0; i < c.hidden; ++i) {
          ref[size_t{1} * t * c.hidden + i] = v[i] * scale * ToDouble(w[i]);
        }
      }
      if (!fused) {
        EXPECT_EQ(res_out, res);  // untouched
      }
      EXPECT_LT(RelativeError(Bf16ToDouble(out), ref), kBf16Tolerance);
    }
  }
}

TEST_F(RmsNormGpuTest, InPlaceAndBitwiseReproducible) {
  const int tokens = 13, hidden = 2048;
  const std::vector<uint16_t> x = RandomBf16(size_t{1} * tokens * hidden, -4, 4);
  const std::vector<uint16_t> w = RandomBf16(hidden, 0.5, 1.5);
  DeviceVector<uint16_t> d_x(x, stream()), d_w(w, stream()), d_out(x.size());
  d_out.Poison(stream());
  ASSERT_EQ(LaunchRmsNorm(Bf(d_x.get()), Bf(d_w.get()), Bf(d_out.get()), tokens, hidden, 1e-6f,
                          stream()),
            cudaSuccess);
  const std::vector<uint16_t> out_of_place = d_out.Download(stream());
  ASSERT_EQ(LaunchRmsNorm(Bf(d_x.get()), Bf(d_w.get()), Bf(d_x.get()), tokens, hidden, 1e-6f,
                          stream()),
            cudaSuccess);
  EXPECT_EQ(d_x.Download(stream()), out_of_place);
}

// ---------------------------------------------------------------- RoPE

struct RopeCase {
  int tokens, heads, kv_heads, head_dim;
  double theta;
  RopeScaling scaling;  // none unless set
};

std::vector<double> RopeReference(const std::vector<uint16_t>& qkv, const std::vector<int32_t>& pos,
                                  const RopeCase& c) {
  const int width = (c.heads + 2 * c.kv_heads) * c.head_dim;
  const int half = c.head_dim / 2;
  std::vector<double> out = Bf16ToDouble(qkv);
  // The frequencies are RopeFrequency's on the host (checked against Llama 3's wavelength form
  // in //attention:rope_frequency_test); the angles, cos and sin are double here.
  const RopeFrequencies freqs = RopeFrequencies::Make(c.theta, c.scaling);
  for (int t = 0; t < c.tokens; ++t) {
    for (int h = 0; h < c.heads + c.kv_heads; ++h) {
      double* x = out.data() + size_t{1} * t * width + h * c.head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = pos[t] * RopeFrequency(freqs, i, c.head_dim);
        const double a = x[i], b = x[i + half];
        x[i] = a * std::cos(angle) - b * std::sin(angle);
        x[i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  return out;
}

class RopeGpuTest : public GpuTest {};

TEST_F(RopeGpuTest, RotatesQAndKLeavesV) {
  for (const RopeCase c : {RopeCase{1, 32, 8, 64, 500000.0}, RopeCase{5, 4, 2, 128, 10000.0},
                           RopeCase{33, 5, 1, 64, 1e6}, RopeCase{3, 3, 1, 18, 10000.0},
                           RopeCase{2, 2, 2, 256, 500000.0},
                           // Llama 3.2 1B's scaling, and one whose bands split a small theta's
                           // pairs three ways.
                           RopeCase{6, 32, 8, 64, 500000.0, RopeScaling::Llama3(32, 1, 4, 8192)},
                           RopeCase{9, 4, 2, 64, 10000.0, RopeScaling::Llama3(8, 1, 4, 64)}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " heads " << c.heads << "/"
                                      << c.kv_heads << " head_dim " << c.head_dim << " scaling "
                                      << c.scaling.ToString());
    const int width = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const std::vector<uint16_t> qkv = RandomBf16(size_t{1} * c.tokens * width, -2, 2);
    std::vector<int32_t> pos(c.tokens);
    for (auto& p : pos) p = RandomInt(1, 200000);
    // The identity rotation for token 0, but only beside tokens that rotate: a lone token at
    // position 0 would make the reference the input, which a kernel that rotated nothing passes.
    if (c.tokens > 1) pos[0] = 0;
    DeviceVector<uint16_t> d_qkv(qkv, stream());
    DeviceVector<int32_t> d_pos(pos, stream());
    ASSERT_EQ(LaunchRope(Bf(d_qkv.get()), d_pos.get(), c.tokens, c.heads, c.kv_heads, c.head_dim,
                         c.theta, c.scaling, stream()),
              cudaSuccess);
    const std::vector<uint16_t> out = d_qkv.Download(stream());
    const std::vector<double> ref = RopeReference(qkv, pos, c);
    EXPECT_LT(RelativeError(Bf16ToDouble(out), ref), kBf16Tolerance);
    for (int t = 0; t < c.tokens; ++t) {
      const size_t v_begin = size_t{1} * t * width + (c.heads + c.kv_heads) * c.head_dim;
      for (int i = 0; i < c.kv_heads * c.head_dim; ++i) {
        ASSERT_EQ(out[v_begin + i], qkv[v_begin + i]) << "V changed at token " << t;
      }
    }
    if (pos[0] == 0) {
      for (int i = 0; i < width; ++i) ASSERT_EQ(out[i], qkv[i]) << "position 0 must not rotate";
    }
  }
  EXPECT_EQ(LaunchRope(nullptr, nullptr, 1, 4, 2, 63, 1e4, {}, stream()), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRope(nullptr, nullptr, 1, 4, 2, 512, 1e4, {}, stream()), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRope(nullptr, nullptr, 1, 4, 2, 64, 1e4, RopeScaling::Llama3(0.5, 1, 4, 8192),
                       stream()),
            cudaErrorInvalidValue);
}

// ---------------------------------------------------------------- SiLU·mul

class SiluMulGpuTest : public GpuTest {};

TEST_F(SiluMulGpuTest, MatchesReference) {
  struct Case { int tokens, ffn; };
  for (const Case c : {Case{1, 8192}, Case{9, 8192}, Case{64, 512}, Case{3, 24}, Case{5, 1000},
                       Case{6, 1001}, Case{2, 3}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " ffn " << c.ffn);
    const std::vector<uint16_t> gu = RandomBf16(size_t{2} * c.tokens * c.ffn, -6, 6);
    DeviceVector<uint16_t> d_gu(gu, stream());
    DeviceVector<uint16_t> d_out(size_t{1} * c.tokens * c.ffn);
    d_out.Poison(stream());
    ASSERT_EQ(LaunchSiluMul(Bf(d_gu.get()), Bf(d_out.get()), c.tokens, c.ffn, stream()),
              cudaSuccess);
    std::vector<double> ref(size_t{1} * c.tokens * c.ffn);
    for (int t = 0; t < c.tokens; ++t) {
      for (int j = 0; j < c.ffn; ++j) {
        const double g = ToDouble(gu[size_t{2} * t * c.ffn + j]);
        const double u = ToDouble(gu[size_t{2} * t * c.ffn + c.ffn + j]);
        ref[size_t{1} * t * c.ffn + j] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    EXPECT_LT(RelativeError(Bf16ToDouble(d_out.Download(stream())), ref), kBf16Tolerance);
  }
}

// ---------------------------------------------------------------- bias add

class BiasAddGpuTest : public GpuTest {};

// In place: every row gains the bias, and nothing past the rows changes.
TEST_F(BiasAddGpuTest, MatchesReference) {
  struct Case { int tokens, width; };
  for (const Case c : {Case{1, 2560}, Case{9, 4608}, Case{64, 512}, Case{3, 24}, Case{5, 1001},
                       Case{2, 3}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " width " << c.width);
    const size_t n = size_t{1} * c.tokens * c.width;
    std::vector<uint16_t> y = RandomBf16(n + c.width, -4, 4);  // one row past the matrix
    const std::vector<uint16_t> bias = RandomBf16(c.width, -1, 1);
    DeviceVector<uint16_t> d_y(y, stream());
    DeviceVector<uint16_t> d_bias(bias, stream());
    ASSERT_EQ(LaunchBiasAdd(Bf(d_y.get()), Bf(d_bias.get()), c.tokens, c.width, stream()),
              cudaSuccess);
    const std::vector<uint16_t> got = d_y.Download(stream());
    std::vector<double> ref(n);
    for (size_t i = 0; i < n; ++i) ref[i] = ToDouble(y[i]) + ToDouble(bias[i % c.width]);
    std::vector<uint16_t> rows(got.begin(), got.begin() + n);
    EXPECT_LT(RelativeError(Bf16ToDouble(rows), ref), kBf16Tolerance);
    EXPECT_TRUE(std::equal(got.begin() + n, got.end(), y.begin() + n)) << "wrote past the rows";
  }
  EXPECT_EQ(LaunchBiasAdd(nullptr, nullptr, 1, 8, stream()), cudaErrorInvalidValue);
}

// ---------------------------------------------------------------- QK norm

class QkNormGpuTest : public GpuTest {};

// In place: each q and k head divided by its RMS and multiplied by its side's weight, against a
// float64 computation; V and the row past the matrix stay as they were.
TEST_F(QkNormGpuTest, MatchesFloat64Reference) {
  struct Case { int tokens, heads, kv_heads, head_dim; };
  for (const Case c : {Case{1, 32, 8, 128}, Case{7, 16, 8, 128}, Case{33, 8, 2, 64},
                       Case{2, 28, 4, 128}, Case{3, 5, 5, 256}, Case{4, 3, 1, 40}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << ", heads " << c.heads << "/"
                                      << c.kv_heads << " x " << c.head_dim);
    const int d = c.head_dim;
    const int row = (c.heads + 2 * c.kv_heads) * d;
    const size_t n = size_t{1} * c.tokens * row;
    std::vector<uint16_t> x = RandomBf16(n + row, -3, 3);  // one row past the matrix
    const std::vector<uint16_t> q_norm = RandomBf16(d, 0.5, 1.5);
    const std::vector<uint16_t> k_norm = RandomBf16(d, 0.5, 1.5);
    DeviceVector<uint16_t> d_x(x, stream());
    DeviceVector<uint16_t> d_q(q_norm, stream());
    DeviceVector<uint16_t> d_k(k_norm, stream());
    const float eps = 1e-6f;
    ASSERT_EQ(LaunchQkNorm(Bf(d_x.get()), Bf(d_q.get()), Bf(d_k.get()), c.tokens, c.heads,
                           c.kv_heads, d, eps, stream()),
              cudaSuccess);
    const std::vector<uint16_t> got = d_x.Download(stream());
    std::vector<double> ref(n);
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.heads + 2 * c.kv_heads; ++h) {
        const size_t base = size_t{1} * t * row + size_t{1} * h * d;
        if (h >= c.heads + c.kv_heads) {  // V: untouched
          for (int i = 0; i < d; ++i) ref[base + i] = ToDouble(x[base + i]);
          continue;
        }
        const std::vector<uint16_t>& w = h < c.heads ? q_norm : k_norm;
        double ms = 0;
        for (int i = 0; i < d; ++i) ms += ToDouble(x[base + i]) * ToDouble(x[base + i]) / d;
        for (int i = 0; i < d; ++i) {
          ref[base + i] = ToDouble(x[base + i]) / std::sqrt(ms + eps) * ToDouble(w[i]);
        }
      }
    }
    std::vector<uint16_t> rows(got.begin(), got.begin() + n);
    EXPECT_LT(RelativeError(Bf16ToDouble(rows), ref), kBf16Tolerance);
    for (int t = 0; t < c.tokens; ++t) {  // V bit for bit
      const size_t v = size_t{1} * t * row + size_t{1} * (c.heads + c.kv_heads) * d;
      ASSERT_TRUE(std::equal(got.begin() + v, got.begin() + v + size_t{1} * c.kv_heads * d,
                             x.begin() + v))
          << "V of token " << t << " changed";
    }
    EXPECT_TRUE(std::equal(got.begin() + n, got.end(), x.begin() + n)) << "wrote past the rows";
  }
  const std::vector<uint16_t> w = RandomBf16(64, 0.5, 1.5);
  DeviceVector<uint16_t> d_w(w, stream());
  EXPECT_EQ(LaunchQkNorm(nullptr, Bf(d_w.get()), Bf(d_w.get()), 1, 1, 1, 64, 1e-6f, stream()),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchQkNorm(Bf(d_w.get()), Bf(d_w.get()), Bf(d_w.get()), 1, 1, 1, 512, 1e-6f,
                         stream()),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchQkNorm(Bf(d_w.get()), Bf(d_w.get()), Bf(d_w.get()), 1, 1, 1, 64, 0.0f,
                         stream()),
            cudaErrorInvalidValue);
}

// ---------------------------------------------------------------- greedy sampling

int32_t HostArgmax(const std::vector<float>& row) {
  int32_t best = -1;
  for (size_t i = 0; i < row.size(); ++i) {
    if (std::isnan(row[i])) continue;
    if (best < 0 || row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

class GreedySampleGpuTest : public GpuTest {
 protected:
  // Returns `rows` rows of random logits, rounded to bf16 values when `bf16`.
  std::vector<std::vector<float>> RandomRows(int rows, int vocab, bool bf16) {
    std::vector<std::vector<float>> out(rows, std::vector<float>(vocab));
    std::uniform_real_distribution<float> dist(-8, 8);
    for (auto& row : out) {
      for (float& v : row) {
        v = dist(rng_);
        if (bf16) v = Bf16BitsToFloat(FloatToBf16Bits(v));
      }
    }
    return out;
  }

  // Fills rows with random logits and plants ties, NaNs and degenerate rows.
  std::vector<std::vector<float>> MakeRows(int rows, int vocab, bool bf16) {
    std::vector<std::vector<float>> out = RandomRows(rows, vocab, bf16);
    for (int r = 0; r < rows; ++r) {
      const int kind = r % 5;
      if (kind == 1 && vocab > 2) {  // tie between two random positions: the lower must win
        const int a = RandomInt(0, vocab - 1), b = RandomInt(0, vocab - 1);
        out[r][a] = out[r][b] = 9.0f;
      } else if (kind == 2 && vocab > 9) {  // tie near the end of the row, 7 apart
        out[r][vocab - 2] = out[r][vocab - 9] = 10.0f;
      } else if (kind == 3) {  // NaNs everywhere but one value
        for (float& v : out[r]) v = std::numeric_limits<float>::quiet_NaN();
        out[r][RandomInt(0, vocab - 1)] = -1.0f;
      } else if (kind == 4 && r % 2 == 0) {  // all NaN: -1
        for (float& v : out[r]) v = std::numeric_limits<float>::quiet_NaN();
      }
    }
    if (rows > 5) {  // all -inf: index 0
      for (float& v : out[5]) v = -std::numeric_limits<float>::infinity();
    }
    return out;
  }

  // Rows whose maxima sit where a row is split between blocks (on sm_90+ a cluster of 8 scans
  // it in 8 slices of about vocab / 8): at the ends of the row, around the first slice's edge,
  // and ties across slices that the lowest index must win.
  std::vector<std::vector<float>> SliceEdgeRows(int vocab, bool bf16) {
    std::vector<std::vector<float>> out = RandomRows(8, vocab, bf16);
    const int eighth = vocab / 8;
    out[0][3] = out[0][vocab - 2] = 9.0f;  // far apart: 3 wins
    out[1][0] = 9.0f;
    out[2][vocab - 1] = 9.0f;
    out[3][eighth - 1] = 9.0f;  // vocab / 8 is the first slice's end, or one short of it
    out[4][eighth] = 9.0f;
    out[5][eighth + 1] = 9.0f;
    for (int k = 0; k < 8; ++k) out[6][k * vocab / 8 + eighth / 2] = 9.0f;  // one per slice
    for (float& v : out[7]) v = std::numeric_limits<float>::quiet_NaN();
    out[7][vocab - 1] = -1.0f;  // NaN everywhere but the last element
    return out;
  }

  // Launches the kernel over `logits` (rounded to bf16 values for T = uint16_t) into a
  // poisoned output and a poisoned mirror in pinned host memory, and compares each row of both
  // with HostArgmax.
  template <typename T>
  void Run(const std::vector<std::vector<float>>& logits) {
    const int rows = static_cast<int>(logits.size());
    const int vocab = static_cast<int>(logits[0].size());
    std::vector<T> flat(size_t{1} * rows * vocab);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < vocab; ++j) {
        if constexpr (sizeof(T) == 2) {
          flat[size_t{1} * r * vocab + j] = FloatToBf16Bits(logits[r][j]);
        } else {
          flat[size_t{1} * r * vocab + j] = logits[r][j];
        }
      }
    }
    DeviceVector<T> d_logits(flat, stream());
    DeviceVector<int32_t> d_tokens(rows);
    d_tokens.Poison(stream(), 0x7B);
    void* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, sizeof(int32_t) * rows), cudaSuccess);
    const std::unique_ptr<void, cudaError_t (*)(void*)> owned(pinned, cudaFreeHost);
    int32_t* mirror = static_cast<int32_t*>(pinned);
    std::fill(mirror, mirror + rows, 0x7B7B7B7B);
    cudaError_t err;
    if constexpr (sizeof(T) == 2) {
      err = LaunchGreedySample(reinterpret_cast<const __nv_bfloat16*>(d_logits.get()), rows, vocab,
                               d_tokens.get(), stream(), mirror);
    } else {
      err = LaunchGreedySample(d_logits.get(), rows, vocab, d_tokens.get(), stream(), mirror);
    }
    ASSERT_EQ(err, cudaSuccess);
    const std::vector<int32_t> tokens = d_tokens.Download(stream());  // synchronizes the stream
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(tokens[r], HostArgmax(logits[r])) << "row " << r;
      EXPECT_EQ(mirror[r], tokens[r]) << "mirror row " << r;
    }
  }

  template <typename T>
  void Check(int rows, int vocab) {
    Run<T>(MakeRows(rows, vocab, sizeof(T) == 2));
  }
};

TEST_F(GreedySampleGpuTest, Bf16ArgmaxWithLowestIndexTies) {
  for (int vocab : {128256, 1000, 1001, 7, 1}) {
    SCOPED_TRACE(vocab);
    for (int rows : {1, 3, 33}) Check<uint16_t>(rows, vocab);
  }
}

TEST_F(GreedySampleGpuTest, FloatArgmaxWithLowestIndexTies) {
  for (int vocab : {128256, 1024, 1001, 6}) {
    SCOPED_TRACE(vocab);
    for (int rows : {1, 8, 17}) Check<float>(rows, vocab);
  }
}

// 8 and 9 leave most blocks of a cluster an empty slice (fewer elements than blocks × vector
// width); 128257 takes the scalar path over slices of odd length.
TEST_F(GreedySampleGpuTest, Bf16MaximaAtSliceEdges) {
  for (int vocab : {128256, 128257, 8, 9}) {
    SCOPED_TRACE(vocab);
    Run<uint16_t>(SliceEdgeRows(vocab, /*bf16=*/true));
  }
}

TEST_F(GreedySampleGpuTest, FloatMaximaAtSliceEdges) {
  for (int vocab : {128256, 128257, 8, 9}) {
    SCOPED_TRACE(vocab);
    Run<float>(SliceEdgeRows(vocab, /*bf16=*/false));
  }
}

TEST_F(GreedySampleGpuTest, RefusesBadSizes) {
  DeviceVector<float> d_logits(16);
  DeviceVector<int32_t> d_tokens(1);
  EXPECT_EQ(LaunchGreedySample(d_logits.get(), -1, 16, d_tokens.get(), stream()),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchGreedySample(d_logits.get(), 65536, 16, d_tokens.get(), stream()),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchGreedySample(d_logits.get(), 1, 0, d_tokens.get(), stream()),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchGreedySample(d_logits.get(), 0, 16, d_tokens.get(), stream()), cudaSuccess);
}

// ---------------------------------------------------------------- argument checks

// What each launcher refuses before it launches anything (this test needs no GPU): a null
// tensor where there are rows to read or write, an epsilon that makes the norm NaN, sizes whose
// int indices would wrap. Zero rows still launch nothing, null pointers or not.
TEST(KernelArgumentsTest, NullTensorsAndWrappingSizesAreRefusedBeforeAnyLaunch) {
  alignas(16) static uint16_t buffer[64];
  alignas(16) static int32_t ids[8];
  alignas(16) static float logits[8];
  __nv_bfloat16* p = Bf(buffer);
  constexpr cudaError_t kRefused = cudaErrorInvalidValue;

  EXPECT_EQ(LaunchEmbeddingGather(nullptr, 4, 8, ids, 1, p, nullptr), kRefused);
  EXPECT_EQ(LaunchEmbeddingGather(p, 4, 8, nullptr, 1, p, nullptr), kRefused);
  EXPECT_EQ(LaunchEmbeddingGather(p, 4, 8, ids, 1, nullptr, nullptr), kRefused);
  EXPECT_EQ(LaunchEmbeddingGather(nullptr, 4, 8, nullptr, 0, nullptr, nullptr), cudaSuccess);

  EXPECT_EQ(LaunchRmsNorm(nullptr, p, p, 1, 8, 1e-5f, nullptr), kRefused);
  EXPECT_EQ(LaunchRmsNorm(p, nullptr, p, 1, 8, 1e-5f, nullptr), kRefused);
  EXPECT_EQ(LaunchRmsNorm(p, p, nullptr, 1, 8, 1e-5f, nullptr), kRefused);
  EXPECT_EQ(LaunchFusedAddRmsNorm(p, nullptr, p, p, 1, 8, 1e-5f, nullptr), kRefused);
  EXPECT_EQ(LaunchRmsNorm(p, p, p, 1, 8, -1e-5f, nullptr), kRefused);
  EXPECT_EQ(LaunchFusedAddRmsNorm(p, p, p, p, 1, 8, std::nanf(""), nullptr), kRefused);
  EXPECT_EQ(LaunchRmsNorm(nullptr, nullptr, nullptr, 0, 8, 1e-5f, nullptr), cudaSuccess);

  EXPECT_EQ(LaunchSiluMul(nullptr, p, 1, 8, nullptr), kRefused);
  EXPECT_EQ(LaunchSiluMul(p, nullptr, 1, 8, nullptr), kRefused);
  EXPECT_EQ(LaunchSiluMul(nullptr, nullptr, 0, 8, nullptr), cudaSuccess);

  EXPECT_EQ(LaunchRope(nullptr, ids, 1, 4, 2, 64, 1e4, {}, nullptr), kRefused);
  EXPECT_EQ(LaunchRope(p, nullptr, 1, 4, 2, 64, 1e4, {}, nullptr), kRefused);
  // (2^22 + 2 · 2^21) heads × 256 = 2^31 elements a row: its int offsets would wrap.
  EXPECT_EQ(LaunchRope(p, ids, 1, 1 << 22, 1 << 21, 256, 1e4, {}, nullptr), kRefused);

  EXPECT_EQ(LaunchGreedySample(static_cast<const float*>(nullptr), 1, 8, ids, nullptr), kRefused);
  EXPECT_EQ(LaunchGreedySample(logits, 1, 8, nullptr, nullptr), kRefused);
  EXPECT_EQ(LaunchGreedySample(Bf(buffer), 1, 8, nullptr, nullptr), kRefused);
  // A row's last round looks up to 2^14 elements past its end: int indices would wrap.
  EXPECT_EQ(LaunchGreedySample(logits, 1, std::numeric_limits<int32_t>::max(), ids, nullptr),
            kRefused);
  EXPECT_EQ(LaunchGreedySample(logits, 0, 8, nullptr, nullptr), cudaSuccess);
}

// ---------------------------------------------------------------- graph replay

// The launch shapes depend only on sizes: a graph captured once gives the right answer for new
// token ids, positions and logits written into the same buffers.
class KernelGraphGpuTest : public GpuTest {};

TEST_F(KernelGraphGpuTest, ReplaysForNewContents) {
  const RopeCase c{8, 4, 2, 64, 10000.0};
  const int width = (c.heads + 2 * c.kv_heads) * c.head_dim;
  const int table_rows = 512, vocab = 1000;
  DeviceVector<uint16_t> d_table(size_t{1} * table_rows * width);
  DeviceVector<int32_t> d_ids(c.tokens), d_pos(c.tokens), d_next(c.tokens);
  DeviceVector<uint16_t> d_qkv(size_t{1} * c.tokens * width);
  DeviceVector<float> d_logits(size_t{1} * c.tokens * vocab);

  auto record = [&] {
    EXPECT_EQ(LaunchEmbeddingGather(Bf(d_table.get()), table_rows, width, d_ids.get(), c.tokens,
                                    Bf(d_qkv.get()), stream()),
              cudaSuccess);
    EXPECT_EQ(LaunchRope(Bf(d_qkv.get()), d_pos.get(), c.tokens, c.heads, c.kv_heads, c.head_dim,
                         c.theta, c.scaling, stream()),
              cudaSuccess);
    EXPECT_EQ(LaunchGreedySample(d_logits.get(), c.tokens, vocab, d_next.get(), stream()),
              cudaSuccess);
  };
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal), cudaSuccess);
  record();
  ASSERT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    const std::vector<uint16_t> table = RandomBf16(size_t{1} * table_rows * width, -2, 2);
    std::vector<int32_t> ids(c.tokens), pos(c.tokens);
    for (auto& id : ids) id = RandomInt(0, table_rows - 1);
    for (auto& p : pos) p = RandomInt(0, 100000);
    std::vector<float> logits(size_t{1} * c.tokens * vocab);
    for (auto& l : logits) l = static_cast<float>(RandomInt(-1000, 1000));  // many ties
    d_table.Upload(table, stream());
    d_ids.Upload(ids, stream());
    d_pos.Upload(pos, stream());
    d_logits.Upload(logits, stream());
    d_qkv.Poison(stream());
    d_next.Poison(stream(), 0x7B);
    ASSERT_EQ(cudaGraphLaunch(exec, stream()), cudaSuccess);

    std::vector<uint16_t> gathered(size_t{1} * c.tokens * width);
    for (int t = 0; t < c.tokens; ++t) {
      std::copy_n(table.begin() + size_t{1} * ids[t] * width, width,
                  gathered.begin() + size_t{1} * t * width);
    }
    EXPECT_LT(
        RelativeError(Bf16ToDouble(d_qkv.Download(stream())), RopeReference(gathered, pos, c)),
        kBf16Tolerance);
    const std::vector<int32_t> next = d_next.Download(stream());
    for (int t = 0; t < c.tokens; ++t) {
      EXPECT_EQ(next[t],
                HostArgmax(std::vector<float>(logits.begin() + size_t{1} * t * vocab,
                                              logits.begin() + size_t{1} * (t + 1) * vocab)));
    }
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

}  // namespace
}  // namespace kiln
