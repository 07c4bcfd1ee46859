#include "collectives/internal/graph_input_record.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace internal {
namespace {

void AppendBuffer(const ExportedBuffer& buffer, std::string* out) {
  out->append(reinterpret_cast<const char*>(&buffer.handle), sizeof(buffer.handle));
  out->append(reinterpret_cast<const char*>(&buffer.offset), sizeof(buffer.offset));
  out->append(reinterpret_cast<const char*>(&buffer.allocation_bytes),
              sizeof(buffer.allocation_bytes));
}

const char* ReadBuffer(const char* data, ExportedBuffer* buffer) {
  std::memcpy(&buffer->handle, data, sizeof(buffer->handle));
  data += sizeof(buffer->handle);
  std::memcpy(&buffer->offset, data, sizeof(buffer->offset));
  data += sizeof(buffer->offset);
  std::memcpy(&buffer->allocation_bytes, data, sizeof(buffer->allocation_bytes));
  return data + sizeof(buffer->allocation_bytes);
}

absl::Status CheckBuffer(int rank, int slot, const char* what, const ExportedBuffer& buffer,
                         uint64_t bytes) {
  // The kernels load and store 16 bytes at a time; an allocation's base is at least 256-byte
  // aligned, so the offset is what decides the buffer's alignment.
  if (buffer.offset % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rank %d's %s of graph all-reduce slot %d is at offset %d of its allocation, not a "
        "multiple of 16 bytes; that rank's buffer or its registration record is corrupt",
        rank, what, slot, buffer.offset));
  }
  // By subtraction: offset + bytes may wrap.
  if (buffer.offset > buffer.allocation_bytes || bytes > buffer.allocation_bytes - buffer.offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Rank %d's %s of graph all-reduce slot %d is at offset %d of a %d-byte allocation, where "
        "the call's %d bytes do not fit; pass buffers that hold the call's count on every rank",
        rank, what, slot, buffer.offset, buffer.allocation_bytes, bytes));
  }
  return absl::OkStatus();
}

}  // namespace

void AppendGraphInputRecord(const GraphInputRecord& record, std::string* out) {
  out->append(reinterpret_cast<const char*>(&record.bytes), sizeof(record.bytes));
  AppendBuffer(record.input, out);
  AppendBuffer(record.output, out);
}

GraphInputRecord ReadGraphInputRecord(const char* data) {
  GraphInputRecord record;
  std::memcpy(&record.bytes, data, sizeof(record.bytes));
  data = ReadBuffer(data + sizeof(record.bytes), &record.input);
  ReadBuffer(data, &record.output);
  return record;
}

void AppendGraphInputsHeader(int32_t first, int32_t n, std::string* out) {
  out->append(reinterpret_cast<const char*>(&first), sizeof(first));
  out->append(reinterpret_cast<const char*>(&n), sizeof(n));
}

absl::Status CheckGraphInputsMessage(int this_rank, int32_t first, int32_t n, int rank,
                                     absl::string_view message) {
  int32_t their_first = -1, their_n = -1;
  if (message.size() >= kGraphInputsHeaderBytes) {
    std::memcpy(&their_first, message.data(), sizeof(their_first));
    std::memcpy(&their_n, message.data() + sizeof(their_first), sizeof(their_n));
  }
  if (their_first != first || their_n != n) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Rank %d has %d captured all-reduce inputs from slot %d, rank %d has %d from slot %d; "
        "every rank must capture the same calls before RegisterGraphBuffers()",
        this_rank, n, first, rank, their_n, their_first));
  }
  // Checked apart from the counts, which agree: a record of another size means another build.
  const uint64_t want =
      kGraphInputsHeaderBytes + static_cast<uint64_t>(n) * kGraphInputRecordBytes;
  if (message.size() != want) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Rank %d sent %d bytes for %d graph inputs where rank %d expects %d + %d x %d = %d; "
        "the ranks run different kiln builds: run the same build on every rank",
        rank, message.size(), n, this_rank, kGraphInputsHeaderBytes, n, kGraphInputRecordBytes,
        want));
  }
  return absl::OkStatus();
}

GraphInputRecord ReadGraphInputRecord(absl::string_view message, int32_t i) {
  return ReadGraphInputRecord(message.data() + kGraphInputsHeaderBytes +
                              static_cast<size_t>(i) * kGraphInputRecordBytes);
}

absl::Status CheckGraphInputRecord(int rank, int slot, const GraphInputRecord& record,
                                   uint64_t bytes, bool has_output) {
  if (record.bytes != bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Rank %d captured a %d-byte all-reduce in graph input slot %d where this rank captured "
        "%d bytes; every rank must capture the same calls with the same counts",
        rank, record.bytes, slot, bytes));
  }
  if (absl::Status input = CheckBuffer(rank, slot, "input", record.input, bytes); !input.ok()) {
    return input;
  }
  if (!has_output) return absl::OkStatus();
  return CheckBuffer(rank, slot, "output", record.output, bytes);
}

std::string CaptureAgreementMessage(const absl::Status& input_exported, bool output_exported,
                                    int32_t slot) {
  std::string out = input_exported.ok() ? "1" : absl::StrCat("0", input_exported.message());
  out.push_back(output_exported ? '1' : '0');
  out.append(reinterpret_cast<const char*>(&slot), sizeof(slot));
  return out;
}

absl::Status CheckCaptureAgreement(int this_rank, int32_t slot, const std::vector<std::string>& all,
                                   bool* every_output) {
  // After the outcome: one byte (output exported), then the slot.
  constexpr size_t kTail = 1 + sizeof(int32_t);
  bool every = true;
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string& s = all[r];
    int32_t their_slot = -1;
    if (s.size() >= 1 + kTail) {
      std::memcpy(&their_slot, s.data() + s.size() - sizeof(int32_t), sizeof(int32_t));
    }
    if (their_slot != slot) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Rank %d is capturing its graph all-reduce #%d while rank %d is at #%d; every rank "
          "must capture the same sequence of calls",
          this_rank, slot, r, their_slot));
    }
    if (s[0] != '1') {
      return absl::UnavailableError(absl::StrFormat(
          "Rank %d could not register a captured all-reduce input: %s", r,
          absl::string_view(s).substr(1, s.size() - 1 - kTail)));
    }
    every = every && s[s.size() - kTail] == '1';
  }
  *every_output = every;
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace kiln
