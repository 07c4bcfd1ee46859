#include "collectives/internal/exchange_failed.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace internal {

absl::Status ExchangeFailed(int this_rank, absl::string_view call, const absl::Status& failed) {
  const absl::StatusCode code =
      absl::IsUnavailable(failed) ? absl::StatusCode::kAborted : failed.code();
  return absl::Status(code, absl::StrFormat("Custom all-reduce on rank %d: exchange '%s' with the "
                                            "other ranks failed: %s",
                                            this_rank, absl::CHexEscape(call), failed.message()));
}

}  // namespace internal
}  // namespace kiln
