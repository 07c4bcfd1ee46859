// RoPE's per-pair frequencies, on the host and on the device: theta^(-2i/d) for pair i of a
// head of width d, optionally rescaled the way Llama 3.1 and 3.2 were trained ("rope_scaling":
// {"rope_type": "llama3", ...} in their config.json). Every kiln kernel that rotates q or k and
// the CPU reference take their frequencies from RopeFrequency, so they agree on the scaling.
//
//   kiln::RopeScaling scaling = kiln::RopeScaling::Llama3(32.0, 1.0, 4.0, 8192);  // Llama 3.2 1B
//   RETURN_IF_ERROR(scaling.Validate());
//   kiln::RopeFrequencies f = kiln::RopeFrequencies::Make(500000.0, scaling);  // kernel argument
//   double freq = kiln::RopeFrequency(f, i, head_dim);   // radians per position, pair i < d / 2
//   // Or both in one derivation, for a launch that checks the scaling and then uses it:
//   ASSIGN_OR_RETURN(f, kiln::RopeFrequencies::MakeValidated(500000.0, scaling));
//
// Llama 3 scaling (Meta's reference and Hugging Face's "llama3" rope type): with
// L = original_max_position and wavelength w = 2π / freq, pairs with w < L / high_freq_factor
// keep their frequency, pairs with w > L / low_freq_factor have it divided by factor, and
// between the two s = (L / w − low_freq_factor) / (high_freq_factor − low_freq_factor) blends
// them: (1 − s) · freq / factor + s · freq. All in double, the division as a product with
// 1 / factor (a division costs the kernels' prologues more). Plain values; thread-safe.
#ifndef KILN_ATTENTION_ROPE_FREQUENCY_H_
#define KILN_ATTENTION_ROPE_FREQUENCY_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#if defined(__CUDACC__)
#define KILN_ROPE_HOST_DEVICE __host__ __device__
#else
#define KILN_ROPE_HOST_DEVICE
#endif

namespace kiln {

// A checkpoint's RoPE frequency scaling; factor 0 (the default) is none.
struct RopeScaling {
  double factor = 0.0;                // >= 1: long wavelengths' frequencies are divided by it
  double low_freq_factor = 0.0;       // > 0: w > L / low_freq_factor is divided by factor
  double high_freq_factor = 0.0;      // > low_freq_factor: w < L / high_freq_factor is kept
  int32_t original_max_position = 0;  // L (original_max_position_embeddings), > 0

  static RopeScaling Llama3(double factor, double low_freq_factor, double high_freq_factor,
                            int32_t original_max_position) {
    return {factor, low_freq_factor, high_freq_factor, original_max_position};
  }
  bool enabled() const { return factor != 0.0; }
  // OK when disabled or when factor >= 1, 0 < low_freq_factor < high_freq_factor and
  // original_max_position > 0, all finite, and the band edges and blend that Make() derives from
  // them are finite; else InvalidArgument naming the field. With a theta above 1, a scaling it
  // accepts gives finite frequencies between freq / factor and freq. A launch that goes on to
  // use the frequencies calls RopeFrequencies::MakeValidated instead (one derivation, not two).
  absl::Status Validate() const;
  // "none", or e.g. "llama3 x32 (low 1, high 4, original 8192)".
  std::string ToString() const;
  bool operator==(const RopeScaling& o) const {
    return factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor &&
           original_max_position == o.original_max_position;
  }
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
};

// Returns whether `theta` is a RoPE base the kernels take: finite and above 1. Below 1 the
// frequencies grow past 1, and a subnormal theta makes them infinite (NaN outputs).
inline bool IsRopeTheta(double theta) {
  return theta > 1.0 && std::isfinite(theta);
}

// theta and the scaling in the form the kernels use: a kernel argument (trivially copyable).
struct RopeFrequencies {
  double log2_theta = 0.0;
  int32_t scaled = 0;          // 0: freq = theta^(-2i/d) and the fields below are unused
  double inv_factor = 1.0;     // 1 / factor: a product where a division would cost the prologue
  double keep_from = 0.0;      // freq >= this (w <= L / high_freq_factor): kept
  double divide_below = 0.0;   // freq < this (w > L / low_freq_factor): divided by factor
  double blend_scale = 0.0;    // s = freq · blend_scale − blend_offset = (L / w − low) / (high − low)
  double blend_offset = 0.0;

  // Host only. IsRopeTheta(theta) and a valid scaling (RopeScaling::Validate) are the
  // caller's to check.
  static RopeFrequencies Make(double theta, const RopeScaling& scaling) {
    RopeFrequencies f;
    f.log2_theta = std::log2(theta);
    if (!scaling.enabled()) return f;
    const double two_pi = 6.283185307179586476925286766559;
    const double length = scaling.original_max_position;
    f.scaled = 1;
    f.inv_factor = 1.0 / scaling.factor;
    f.keep_from = two_pi * scaling.high_freq_factor / length;
    f.divide_below = two_pi * scaling.low_freq_factor / length;
    const double band = scaling.high_freq_factor - scaling.low_freq_factor;
    f.blend_scale = length / (two_pi * band);
    f.blend_offset = scaling.low_freq_factor / band;
    return f;
  }

  // Returns Make(theta, scaling) when scaling.Validate() accepts the scaling, else the same
  // InvalidArgument: the check reads the band edges and blend of this one derivation (they do
  // not depend on theta). Host only; IsRopeTheta(theta) is the caller's to check. Thread-safe.
  static absl::StatusOr<RopeFrequencies> MakeValidated(double theta, const RopeScaling& scaling);
};

// Pair i's frequency (radians per position) for heads of width head_dim.
KILN_ROPE_HOST_DEVICE inline double RopeFrequency(const RopeFrequencies& f, int i, int head_dim) {
#if defined(__CUDA_ARCH__)
  const double freq = exp2(-2.0 * i / head_dim * f.log2_theta);
#else
  const double freq = std::exp2(-2.0 * i / head_dim * f.log2_theta);
#endif
  if (!f.scaled || freq >= f.keep_from) return freq;
  const double divided = freq * f.inv_factor;
  if (freq < f.divide_below) return divided;
  const double s = freq * f.blend_scale - f.blend_offset;
  return (1.0 - s) * divided + s * freq;
}

}  // namespace kiln

#endif  // KILN_ATTENTION_ROPE_FREQUENCY_H_
