#include "attention/rope_frequency.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {

namespace {

// The field rules of RopeScaling::Validate, for an enabled scaling.
absl::Status CheckFactors(const RopeScaling& s) {
  if (!(s.factor >= 1.0) || !std::isfinite(s.factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE scaling factor is ", s.factor,
        "; it must be a finite value of at least 1 (or 0 for no scaling)"));
  }
  if (!(s.low_freq_factor > 0.0) || !std::isfinite(s.low_freq_factor)) {
    return absl::InvalidArgumentError(absl::StrCat("RoPE scaling low_freq_factor is ",
                                                   s.low_freq_factor,
                                                   "; it must be a finite positive value"));
  }
  if (!(s.high_freq_factor > s.low_freq_factor) || !std::isfinite(s.high_freq_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE scaling high_freq_factor is ", s.high_freq_factor,
        "; it must be finite and above low_freq_factor ", s.low_freq_factor));
  }
  if (s.original_max_position <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE scaling original_max_position is ", s.original_max_position,
        "; it must be positive (the checkpoint's original_max_position_embeddings)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RopeFrequencies> RopeFrequencies::MakeValidated(double theta,
                                                               const RopeScaling& scaling) {
  if (!scaling.enabled()) return Make(theta, scaling);
  if (absl::Status status = CheckFactors(scaling); !status.ok()) return status;
  // Make() turns the factors into band edges 2π · high / L and 2π · low / L and a blend
  // L / (2π · (high − low)) − low / (high − low). Finite factors can still overflow or vanish
  // there (high_freq_factor near DBL_MAX makes the blend's slope 0 and its value negative),
  // so the derived values must be finite with a positive slope.
  const RopeFrequencies f = Make(theta, scaling);
  if (!std::isfinite(f.keep_from) || !std::isfinite(f.divide_below) ||
      !std::isfinite(f.blend_scale) || !(f.blend_scale > 0.0) ||
      !std::isfinite(f.blend_offset)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RoPE scaling low_freq_factor %g and high_freq_factor %g over original_max_position %d "
        "give band edges or a blend that overflow a double; use factors of ordinary size "
        "(Llama 3: 1 and 4)",
        scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position));
  }
  return f;
}

// The checks read only the theta-free fields of the derivation, so any theta answers alike.
absl::Status RopeScaling::Validate() const {
  return RopeFrequencies::MakeValidated(/*theta=*/2.0, *this).status();
}

std::string RopeScaling::ToString() const {
  if (!enabled()) return "none";
  return absl::StrFormat("llama3 x%g (low %g, high %g, original %d)", factor, low_freq_factor,
                         high_freq_factor, original_max_position);
}

}  // namespace kiln
