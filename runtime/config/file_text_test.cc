// ReadFileText over every kind of path a user can give (files of random bytes and sizes,
// missing paths, directories, FIFOs, devices, links, files over the limit), and the helpers for
// parser messages (OneLineJsonError, JsonNestingDepth) over seeded random input.
#include "runtime/config/file_text.h"
#include "runtime/config/quoted.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/testing/file_helpers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::kiln::testing::ScratchDir;
using ::kiln::testing::WriteText;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// Whether every byte of `text` is printable ASCII: no newline, NUL or terminal escape.
bool IsPrintableAscii(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

TEST(ReadFileTextTest, ReadsEveryByteOfFilesOfRandomSizes) {
  const fs::path dir = ScratchDir("random_files");
  std::mt19937 rng(20240611);
  // Sizes around the 64 KiB read block, and random ones.
  std::vector<size_t> sizes = {0, 1, 2, 65535, 65536, 65537, 131072, 200001};
  for (int i = 0; i < 24; ++i) sizes.push_back(rng() % 300000);
  for (size_t size : sizes) {
    std::string bytes(size, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const fs::path path = dir / absl::StrCat("f", size);
    WriteText(path, bytes);
    absl::StatusOr<std::string> read = ReadFileText(path.string(), "config file");
    ASSERT_TRUE(read.ok()) << size << ": " << read.status();
    EXPECT_EQ(*read, bytes) << size;
  }
}

TEST(ReadFileTextTest, LimitHoldsAtEveryBoundary) {
  const fs::path dir = ScratchDir("limit");
  const fs::path path = dir / "f";
  WriteText(path, std::string(1000, 'x'));
  for (size_t limit : {size_t{0}, size_t{1}, size_t{999}, size_t{1000}, size_t{1001}}) {
    absl::StatusOr<std::string> read = ReadFileText(path.string(), "config file", limit);
    if (limit >= 1000) {
      ASSERT_TRUE(read.ok()) << limit << ": " << read.status();
      EXPECT_EQ(read->size(), 1000u);
    } else {
      EXPECT_TRUE(absl::IsInvalidArgument(read.status())) << limit << ": " << read.status();
      EXPECT_THAT(Message(read.status()), HasSubstr("holds 1000 bytes, more than the"));
    }
  }
  // A sparse file of 1 GiB is refused from its size, without reading (or allocating) it.
  const fs::path sparse = dir / "sparse";
  WriteText(sparse, "");
  fs::resize_file(sparse, uintmax_t{1} << 30);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> read = ReadFileText(sparse.string(), "config file");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_TRUE(absl::IsInvalidArgument(read.status())) << read.status();
  EXPECT_THAT(Message(read.status()),
              HasSubstr(absl::StrCat("Cannot read config file \"", sparse.string(),
                                     "\": it holds 1073741824 bytes, more than the 67108864")));
  // Files in /proc report a size of 0 and hold more: read to the end, within the limit.
  absl::StatusOr<std::string> status = ReadFileText("/proc/self/status");
  if (status.ok()) {
    EXPECT_THAT(*status, HasSubstr("Name:"));
  }
}

TEST(ReadFileTextTest, RefusesWhatIsNotARegularFileWithoutBlocking) {
  const fs::path dir = ScratchDir("not_files");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const fs::path dangling = dir / "dangling";
  fs::create_symlink(dir / "nothing", dangling);
  const fs::path file = dir / "file.json";
  WriteText(file, "{}");
  const fs::path link = dir / "link.json";
  fs::create_symlink(file, link);

  struct Case {
    std::string path;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {(dir / "missing").string(), absl::StatusCode::kNotFound,
       absl::StrCat("Cannot open config file \"", (dir / "missing").string(),
                    "\": No such file or directory; check the path")},
      {"", absl::StatusCode::kNotFound, "Cannot open config file \"\": No such file"},
      {dir.string(), absl::StatusCode::kNotFound,
       absl::StrCat("Cannot read config file \"", dir.string(), "\": Is a directory")},
      {fifo.string(), absl::StatusCode::kNotFound, "Is a FIFO (named pipe)"},
      {"/dev/zero", absl::StatusCode::kNotFound,
       "Cannot read config file \"/dev/zero\": Is a device, not a regular file"},
      {"/dev/null", absl::StatusCode::kNotFound, "Is a device"},
      {dangling.string(), absl::StatusCode::kNotFound, "No such file or directory"},
      {(file / "below").string(), absl::StatusCode::kNotFound, "Not a directory"},
      {std::string(5000, 'a'), absl::StatusCode::kNotFound, "File name too long"},
      {file.string() + std::string(1, '\0') + "more", absl::StatusCode::kNotFound,
       "the path holds a NUL byte"},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> read = ReadFileText(c.path, "config file");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1))
        << absl::CHexEscape(c.path);
    EXPECT_EQ(read.status().code(), c.code) << absl::CHexEscape(c.path) << ": " << read.status();
    EXPECT_THAT(Message(read.status()), HasSubstr(c.message)) << absl::CHexEscape(c.path);
    EXPECT_TRUE(IsPrintableAscii(Message(read.status()))) << read.status();
  }
  absl::StatusOr<std::string> linked = ReadFileText(link.string());
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_EQ(*linked, "{}");
}

TEST(ReadFileTextTest, UnreadableFileIsNotFound) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const fs::path dir = ScratchDir("unreadable");
  const fs::path path = dir / "secret.json";
  WriteText(path, "{}");
  fs::permissions(path, fs::perms::none);
  absl::StatusOr<std::string> read = ReadFileText(path.string(), "config file");
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
  EXPECT_THAT(Message(read.status()), HasSubstr("Permission denied"));
}

// Paths with every kind of byte: the message quotes them escaped, on one line.
TEST(ReadFileTextTest, MessagesEscapeThePath) {
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    std::string name(1 + rng() % 40, '\0');
    for (char& c : name) c = static_cast<char>(1 + rng() % 255);  // no NUL: a C path ends there
    std::string want;  // the name as the message writes it
    if (i % 2 == 0) {
      // UTF-8: its printable characters kept as they are, a C1 control (CSI), a line separator
      // or a right-to-left override escaped by code point.
      const char* const raw[] = {"\xc2\x9b" "2J", "\xe2\x80\xa8", "\xe2\x80\xae" "nosj.x"};
      const char* const escaped[] = {"\\u009b2J", "\\u2028", "\\u202enosj.x"};
      name = absl::StrCat("mod\xc3\xa8le ", i, raw[i / 2 % 3]);
      want = absl::StrCat("mod\xc3\xa8le ", i, escaped[i / 2 % 3]);
    } else {
      std::replace(name.begin(), name.end(), '/', '_');
      // Escaped byte by byte unless it happens to be UTF-8.
      want = IsUtf8(name) ? Escaped(name) : absl::CHexEscape(name);
    }
    const std::string path = absl::StrCat(ScratchDir("escape").string(), "/", name);
    absl::StatusOr<std::string> read = ReadFileText(path, "config file");
    ASSERT_TRUE(absl::IsNotFound(read.status())) << read.status();
    const std::string message = Message(read.status());
    EXPECT_TRUE(IsOneCleanLine(message)) << absl::CHexEscape(message);
    EXPECT_THAT(message, HasSubstr(absl::StrCat("/", want, "\": "))) << absl::CHexEscape(message);
  }
}

TEST(OneLineJsonErrorTest, AnyMessageComesOutOnOnePrintableLine) {
  // protobuf's form: the complaint, the text near the error, a caret under the spot.
  // Its quotes stay quotes, as in the text parser's messages.
  EXPECT_EQ(OneLineJsonError("Expected a value.\n  \"a\": ,\n       ^"),
            R"(Expected a value, at ^ in "  "a": ^,")");
  EXPECT_EQ(OneLineJsonError("Unexpected end of string.\n\n^"), "Unexpected end of string");
  EXPECT_EQ(OneLineJsonError("no text here"), "no text here");
  EXPECT_EQ(OneLineJsonError("(max_num_seqs): invalid value \"x\" for type TYPE_INT32"),
            "(max_num_seqs): invalid value \"x\" for type TYPE_INT32");
  EXPECT_EQ(OneLineJsonError("two\nlines \"q\" \\"), R"(two\nlines "q" \)");
  std::mt19937 rng(99);
  const char kAlphabet[] = "\n\n^^  \"\\{}x\x01\x1b\x7f\xff\xc3\xa9\0";
  const std::string alphabet(kAlphabet, sizeof(kAlphabet) - 1);  // the NUL before the end too
  for (int i = 0; i < 20000; ++i) {
    std::string message(rng() % 60, ' ');
    for (char& c : message) {
      c = rng() % 3 == 0 ? static_cast<char>(rng()) : alphabet[rng() % alphabet.size()];
    }
    const std::string line = OneLineJsonError(message);
    ASSERT_TRUE(IsOneCleanLine(line))
        << absl::CHexEscape(message) << " -> " << absl::CHexEscape(line);
  }
}

// The caret lands between the escapes of the bytes either side of the spot, whatever is escaped
// before it: a character beyond ASCII, a control, a bidirectional control, bytes that are not
// UTF-8, the middle of a character.
TEST(OneLineJsonErrorTest, CaretStaysAtTheSpotOfEscapedText) {
  const struct {
    std::string message;
    std::string line;
  } cases[] = {
      {"Bad.\ncaf\xc3\xa9,x\n     ^", "Bad, at ^ in \"caf\xc3\xa9^,x\""},
      {"Bad.\n\x1b[2J: 1\n    ^", "Bad, at ^ in \"\\x1b[2J^: 1\""},
      {"Bad.\n\"\xe2\x80\xae\": 1\n ^", "Bad, at ^ in \"\"^\\u202e\": 1\""},
      {"Bad.\n\"\xe2\x80\xae\": 1\n    ^", "Bad, at ^ in \"\"\\u202e^\": 1\""},
      // Not UTF-8: every byte above 0x7e escaped, on both sides of the caret alike.
      {"Bad.\n\xff a\xc3\xa9\n   ^", "Bad, at ^ in \"\\xff a^\\xc3\\xa9\""},
      // The spot inside a character: its bytes escaped, the caret between them.
      {"Bad.\ncaf\xc3\xa9,x\n    ^", "Bad, at ^ in \"caf\\xc3^\\xa9,x\""},
      // A hex digit after \x01 is escaped where it would extend it, not after the caret.
      {"Bad.\n\x01" "a\n ^", "Bad, at ^ in \"\\x01^a\""},
      {"Bad.\n\x01" "a\n  ^", "Bad, at ^ in \"\\x01\\x61^\""},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(OneLineJsonError(c.message), c.line) << absl::CHexEscape(c.message);
    EXPECT_TRUE(IsOneCleanLine(OneLineJsonError(c.message))) << absl::CHexEscape(c.message);
  }
}

// UTF-8 text keeps its characters and escapes control bytes and quotes; text that is not UTF-8
// has every byte above 0x7f escaped too, so a message never carries a raw stray byte.
TEST(QuotedTest, EscapesControlBytesAndEveryByteOfTextThatIsNotUtf8) {
  EXPECT_EQ(Quoted("caf\xc3\xa9\n\"x\""), "\"caf\xc3\xa9\\n\\\"x\\\"\"");
  EXPECT_EQ(Quoted("caf\xc3\xa9\xff"), "\"caf\\xc3\\xa9\\xff\"");
  EXPECT_EQ(Quoted("it's", '\''), "'it\\'s'");
  EXPECT_EQ(Escaped("a\tb"), "a\\tb");
  for (const char* text : {"a\tb", "caf\xc3\xa9\xff", "line\n", "\x1b[31m", "del\x7f"}) {
    EXPECT_FALSE(IsOneCleanLine(text)) << absl::CHexEscape(text);
    EXPECT_TRUE(IsOneCleanLine(Quoted(text))) << absl::CHexEscape(text);
  }
}

TEST(IsUtf8Test, TakesWellFormedUtf8Only) {
  for (const char* good :
       {"", "ascii", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "\x7f"}) {
    EXPECT_TRUE(IsUtf8(good)) << absl::CHexEscape(good);
  }
  for (const char* bad : {"\xff", "\x80", "\xc3", "\xc0\x80", "\xe0\x80\x80", "\xed\xa0\x80",
                          "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "a\xe2\x82", "\xc3\x28"}) {
    EXPECT_FALSE(IsUtf8(bad)) << absl::CHexEscape(bad);
  }
  // Every code point, encoded by hand, reads; every truncation of a multi-byte one does not.
  for (uint32_t code = 0; code <= 0x10ffff; code += (code < 0x800 ? 1 : 97)) {
    if (code >= 0xd800 && code <= 0xdfff) continue;
    std::string s;
    if (code < 0x80) {
      s = std::string(1, static_cast<char>(code));
    } else if (code < 0x800) {
      s = {static_cast<char>(0xc0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3f))};
    } else if (code < 0x10000) {
      s = {static_cast<char>(0xe0 | (code >> 12)), static_cast<char>(0x80 | ((code >> 6) & 0x3f)),
           static_cast<char>(0x80 | (code & 0x3f))};
    } else {
      s = {static_cast<char>(0xf0 | (code >> 18)), static_cast<char>(0x80 | ((code >> 12) & 0x3f)),
           static_cast<char>(0x80 | ((code >> 6) & 0x3f)), static_cast<char>(0x80 | (code & 0x3f))};
    }
    ASSERT_TRUE(IsUtf8(s)) << code;
    ASSERT_EQ(Utf8CharLength(s + "\xff"), s.size()) << code;  // the first character only
    for (size_t cut = 1; cut < s.size(); ++cut) {
      ASSERT_FALSE(IsUtf8(s.substr(0, cut))) << code;
      ASSERT_EQ(Utf8CharLength(s.substr(0, cut)), 0u) << code;
    }
  }
}

// A reference UTF-8 check: decodes each code point and checks it against its encoding's range.
bool ReferenceIsUtf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int more = 0;
    uint32_t code = c;
    if (c >= 0x80) {
      more = (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
      if (more < 0 || text.size() - i <= static_cast<size_t>(more)) return false;
      code = c & (0x3f >> more);
      for (int k = 1; k <= more; ++k) {
        const unsigned char next = static_cast<unsigned char>(text[i + k]);
        if ((next & 0xc0) != 0x80) return false;
        code = (code << 6) | (next & 0x3f);
      }
      constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
      if (code < kLeast[more] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
        return false;
      }
    }
    i += 1 + more;
  }
  return true;
}

// Utf8CharLength reads one character: its length where one starts the text, 0 where none does.
TEST(IsUtf8Test, Utf8CharLengthReadsTheFirstCharacter) {
  EXPECT_EQ(Utf8CharLength(""), 0u);
  EXPECT_EQ(Utf8CharLength("ab"), 1u);
  EXPECT_EQ(Utf8CharLength("\xc3\xa9\xff"), 2u);
  EXPECT_EQ(Utf8CharLength("\xe2\x82\xac"), 3u);
  EXPECT_EQ(Utf8CharLength("\xf4\x8f\xbf\xbf"), 4u);
  for (const char* bad :
       {"\xff", "\x80\x61", "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xed\xa0\x80",
        "\xf0\x80\x80\x80", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xc3\x28"}) {
    EXPECT_EQ(Utf8CharLength(bad), 0u) << absl::CHexEscape(bad);
  }
  // Every text of 1 to 3 bytes, and 4-byte texts around the 4-byte leads, agree with a decoder
  // that computes each code point and checks its range.
  for (int size = 1; size <= 3; ++size) {
    for (uint32_t bits = 0; bits < (uint32_t{1} << (8 * size)); ++bits) {
      std::string s(size, '\0');
      for (int k = 0; k < size; ++k) s[k] = static_cast<char>(bits >> (8 * k));
      ASSERT_EQ(IsUtf8(s), ReferenceIsUtf8(s)) << absl::CHexEscape(s);
    }
  }
  for (uint32_t lead = 0xee; lead <= 0xf8; ++lead) {
    for (uint32_t bits = 0; bits < (uint32_t{1} << 16); ++bits) {
      const std::string s = {static_cast<char>(lead), static_cast<char>(bits),
                             static_cast<char>(bits >> 8), '\x80'};
      ASSERT_EQ(IsUtf8(s), ReferenceIsUtf8(s)) << absl::CHexEscape(s);
    }
  }
}

// A reference depth: the deepest nesting of brackets outside strings, by a stack.
int ReferenceDepth(const std::string& json) {
  std::vector<char> open;
  size_t deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') open.push_back(c);
    if ((c == '}' || c == ']') && !open.empty()) open.pop_back();
    deepest = std::max(deepest, open.size());
  }
  return static_cast<int>(deepest);
}

TEST(JsonNestingDepthTest, MatchesAStackOverRandomText) {
  EXPECT_EQ(JsonNestingDepth(""), 0);
  EXPECT_EQ(JsonNestingDepth("{}"), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [[1], {"b": "[[[{"}]})"), 3);
  EXPECT_EQ(JsonNestingDepth(R"({"a\"[[": 1})"), 1);
  EXPECT_EQ(JsonNestingDepth("]]]]{"), 1);
  EXPECT_EQ(JsonNestingDepth(std::string(1000000, '[')), 1000000);
  // A ' is no quote, inside a string or out.
  EXPECT_EQ(JsonNestingDepth(R"({"it's": [[1]]})"), 3);
  EXPECT_EQ(JsonNestingDepth(R"({'a"': [[1]], 'b"': 1})"), 1);
  std::mt19937 rng(5);
  const std::string alphabet = "[]{}\"\\ a,:'";
  for (int i = 0; i < 20000; ++i) {
    std::string json(rng() % 80, ' ');
    for (char& c : json) c = alphabet[rng() % alphabet.size()];
    ASSERT_EQ(JsonNestingDepth(json), ReferenceDepth(json)) << json;
  }
}

// The reference for SkipJsonValue and JsonSingleQuoteError: walks `json` from `begin` as
// ReferenceDepth does, and returns the end of the object or list at `begin` (npos where it does
// not end), and in `quote` the first ' outside a string (npos where there is none).
size_t ReferenceEnd(const std::string& json, size_t begin, size_t* quote) {
  *quote = std::string::npos;
  size_t end = std::string::npos;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = begin; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '\'' && *quote == std::string::npos) *quote = i;
    if (end != std::string::npos) continue;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') {
      if (--depth == 0) end = i + 1;
    }
  }
  return end;
}

// One scanner: SkipJsonValue ends an object or list where the brackets JsonNestingDepth counts
// close, over the same strings, and JsonSingleQuoteError finds the ' that both treat as a byte.
TEST(JsonNestingDepthTest, SkipJsonValueAndSingleQuotesMatchAStackOverRandomText) {
  EXPECT_EQ(SkipJsonString(R"("a\"b" 1)", 0), 6u);
  EXPECT_EQ(SkipJsonString(R"("it's")", 0), 6u);
  EXPECT_EQ(SkipJsonString(R"("a\")", 0), std::string::npos);
  EXPECT_EQ(SkipJsonValue(R"({"a'": ["]"]} ,)", 0), 13u);
  EXPECT_EQ(SkipJsonValue("12.5e3, 1", 0), 6u);
  EXPECT_EQ(SkipJsonValue("[[1]", 0), std::string::npos);
  EXPECT_EQ(SkipJsonValue("", 0), std::string::npos);
  EXPECT_EQ(JsonSingleQuoteError(R"({"it's": "'"})"), "");
  EXPECT_EQ(JsonSingleQuoteError("{\"a\": 1,\n\n  'b': 2}"),
            "line 3 column 3 holds a ' outside a string: JSON strings take double quotes only");
  EXPECT_THAT(JsonSingleQuoteError("'"), StartsWith("line 1 column 1 holds a '"));

  std::mt19937 rng(11);
  const std::string alphabet = "[]{}\"\\ a,:'";
  for (int i = 0; i < 20000; ++i) {
    std::string json(1 + rng() % 80, ' ');
    for (char& c : json) c = alphabet[rng() % alphabet.size()];
    json[0] = "{["[rng() % 2];
    size_t quote;
    ASSERT_EQ(SkipJsonValue(json, 0), ReferenceEnd(json, 0, &quote)) << json;
    ASSERT_EQ(JsonSingleQuoteError(json).empty(), quote == std::string::npos) << json;
    if (quote != std::string::npos) {
      const size_t newline = json.rfind('\n', quote);  // none in the alphabet: line 1
      ASSERT_EQ(newline, std::string::npos);
      ASSERT_THAT(JsonSingleQuoteError(json),
                  StartsWith(absl::StrCat("line 1 column ", quote + 1, " holds a '")))
          << json;
    }
  }
}

// One pass gives what the two scans give: the ' message where there is a ' outside a string,
// whatever the depth, else the depth message past kMaxJsonNesting, else "".
TEST(JsonScanErrorTest, AgreesWithTheQuoteAndDepthScansOverRandomText) {
  EXPECT_EQ(JsonScanError(R"({"it's": [[1]]})"), "");
  EXPECT_EQ(JsonScanError(std::string(kMaxJsonNesting, '[')), "");
  EXPECT_EQ(JsonScanError(std::string(kMaxJsonNesting + 1, '[')),
            "its objects and lists nest 25 deep, more than the 24 kiln reads");
  EXPECT_EQ(JsonScanError(absl::StrCat("{\n", std::string(30, '['), " '")),
            "line 2 column 32 holds a ' outside a string: JSON strings take double quotes only");
  EXPECT_EQ(JsonScanError(absl::StrCat("'", std::string(30, '['))),
            JsonSingleQuoteError("'"));

  std::mt19937 rng(17);
  // '[' weighs more than the rest, so that random text passes kMaxJsonNesting now and then.
  const std::string alphabet = "[[[[[[[[]{}\"\\ a,:\n'";
  int deep = 0, quoted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string json(rng() % 120, ' ');
    for (char& c : json) c = alphabet[rng() % alphabet.size()];
    if (rng() % 2 == 0) json.erase(std::remove(json.begin(), json.end(), '\''), json.end());
    const std::string quote = JsonSingleQuoteError(json);
    const int depth = JsonNestingDepth(json);
    const std::string want =
        !quote.empty() ? quote
        : depth > kMaxJsonNesting
            ? absl::StrCat("its objects and lists nest ", depth, " deep, more than the ",
                           kMaxJsonNesting, " kiln reads")
            : "";
    ASSERT_EQ(JsonScanError(json), want) << absl::CHexEscape(json);
    deep += quote.empty() && depth > kMaxJsonNesting;
    quoted += !quote.empty() && depth > kMaxJsonNesting;
  }
  // Both outcomes past the limit occur: a text too deep, and one too deep whose ' decides.
  EXPECT_GT(deep, 0);
  EXPECT_GT(quoted, 0);
}

}  // namespace
}  // namespace kiln
