// Internal to //collectives:custom_allreduce: the record each rank sends about one captured
// all-reduce when the ranks register their graph inputs (CustomAllReduce::RegisterGraphBuffers),
// and the checks a rank makes of every rank's record before it maps any peer memory. A peer's
// offsets and sizes decide which addresses the kernels read and write, so they are checked
// against the call this rank captured (its size) and against the allocation the peer exported.
// Also the agreement the ranks reach about each captured call before recording it
// (CaptureAgreementMessage, CheckCaptureAgreement; a failed exchange of it is
// exchange_failed.h's CaptureAgreementLost). Host-only: no CUDA calls.
//
//   std::string wire;
//   internal::AppendGraphInputsHeader(first_slot, n, &wire);
//   internal::AppendGraphInputRecord(mine, &wire);               // one per pending input
//   ... all-gather ...
//   RETURN_IF_ERROR(internal::CheckGraphInputsMessage(my_rank, first_slot, n, rank, message));
//   internal::GraphInputRecord theirs = internal::ReadGraphInputRecord(message, i);
//   RETURN_IF_ERROR(internal::CheckGraphInputRecord(rank, slot, theirs, bytes, has_output));
#ifndef KILN_COLLECTIVES_INTERNAL_GRAPH_INPUT_RECORD_H_
#define KILN_COLLECTIVES_INTERNAL_GRAPH_INPUT_RECORD_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln {
namespace internal {

// A buffer a rank exports for its peers to map: the IPC handle of the allocation that holds it,
// the buffer's offset in that allocation, and the allocation's size (cuMemGetAddressRange).
struct ExportedBuffer {
  cudaIpcMemHandle_t handle{};
  uint64_t offset = 0;
  uint64_t allocation_bytes = 0;
};

// What a rank sends about one captured call: its size in bytes, its input, and its output (all
// zeros unless every rank exported its output, for a two-shot call that gathers into outputs).
struct GraphInputRecord {
  uint64_t bytes = 0;
  ExportedBuffer input;
  ExportedBuffer output;
};

// The size of one record on the wire (168 bytes).
constexpr size_t kGraphInputRecordBytes =
    sizeof(uint64_t) + 2 * (sizeof(cudaIpcMemHandle_t) + 2 * sizeof(uint64_t));

// Appends `record` to `out` (kGraphInputRecordBytes bytes).
void AppendGraphInputRecord(const GraphInputRecord& record, std::string* out);

// Returns the record in the kGraphInputRecordBytes bytes at `data`.
GraphInputRecord ReadGraphInputRecord(const char* data);

// A rank's registration message: this header (the first slot and the number of records, int32
// each), then that many records.
constexpr size_t kGraphInputsHeaderBytes = 2 * sizeof(int32_t);

// Appends the header of a message of `n` records from slot `first` to `out`.
void AppendGraphInputsHeader(int32_t first, int32_t n, std::string* out);

// Returns OK when rank `rank`'s registration `message` holds `n` records from slot `first`, as
// the message of this rank (`this_rank`) does. Otherwise FailedPrecondition naming both ranks:
// when its header is missing or says another first slot or count (the ranks captured different
// calls), or when its length is not kGraphInputsHeaderBytes + n x kGraphInputRecordBytes (the
// ranks run different kiln builds, whose records differ). Depends only on its arguments.
// Thread-safe.
absl::Status CheckGraphInputsMessage(int this_rank, int32_t first, int32_t n, int rank,
                                     absl::string_view message);

// Returns record `i` of a `message` that CheckGraphInputsMessage accepted (0 <= i < its count).
GraphInputRecord ReadGraphInputRecord(absl::string_view message, int32_t i);

// Returns OK when rank `rank`'s `record` for graph input slot `slot` fits the call this rank
// captured in that slot: `bytes` bytes, gathering into the peers' outputs when `has_output` (the
// output is checked only then). Otherwise, naming the rank, the slot and the value:
// FailedPrecondition when the record's size is not `bytes` (the ranks captured different calls);
// InvalidArgument when a buffer's offset is not a multiple of 16, or `bytes` from its offset do
// not fit its allocation (the kernels would touch memory beyond it). Depends only on its
// arguments, so every rank that checks the same records reaches the same verdict. Thread-safe.
absl::Status CheckGraphInputRecord(int rank, int slot, const GraphInputRecord& record,
                                   uint64_t bytes, bool has_output);

// What the ranks agree on before any of them records a captured call's kernel, which waits for
// the others (CustomAllReduce's RecordGraphInput). Each rank all-gathers (as bootstrap call
// kCaptureAgreementCall, exchange_failed.h) the message CaptureAgreementMessage returns: "1", or "0" and why its
// input could not be exported; then one byte ('1': its output was exported too); then the call's
// graph input slot.
std::string CaptureAgreementMessage(const absl::Status& input_exported, bool output_exported,
                                    int32_t slot);

// Returns OK when every rank's message (`all`, in rank order) is for the call this rank
// (`this_rank`) captures in `slot` and every rank exported its input, and sets `*every_output`
// to whether every rank exported its output too. Otherwise: FailedPrecondition naming both ranks
// when a rank is at another slot (the ranks captured different calls); Unavailable naming the
// first rank that could not export its input (every rank gets it, so all of them take another
// path for this call). Depends only on its arguments. Thread-safe.
absl::Status CheckCaptureAgreement(int this_rank, int32_t slot, const std::vector<std::string>& all,
                                   bool* every_output);

}  // namespace internal
}  // namespace kiln

#endif  // KILN_COLLECTIVES_INTERNAL_GRAPH_INPUT_RECORD_H_
