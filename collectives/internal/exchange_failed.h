// Internal to //collectives:custom_allreduce: the one rule for a bootstrap exchange of the custom
// all-reduce that failed (ExchangeFailed), and the rule built on it for a failed capture
// agreement (CaptureAgreementLost). Host-only: no CUDA calls.
//
//   absl::StatusOr<std::vector<std::string>> all = bootstrap.AllGather(mine, call);
//   if (!all.ok()) return internal::ExchangeFailed(bootstrap.rank(), call, all.status());
#ifndef KILN_COLLECTIVES_INTERNAL_EXCHANGE_FAILED_H_
#define KILN_COLLECTIVES_INTERNAL_EXCHANGE_FAILED_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln {
namespace internal {

// Returns the error the custom all-reduce of rank `this_rank` reports when its bootstrap exchange
// named `call` failed with `failed` (not OK): Aborted when `failed` is Unavailable (the bootstrap
// lost a peer; its message names it), else `failed`'s code; the message names this rank and the
// call (escaped and quoted, as the bootstrap quotes call names), then gives `failed`'s. Never
// Unavailable: from the custom all-reduce that code means the ranks agreed it cannot run
// (AutoCommunicator then takes NCCL alone) or that one captured call takes NCCL
// (CheckCaptureAgreement), and a lost peer is neither. The one rule for every exchange of the
// custom all-reduce. Depends only on its arguments. Thread-safe.
absl::Status ExchangeFailed(int this_rank, absl::string_view call, const absl::Status& failed);

// The bootstrap call name of the capture agreement's all-gather (graph_input_record.h's
// CaptureAgreementMessage). Consecutive agreements share it; the slot in their messages tells
// them apart.
inline constexpr char kCaptureAgreementCall[] = "custom_allreduce.capture_agreement";

// Returns the error that leaves the custom all-reduce of rank `this_rank` unusable when the
// all-gather of the capture agreement failed with `gather` (not OK): ExchangeFailed of
// kCaptureAgreementCall (its code and message), then that the ranks could not agree on a captured
// call and that the communicator must be recreated. Thread-safe.
absl::Status CaptureAgreementLost(int this_rank, const absl::Status& gather);

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_EXCHANGE_FAILED_H_
