#include "runtime/runner/rank_agreement.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// [int32 code][message bytes]
std::string Encode(const absl::Status& status) {
  const int32_t code = static_cast<int32_t>(status.code());
  std::string out(reinterpret_cast<const char*>(&code), sizeof(code));
  out.append(status.message().data(), status.message().size());
  return out;
}

absl::Status Decode(const std::string& bytes) {
  if (bytes.size() < sizeof(int32_t)) {
    return absl::InternalError("A rank sent a malformed status record");
  }
  int32_t code = 0;
  std::memcpy(&code, bytes.data(), sizeof(code));
  return absl::Status(static_cast<absl::StatusCode>(code), bytes.substr(sizeof(code)));
}

bool IsConsequence(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status);
}

}  // namespace

absl::Status AgreeOnStatus(HostBootstrap& bootstrap, const absl::Status& local,
                           absl::string_view what) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, bootstrap.AllGather(Encode(local)));
  int chosen = -1;
  absl::Status cause;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const absl::Status status = Decode(all[r]);
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
