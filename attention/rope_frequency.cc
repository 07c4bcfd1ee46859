#include "attention/rope_frequency.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {

absl::Status RopeScaling::Validate() const {
  if (!enabled()) return absl::OkStatus();
  if (!(factor >= 1.0) || !std::isfinite(factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE scaling factor is ", factor,
        "; it must be a finite value of at least 1 (or 0 for no scaling)"));
  }
  if (!(low_freq_factor > 0.0) || !std::isfinite(low_freq_factor)) {
    return absl::InvalidArgumentError(absl::StrCat("RoPE scaling low_freq_factor is ",
                                                   low_freq_factor,
                                                   "; it must be a finite positive value"));
  }
  if (!(high_freq_factor > low_freq_factor) || !std::isfinite(high_freq_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE scaling high_freq_factor is ", high_freq_factor,
        "; it must be finite and above low_freq_factor ", low_freq_factor));
  }
  if (original_max_position <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RoPE scaling original_max_position is ", original_max_position,
        "; it must be positive (the checkpoint's original_max_position_embeddings)"));
  }
  // Make() turns the factors into band edges 2π · high / L and 2π · low / L and a blend
  // L / (2π · (high − low)) − low / (high − low). Finite factors can still overflow or vanish
  // there (high_freq_factor near DBL_MAX makes the blend's slope 0 and its value negative),
  // so the derived values must be finite with a positive slope.
  const RopeFrequencies f = RopeFrequencies::Make(/*theta=*/2.0, *this);
  if (!std::isfinite(f.keep_from) || !std::isfinite(f.divide_below) ||
      !std::isfinite(f.blend_scale) || !(f.blend_scale > 0.0) ||
      !std::isfinite(f.blend_offset)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RoPE scaling low_freq_factor %g and high_freq_factor %g over original_max_position %d "
        "give band edges or a blend that overflow a double; use factors of ordinary size "
        "(Llama 3: 1 and 4)",
        low_freq_factor, high_freq_factor, original_max_position));
  }
  return absl::OkStatus();
}

std::string RopeScaling::ToString() const {
  if (!enabled()) return "none";
  return absl::StrFormat("llama3 x%g (low %g, high %g, original %d)", factor, low_freq_factor,
                         high_freq_factor, original_max_position);
}

}  // namespace kiln
