#include "attention/attention_params.h"

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status CheckAttentionDtype(AttentionDtype dtype, absl::string_view what) {
  if (dtype == AttentionDtype::kBf16 || dtype == AttentionDtype::kFp16) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " dtype ", static_cast<int>(dtype), " is not supported; use kBf16 (",
      static_cast<int>(AttentionDtype::kBf16), ") or kFp16 (",
      static_cast<int>(AttentionDtype::kFp16), ")"));
}

}  // namespace kiln
