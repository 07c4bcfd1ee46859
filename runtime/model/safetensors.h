// Reads and writes safetensors files: an 8-byte little-endian header length, a JSON header
// mapping each tensor name to {dtype, shape, data_offsets}, then the raw little-endian data.
//
//   std::vector<kiln::SafetensorsEntry> entries = {
//       {"model.norm.weight", "BF16", {2048}, norm_bits.data(), norm_bits.size() * 2}};
//   RETURN_IF_ERROR(kiln::WriteSafetensors("/tmp/m.safetensors", entries));
//
//   ASSIGN_OR_RETURN(kiln::SafetensorsReader reader,
//                    kiln::SafetensorsReader::Open("/tmp/m.safetensors"));
//   const kiln::SafetensorsTensor* t = reader.Find("model.norm.weight");
//   RETURN_IF_ERROR(reader.Read(*t, dst, t->bytes()));
//
// The header is parsed by a small self-contained JSON parser and checked when the file is
// opened: it must be UTF-8 JSON, every tensor's byte range must lie inside the file, not overlap
// another, and match its dtype and shape, and the ranges together must cover the data section
// with no gap and nothing after them, as the format requires. A file that fails these checks
// (truncated, malformed header, sizes that disagree, a wrong header length) is DataLoss naming
// the tensor or byte offset; a missing file is NotFound. Messages quote what a file or the
// caller gave with quoted.h's escapes, on one line: a tensor name as 'name', a path as "path".
// Host-only; a reader is immutable after Open and safe to share between threads (each read
// opens the file itself).
#ifndef KILN_RUNTIME_MODEL_SAFETENSORS_H_
#define KILN_RUNTIME_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kiln {

// Returns the size in bytes of one element of safetensors dtype `dtype` ("BF16" → 2), or 0
// for a name safetensors does not define.
size_t SafetensorsDtypeSize(absl::string_view dtype);

// One tensor's entry in a file's header.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "BF16", "F32", ...
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;      // byte offsets relative to the start of the data section
  uint64_t data_end = 0;

  uint64_t bytes() const { return data_end - data_begin; }
  // Returns the shape as "[2048, 64]".
  std::string ShapeString() const;
};

// A tensor to write: `bytes` of raw data at `data` (not owned; must stay valid during the call).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Writes `entries` (in order) and `metadata` (the header's "__metadata__" string map) to
// `path`, replacing it. InvalidArgument for a duplicate or empty name, an unknown dtype or a
// byte count that disagrees with dtype and shape; an I/O failure names the path and errno.
absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsEntry> entries,
                              const std::map<std::string, std::string>& metadata = {});

// An opened safetensors file: its parsed, validated header. Data is read on demand.
class SafetensorsReader {
 public:
  // Opens `path` and parses and validates its header (see the file comment).
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // Returns every tensor, sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // Returns the tensor named `name`, or nullptr.
  const SafetensorsTensor* Find(absl::string_view name) const;
  // Returns the header's "__metadata__" map (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies `tensor`'s data (a tensor of this reader) into `dst`, which has room for
  // `dst_bytes` >= tensor.bytes(). DataLoss if the file became shorter since Open.
  absl::Status Read(const SafetensorsTensor& tensor, void* dst, size_t dst_bytes) const;

  // Copies `runs` runs of `run_bytes` each from `tensor`'s data into `dst`, packed: the first run
  // starts `offset` bytes into the tensor's data and each next one `stride` bytes after the one
  // before. For a row-major matrix that is a block of columns (offset = the block's first byte,
  // run_bytes = its bytes per row, stride = a row's bytes); runs that touch are read at once.
  // InvalidArgument when a run would leave the tensor (the numbers named); DataLoss if the file
  // became shorter since Open.
  absl::Status ReadStrided(const SafetensorsTensor& tensor, uint64_t offset, uint64_t run_bytes,
                           uint64_t stride, int64_t runs, void* dst) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;  // file offset of the data section
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_MODEL_SAFETENSORS_H_
