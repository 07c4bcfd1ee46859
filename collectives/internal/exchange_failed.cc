#include "collectives/internal/exchange_failed.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
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

absl::Status CaptureAgreementLost(int this_rank, const absl::Status& gather) {
  const absl::Status failed = ExchangeFailed(this_rank, kCaptureAgreementCall, gather);
  // The bootstrap's words may end a sentence already ("did that process exit?").
  const absl::string_view why = failed.message();
  const bool ended = !why.empty() && (why.back() == '.' || why.back() == '?' || why.back() == '!');
  return absl::Status(failed.code(),
                      absl::StrCat(why, ended ? " " : ". ",
                                   "The ranks could not agree on a captured call: this "
                                   "communicator is unusable; recreate it on every rank"));
}

}  // namespace internal
}  // namespace kiln
