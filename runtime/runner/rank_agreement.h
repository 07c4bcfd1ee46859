// Agreement among the ranks of a tensor-parallel runner on the outcome of a step that each rank
// ran locally (a capture, an allocation): every rank returns the same Status, so no rank goes on
// to a collective that a failed peer will never join (which would hang it, or end in a timeout
// that hides the cause).
//
//   absl::Status local = graphs.Capture(key, fn, stream);
//   RETURN_IF_ERROR(kiln::AgreeOnStatus(bootstrap, local, "Capture of decode/8"));
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

// Exchanges `local` with every rank and returns, on every rank alike: OK when every rank's
// status is OK; else the failing ranks' root cause with its code, as
// "<what> failed on rank r of n: <message>" (a rank's own error is preferred over a
// DeadlineExceeded or Unavailable, which is usually a consequence of it; among equals, the lowest
// rank). The exchange is the bootstrap call "rank_agreement.status": a peer at another call of
// the bootstrap (another name, or unnamed) fails it with Internal on every rank, naming both
// calls. A rank whose bytes under that name are not a status record counts as an Internal error
// of that rank, never as OK. When the exchange itself fails (a peer died or never came, or was
// at another call), returns that error (Unavailable, DeadlineExceeded or Internal from the
// bootstrap), which the peers see too.
absl::Status AgreeOnStatus(HostBootstrap& bootstrap, const absl::Status& local,
                           absl::string_view what);

}  // namespace kiln

#endif  // KILN_RUNTIME_RUNNER_RANK_AGREEMENT_H_
