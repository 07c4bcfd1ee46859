#include "runtime/model/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/config/quoted.h"
#include "runtime/cuda/status_macros.h"

namespace kiln {
namespace {

// The safetensors format caps the header at 100 MB; a larger length field means a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr int kMaxJsonDepth = 32;

// ---- A small JSON parser: enough for safetensors headers (objects, arrays, strings,
// integers, and the other JSON values so that unknown metadata never breaks parsing).

struct JsonValue {
  enum Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = kNull;
  bool boolean = false;
  std::string text;  // a string's value, or a number's literal text
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in file order
};

// Names byte `c` of a header for a message: as itself when printable, else by its value, so that
// a NUL, a newline or a stray byte of binary data never lands raw in a message.
std::string ByteName(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return absl::StrCat("character '", std::string(1, c), "'");
  return absl::StrCat("byte 0x", absl::Hex(u, absl::kZeroPad2));
}

// Quotes a name from a header or the caller (a tensor name, a metadata key, a dtype) for a
// message: '...', escaped as Quoted escapes it. Paths are Quoted: "...".
std::string Quote(absl::string_view s) { return Quoted(s, '\''); }

const char* TypeName(JsonValue::Type type) {
  switch (type) {
    case JsonValue::kNull: return "null";
    case JsonValue::kBool: return "a boolean";
    case JsonValue::kNumber: return "a number";
    case JsonValue::kString: return "a string";
    case JsonValue::kArray: return "an array";
    case JsonValue::kObject: return "an object";
  }
  return "?";
}

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    RETURN_IF_ERROR(ParseValue(value, 0));
    SkipSpace();
    if (pos_ != text_.size()) return Error("trailing characters after the JSON value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat("Malformed safetensors header: ", what, " at header byte ", pos_));
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  absl::Status ParseValue(JsonValue& out, int depth) {
    if (depth > kMaxJsonDepth) return Error("nesting deeper than 32 levels");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end of header");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out.type = JsonValue::kString;
      return ParseString(out.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    if (Consume("true")) {
      out.type = JsonValue::kBool;
      out.boolean = true;
      return absl::OkStatus();
    }
    if (Consume("false")) {
      out.type = JsonValue::kBool;
      return absl::OkStatus();
    }
    if (Consume("null")) {
      out.type = JsonValue::kNull;
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected ", ByteName(c)));
  }

  absl::Status ParseObject(JsonValue& out, int depth) {
    out.type = JsonValue::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Consume("}")) return absl::OkStatus();
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a quoted key");
      std::string key;
      RETURN_IF_ERROR(ParseString(key));
      SkipSpace();
      if (!Consume(":")) return Error("expected ':' after a key");
      JsonValue value;
      RETURN_IF_ERROR(ParseValue(value, depth + 1));
      out.object.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (Consume(",")) continue;
      if (Consume("}")) return absl::OkStatus();
      return Error("expected ',' or '}' in an object");
    }
  }

  absl::Status ParseArray(JsonValue& out, int depth) {
    out.type = JsonValue::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Consume("]")) return absl::OkStatus();
    while (true) {
      JsonValue value;
      RETURN_IF_ERROR(ParseValue(value, depth + 1));
      out.array.push_back(std::move(value));
      SkipSpace();
      if (Consume(",")) continue;
      if (Consume("]")) return absl::OkStatus();
      return Error("expected ',' or ']' in an array");
    }
  }

  absl::Status ParseNumber(JsonValue& out) {
    const size_t begin = pos_;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > start;
    };
    if (!digits()) return Error("a number without digits");
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!digits()) return Error("a number without digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) return Error("a number without exponent digits");
    }
    out.type = JsonValue::kNumber;
    out.text = std::string(text_.substr(begin, pos_ - begin));
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status ParseHex4(uint32_t& cp) {
    if (pos_ + 4 > text_.size()) return Error("a truncated \\u escape");
    cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= h - '0';
      else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
      else return Error("a bad hex digit in a \\u escape");
    }
    return absl::OkStatus();
  }

  // Appends the UTF-8 sequence whose lead byte is at pos_ - 1, checked as RFC 3629 does (no
  // overlong forms, surrogates or code points past U+10FFFF). A header is UTF-8 JSON: the
  // reference reader refuses any other bytes, and a name that is not UTF-8 would garble the
  // messages that quote it.
  absl::Status ParseUtf8(std::string& out) {
    const size_t start = pos_ - 1;
    const unsigned char lead = static_cast<unsigned char>(text_[start]);
    int more = 0;      // continuation bytes after the lead byte
    uint32_t min = 0;  // the least code point that needs them (less is an overlong form)
    if (lead >= 0xC2 && lead <= 0xDF) {
      more = 1;
      min = 0x80;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      more = 2;
      min = 0x800;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      more = 3;
      min = 0x10000;
    }
    uint32_t cp = lead & (0x7Fu >> (more + 1));
    bool ok = more > 0;
    for (int i = 0; ok && i < more; ++i, ++pos_) {
      const unsigned char next = pos_ < text_.size() ? static_cast<unsigned char>(text_[pos_]) : 0;
      ok = (next & 0xC0) == 0x80;
      cp = (cp << 6) | (next & 0x3F);
    }
    if (!ok || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) {
      pos_ = start;
      return Error(absl::StrCat("a string that is not UTF-8 (", ByteName(text_[start]), ")"));
    }
    out.append(text_.data() + start, pos_ - start);
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string& out) {
    ++pos_;  // opening quote
    out.clear();
    while (true) {
      if (pos_ >= text_.size()) return Error("an unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        return Error(absl::StrCat("a control character (", ByteName(c), ") in a string"));
      }
      if (static_cast<unsigned char>(c) >= 0x80) {
        RETURN_IF_ERROR(ParseUtf8(out));
        continue;
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return Error("an unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          RETURN_IF_ERROR(ParseHex4(cp));
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            uint32_t low = 0;
            if (!Consume("\\u")) return Error("a lone high surrogate");
            RETURN_IF_ERROR(ParseHex4(low));
            if (low < 0xDC00 || low >= 0xE000) return Error("a bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            return Error("a lone low surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Error(absl::StrCat("an unknown escape: '\\' before ", ByteName(e)));
      }
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

void AppendJsonString(absl::string_view s, std::string& out) {
  out.push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

absl::Status IoError(absl::string_view what, const std::string& path, int err) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", Quoted(path)));
}

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// The error for an fread of `f` that came back short. At the end of the file fread sets no
// errno (and ErrnoToStatus(0) is OK, no error at all), so that case is named apart: the file
// shrank after its size was taken.
absl::Status ShortReadError(std::FILE* f, const std::string& path) {
  if (std::ferror(f) != 0) return IoError("Cannot read the header of", path, errno);
  return absl::DataLossError(absl::StrCat("Safetensors file ", Quoted(path),
                                          " shrank while its header was read; open it again "
                                          "once whatever writes it is done"));
}

absl::StatusOr<uint64_t> FileSize(std::FILE* f, const std::string& path) {
  if (std::fseek(f, 0, SEEK_END) != 0) return IoError("Cannot seek in", path, errno);
  const long size = std::ftell(f);
  if (size < 0) return IoError("Cannot tell the size of", path, errno);
  return static_cast<uint64_t>(size);
}

// Multiplies the shape's dimensions and the element size, failing on overflow or a negative
// dimension.
bool ByteCount(const std::vector<int64_t>& shape, size_t element_size, uint64_t& bytes) {
  uint64_t n = element_size;
  for (const int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return false;
    n *= static_cast<uint64_t>(d);
  }
  bytes = n;
  return true;
}

absl::StatusOr<uint64_t> ParseUnsigned(const JsonValue& v, absl::string_view what,
                                       absl::string_view tensor) {
  uint64_t n = 0;
  if (v.type != JsonValue::kNumber || !absl::SimpleAtoi(v.text, &n) ||
      v.text.find_first_of(".eE-") != std::string::npos) {
    return absl::DataLossError(
        absl::StrCat("Safetensors tensor ", Quote(tensor), " has ", what, " ",
                     v.type == JsonValue::kNumber ? v.text : TypeName(v.type),
                     "; expected a non-negative integer"));
  }
  return n;
}

absl::StatusOr<SafetensorsTensor> ParseTensorEntry(const std::string& name, const JsonValue& v) {
  if (v.type != JsonValue::kObject) {
    return absl::DataLossError(absl::StrCat("Safetensors entry ", Quote(name), " is ",
                                            TypeName(v.type), "; expected an object"));
  }
  SafetensorsTensor t;
  t.name = name;
  const JsonValue* dtype = nullptr;
  const JsonValue* shape = nullptr;
  const JsonValue* offsets = nullptr;
  for (const auto& [key, value] : v.object) {
    if (key == "dtype") dtype = &value;
    else if (key == "shape") shape = &value;
    else if (key == "data_offsets") offsets = &value;
  }
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return absl::DataLossError(absl::StrCat(
        "Safetensors tensor ", Quote(name), " lacks ",
        dtype == nullptr ? "\"dtype\"" : shape == nullptr ? "\"shape\"" : "\"data_offsets\""));
  }
  if (dtype->type != JsonValue::kString || SafetensorsDtypeSize(dtype->text) == 0) {
    return absl::DataLossError(absl::StrCat(
        "Safetensors tensor ", Quote(name), " has dtype ",
        dtype->type == JsonValue::kString ? Quote(dtype->text) : TypeName(dtype->type),
        ", which safetensors does not define"));
  }
  t.dtype = dtype->text;
  if (shape->type != JsonValue::kArray) {
    return absl::DataLossError(absl::StrCat("Safetensors tensor ", Quote(name),
                                            " has a shape that is ", TypeName(shape->type),
                                            "; expected an array"));
  }
  for (const JsonValue& d : shape->array) {
    ASSIGN_OR_RETURN(uint64_t dim, ParseUnsigned(d, "a shape dimension", name));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::DataLossError(
          absl::StrCat("Safetensors tensor ", Quote(name), " has dimension ", dim, ", too large"));
    }
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  if (offsets->type != JsonValue::kArray || offsets->array.size() != 2) {
    return absl::DataLossError(absl::StrCat("Safetensors tensor ", Quote(name),
                                            " has data_offsets that are not a [begin, end] pair"));
  }
  ASSIGN_OR_RETURN(t.data_begin, ParseUnsigned(offsets->array[0], "data_offsets[0]", name));
  ASSIGN_OR_RETURN(t.data_end, ParseUnsigned(offsets->array[1], "data_offsets[1]", name));
  if (t.data_end < t.data_begin) {
    return absl::DataLossError(absl::StrCat("Safetensors tensor ", Quote(name),
                                            " has data_offsets [", t.data_begin, ", ",
                                            t.data_end, "] that end before they begin"));
  }
  uint64_t expected = 0;
  if (!ByteCount(t.shape, SafetensorsDtypeSize(t.dtype), expected)) {
    return absl::DataLossError(absl::StrCat("Safetensors tensor ", Quote(name), " has shape ",
                                            t.ShapeString(), " whose bytes (dtype ", t.dtype,
                                            ") overflow 64 bits; the file is corrupt"));
  }
  if (expected != t.bytes()) {
    return absl::DataLossError(absl::StrCat(
        "Safetensors tensor ", Quote(name), " holds ", t.bytes(), " bytes but dtype ", t.dtype,
        " and shape ", t.ShapeString(), " need ", expected, "; the file is corrupt"));
  }
  return t;
}

}  // namespace

size_t SafetensorsDtypeSize(absl::string_view dtype) {
  static const std::pair<const char*, size_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"I64", 8},  {"U64", 8}, {"F64", 8}};
  for (const auto& [name, size] : kSizes) {
    if (dtype == name) return size;
  }
  return 0;
}

std::string SafetensorsTensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status WriteSafetensors(const std::string& path,
                              absl::Span<const SafetensorsEntry> entries,
                              const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      if (!first) header += ",";
      first = false;
      AppendJsonString(key, header);
      header += ":";
      AppendJsonString(value, header);
    }
    header += "}";
    first = false;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.name.empty() || e.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("Safetensors tensor name ", Quote(e.name),
                                                     " is reserved or empty; give the tensor a "
                                                     "name"));
    }
    if (!names.insert(e.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("Safetensors tensor ", Quote(e.name),
                                                     " appears twice; names must be unique"));
    }
    const size_t element = SafetensorsDtypeSize(e.dtype);
    uint64_t expected = 0;
    if (element == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Safetensors tensor ", Quote(e.name), " has dtype ", Quote(e.dtype),
          "; use one of BF16, F16, F32, F64, I8..I64, U8..U64, BOOL, F8_E4M3, F8_E5M2"));
    }
    if (!ByteCount(e.shape, element, expected) || expected != e.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Safetensors tensor ", Quote(e.name), " has ", e.bytes, " bytes of data but dtype ",
          e.dtype, " and shape [", absl::StrJoin(e.shape, ", "), "] need ", expected));
    }
    if (e.bytes > 0 && e.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Safetensors tensor ", Quote(e.name), " has no data pointer"));
    }
    if (!first) header += ",";
    first = false;
    AppendJsonString(e.name, header);
    absl::StrAppend(&header, ":{\"dtype\":\"", e.dtype, "\",\"shape\":[",
                    absl::StrJoin(e.shape, ","), "],\"data_offsets\":[", offset, ",",
                    offset + e.bytes, "]}");
    offset += e.bytes;
  }
  header += "}";
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  header.append((8 - header.size() % 8) % 8, ' ');

  File f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) return IoError("Cannot open for writing", path, errno);
  unsigned char length[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(length, 1, 8, f.get()) != 8 ||
      std::fwrite(header.data(), 1, header.size(), f.get()) != header.size()) {
    return IoError("Cannot write the header of", path, errno);
  }
  for (const SafetensorsEntry& e : entries) {
    if (e.bytes > 0 && std::fwrite(e.data, 1, e.bytes, f.get()) != e.bytes) {
      return IoError(absl::StrCat("Cannot write tensor ", Quote(e.name), " to"), path, errno);
    }
  }
  if (std::fclose(f.release()) != 0) return IoError("Cannot close", path, errno);
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  // Only a regular file (or a link to one, as in the Hugging Face cache) can be read: opening a
  // FIFO would wait for a writer for ever, and a directory or a device is no safetensors file.
  // A path stat cannot see is left to fopen, whose error names it (NotFound, ...).
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    const char* kind = S_ISDIR(info.st_mode)    ? "a directory"
                       : S_ISFIFO(info.st_mode) ? "a FIFO"
                       : S_ISSOCK(info.st_mode) ? "a socket"
                                                : "a device";
    return absl::InvalidArgumentError(absl::StrCat(
        "Safetensors path ", Quoted(path), " is ", kind, ", not a file; pass a .safetensors file"));
  }
  File f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) return IoError("Cannot open safetensors file", path, errno);
  ASSIGN_OR_RETURN(uint64_t file_size, FileSize(f.get(), path));
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat("Safetensors file ", Quoted(path), " has ", file_size,
                                            " bytes, fewer than the 8-byte header length; it is "
                                            "truncated or not a safetensors file"));
  }
  std::fseek(f.get(), 0, SEEK_SET);
  unsigned char length[8];
  if (std::fread(length, 1, 8, f.get()) != 8) return ShortReadError(f.get(), path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length[i];
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    return absl::DataLossError(absl::StrCat(
        "Safetensors file ", Quoted(path), " declares a header of ", header_size, " bytes but has ",
        file_size - 8, " after the length field; it is truncated or not a safetensors file"));
  }
  std::string text(header_size, '\0');
  if (std::fread(text.data(), 1, header_size, f.get()) != header_size) {
    return ShortReadError(f.get(), path);
  }
  absl::StatusOr<JsonValue> root = JsonParser(text).ParseDocument();
  if (!root.ok()) {
    return absl::DataLossError(absl::StrCat(root.status().message(), " in ", Quoted(path)));
  }
  if (root->type != JsonValue::kObject) {
    return absl::DataLossError(absl::StrCat("Safetensors header of ", Quoted(path), " is ",
                                            TypeName(root->type), "; expected an object"));
  }
  SafetensorsReader reader;
  reader.path_ = path;
  reader.data_start_ = 8 + header_size;
  const uint64_t data_size = file_size - reader.data_start_;
  std::set<std::string> seen;
  for (const auto& [name, value] : root->object) {
    if (!seen.insert(name).second) {
      return absl::DataLossError(
          absl::StrCat("Safetensors header of ", Quoted(path), " lists ", Quote(name), " twice"));
    }
    if (name == "__metadata__") {
      if (value.type != JsonValue::kObject) {
        return absl::DataLossError(absl::StrCat("Safetensors __metadata__ of ", Quoted(path),
                                                " is ", TypeName(value.type),
                                                "; expected an object"));
      }
      for (const auto& [key, v] : value.object) {
        if (v.type != JsonValue::kString) {
          return absl::DataLossError(absl::StrCat("Safetensors __metadata__ key ", Quote(key),
                                                  " of ", Quoted(path), " is ", TypeName(v.type),
                                                  "; metadata values are strings"));
        }
        reader.metadata_[key] = v.text;
      }
      continue;
    }
    absl::StatusOr<SafetensorsTensor> t = ParseTensorEntry(name, value);
    if (!t.ok()) {
      return absl::DataLossError(absl::StrCat(t.status().message(), " in ", Quoted(path)));
    }
    if (t->data_end > data_size) {
      return absl::DataLossError(absl::StrCat(
          "Safetensors tensor ", Quote(name), " ends at data byte ", t->data_end, " but ",
          Quoted(path), " has only ", data_size,
          " bytes of data; the file is truncated (download it again)"));
    }
    reader.tensors_.push_back(*std::move(t));
  }
  // Ranges must not overlap: check in offset order. Every overlap is named before any hole.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : reader.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
              return a->data_begin != b->data_begin ? a->data_begin < b->data_begin
                                                    : a->data_end < b->data_end;
            });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->data_begin < by_offset[i - 1]->data_end) {
      return absl::DataLossError(absl::StrCat(
          "Safetensors tensors ", Quote(by_offset[i - 1]->name), " and ",
          Quote(by_offset[i]->name), " overlap in ", Quoted(path), "; the file is corrupt"));
    }
  }
  // The format wants the data section "entirely indexed", with no holes; bytes that no tensor
  // holds mean a corrupt file. A length field a few bytes short, pointing into the header's
  // padding, would otherwise open with every tensor read that many bytes early.
  uint64_t covered = 0;  // the tensors so far hold data bytes [0, covered)
  for (const SafetensorsTensor* t : by_offset) {
    if (t->data_begin > covered) {
      return absl::DataLossError(absl::StrCat(
          "Safetensors file ", Quoted(path), " has data bytes [", covered, ", ", t->data_begin,
          ") that no tensor holds (before tensor ", Quote(t->name),
          "), which the format does not allow; the file is corrupt (download it again)"));
    }
    covered = std::max(covered, t->data_end);
  }
  if (covered != data_size) {
    return absl::DataLossError(absl::StrCat(
        "Safetensors file ", Quoted(path), " ends in data bytes [", covered, ", ", data_size,
        ") that no tensor holds, which the format does not allow; its header length ",
        header_size, " or its size is wrong (download it again)"));
  }
  std::sort(reader.tensors_.begin(), reader.tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.name < b.name; });
  return reader;
}

const SafetensorsTensor* SafetensorsReader::Find(absl::string_view name) const {
  auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const SafetensorsTensor& t, absl::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::Status SafetensorsReader::Read(const SafetensorsTensor& tensor, void* dst,
                                     size_t dst_bytes) const {
  if (dst_bytes < tensor.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("Destination of ", dst_bytes,
                                                   " bytes is too small for tensor ",
                                                   Quote(tensor.name), " of ", tensor.bytes(),
                                                   " bytes"));
  }
  return ReadStrided(tensor, 0, tensor.bytes(), tensor.bytes(), 1, dst);
}

absl::Status SafetensorsReader::ReadStrided(const SafetensorsTensor& tensor, uint64_t offset,
                                            uint64_t run_bytes, uint64_t stride, int64_t runs,
                                            void* dst) const {
  if (runs < 0 || (runs > 1 && stride < run_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Strided read of tensor ", Quote(tensor.name), ": ", runs, " runs of ", run_bytes,
        " bytes every ", stride, " bytes; runs must be >= 0 and the stride at least a run"));
  }
  if (runs == 0 || run_bytes == 0) return absl::OkStatus();
  // The last run's end, checked without overflow against the tensor's bytes.
  const uint64_t size = tensor.bytes();
  const uint64_t last = static_cast<uint64_t>(runs - 1);
  if (offset > size || run_bytes > size - offset ||
      (last > 0 && (stride > (size - offset - run_bytes) / last))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Strided read of tensor ", Quote(tensor.name), " (", size, " bytes): ", runs, " runs of ",
        run_bytes, " bytes every ", stride, " bytes from byte ", offset,
        " leave the tensor; read within its shape ", tensor.ShapeString()));
  }
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("Cannot open safetensors file", path_, errno);
  // Runs that touch are one read.
  const bool contiguous = stride == run_bytes;
  const uint64_t span = contiguous ? run_bytes * static_cast<uint64_t>(runs) : run_bytes;
  const int64_t reads = contiguous ? 1 : runs;
  char* out = static_cast<char*>(dst);
  absl::Status status;
  for (int64_t r = 0; r < reads && status.ok(); ++r) {
    uint64_t at = data_start_ + tensor.data_begin + offset + static_cast<uint64_t>(r) * stride;
    uint64_t left = span;
    while (left > 0) {
      // Linux moves at most about 2 GiB per call; a short count only means "call again".
      const size_t want = static_cast<size_t>(std::min<uint64_t>(left, uint64_t{1} << 30));
      const ssize_t got = ::pread(fd, out, want, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        status =
            IoError(absl::StrCat("Cannot read tensor ", Quote(tensor.name), " from"), path_, errno);
        break;
      }
      if (got == 0) {
        status = absl::DataLossError(absl::StrCat(
            "Read stopped at byte ", at - data_start_ - tensor.data_begin, " of tensor ",
            Quote(tensor.name), " (", size, " bytes) in ", Quoted(path_),
            "; the file shrank since it was opened"));
        break;
      }
      out += got;
      at += static_cast<uint64_t>(got);
      left -= static_cast<uint64_t>(got);
    }
  }
  ::close(fd);
  return status;
}

}  // namespace kiln
