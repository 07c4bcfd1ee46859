// Agreement among the ranks of a tensor-parallel runner on the outcome of a step that each rank
// ran locally (a capture, an allocation): every rank returns the same Status, so no rank goes on
// to a collective that a failed peer will never join (which would hang it, or end in a timeout
// that hides the cause).
//
//   absl::Status local = graphs.Capture(key, fn, stream);
//   RETURN_IF_ERROR(kiln::AgreeOnStatus(bootstrap, local, "Capture of decode/8",
//                                       "my_runner.capture_agreement.decode/8"));
//   // every rank returns here, or every rank returned the same error above
//
// Host-only (the exchange runs over collectives/host_bootstrap.h's sockets, bounded by its
// timeout), so legal during graph capture. Collective; not thread-safe (one bootstrap).
#ifndef KILN_RUNTIME_RUNNER_RANK_AGREEMENT_H_
#define KILN_RUNTIME_RUNNER_RANK_AGREEMENT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "collectives/host_bootstrap.h"

namespace kiln {

// Exchanges `local` with every rank, as the bootstrap all-gather named `call`, and returns, on
// every rank alike: OK when every rank's status is OK; else the failing ranks' root cause with its
// code, as "<what> failed on rank r of n: <message>" (a rank's own error is preferred over a
// DeadlineExceeded or Unavailable, which is usually a consequence of it; among equals, the lowest
// rank). A rank whose bytes under that name are not a status record counts as an Internal error
// of that rank, never as OK. Name each call site distinctly, and one in a loop by its item too
// ("runner.capture_agreement.decode/8"), so that a rank that skips an agreement is caught at its
// next call (host_bootstrap.h). When the exchange itself fails, returns the bootstrap's error,
// which every rank gets in some form, not always the same: which rank gets which code, for a peer
// that died or never came, or that made a call of another name or kind, is in host_bootstrap.h's
// file comment.
absl::Status AgreeOnStatus(HostBootstrap& bootstrap, const absl::Status& local,
                           absl::string_view what, absl::string_view call);

}  // namespace kiln

#endif  // KILN_RUNTIME_RUNNER_RANK_AGREEMENT_H_
