// Internal to //collectives:custom_allreduce: the one rule for a bootstrap exchange of the custom
// all-reduce that failed (ExchangeFailed). Host-only: no CUDA calls.
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

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_EXCHANGE_FAILED_H_
