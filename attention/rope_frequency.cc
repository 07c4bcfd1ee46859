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
  return absl::OkStatus();
}

std::string RopeScaling::ToString() const {
  if (!enabled()) return "none";
  return absl::StrFormat("llama3 x%g (low %g, high %g, original %d)", factor, low_freq_factor,
                         high_freq_factor, original_max_position);
}

}  // namespace kiln
