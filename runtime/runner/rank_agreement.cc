#include "runtime/runner/rank_agreement.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// [4-byte tag][int32 code][message bytes]. The bootstrap's call name keeps a peer at another call
// from pairing with this exchange; the tag still tells a status record from other bytes brought
// under that name, which must not be read as a status, least of all as OK.
constexpr char kTag[4] = {'k', 'S', 't', '1'};
constexpr size_t kHeaderBytes = sizeof(kTag) + sizeof(int32_t);

std::string Encode(const absl::Status& status) {
  const int32_t code = static_cast<int32_t>(status.code());
  std::string out(kTag, sizeof(kTag));
  out.append(reinterpret_cast<const char*>(&code), sizeof(code));
  out.append(status.message().data(), status.message().size());
  return out;
}

absl::Status Decode(int rank, const std::string& bytes) {
  int32_t code = -1;
  if (bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kTag, sizeof(kTag)) == 0) {
    std::memcpy(&code, bytes.data() + sizeof(kTag), sizeof(code));
  }
  // Encode writes absl's canonical codes only, and OK without a message.
  const bool known = code >= 0 && code <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
  if (!known || (code == 0 && bytes.size() != kHeaderBytes)) {
    return absl::InternalError(
        absl::StrCat("Rank ", rank, " sent ", bytes.size(),
                     " bytes that are not a status record; every rank "
                     "must call AgreeOnStatus at the same point of the protocol"));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), bytes.substr(kHeaderBytes));
}

bool IsConsequence(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status);
}

}  // namespace

absl::Status AgreeOnStatus(HostBootstrap& bootstrap, const absl::Status& local,
                           absl::string_view what, absl::string_view call) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, bootstrap.AllGather(Encode(local), call));
  int chosen = -1;
  absl::Status cause;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const absl::Status status = Decode(r, all[r]);
    if (status.ok()) continue;
    if (chosen < 0 || (IsConsequence(cause) && !IsConsequence(status))) {
      chosen = r;
      cause = status;
    }
  }
  if (chosen < 0) return absl::OkStatus();
  return absl::Status(cause.code(), absl::StrCat(what, " failed on rank ", chosen, " of ",
                                                 all.size(), ": ", cause.message()));
}

}  // namespace kiln
