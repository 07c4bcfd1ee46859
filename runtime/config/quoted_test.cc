#include "runtime/config/quoted.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

// Returns code point `code` encoded as UTF-8, by hand.
std::string Encode(uint32_t code) {
  if (code < 0x80) return std::string(1, static_cast<char>(code));
  if (code < 0x800) {
    return {static_cast<char>(0xc0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3f))};
  }
  if (code < 0x10000) {
    return {static_cast<char>(0xe0 | (code >> 12)), static_cast<char>(0x80 | ((code >> 6) & 0x3f)),
            static_cast<char>(0x80 | (code & 0x3f))};
  }
  return {static_cast<char>(0xf0 | (code >> 18)), static_cast<char>(0x80 | ((code >> 12) & 0x3f)),
          static_cast<char>(0x80 | ((code >> 6) & 0x3f)), static_cast<char>(0x80 | (code & 0x3f))};
}

// The characters quoted.h calls not printable, listed by range rather than computed as
// quoted.cc does.
bool ReferenceUnprintable(uint32_t code) {
  return code <= 0x1f || code == 0x7f || (code >= 0x80 && code <= 0x9f) || code == 0x2028 ||
         code == 0x2029 || code == 0x202a || code == 0x202b || code == 0x202c || code == 0x202d ||
         code == 0x202e || code == 0x2066 || code == 0x2067 || code == 0x2068 || code == 0x2069 ||
         code == 0x200e || code == 0x200f || code == 0x061c;
}

// The code points the sweeps try: all of U+0000..U+FFFF but the surrogates, then a sample of
// the planes above, U+10FFFF included.
std::vector<uint32_t> SweptCodePoints() {
  std::vector<uint32_t> codes;
  for (uint32_t code = 0; code <= 0xffff; ++code) {
    if (code < 0xd800 || code > 0xdfff) codes.push_back(code);
  }
  for (uint32_t code = 0x10000; code <= 0x10ffff; code += 251) codes.push_back(code);
  codes.push_back(0x10ffff);
  return codes;
}

// C1 controls (U+0085 NEL: a new line on some terminals; U+009B CSI: a terminal escape) and the
// line and paragraph separators are written as \uHHHH, in Escaped, Quoted and Printable alike.
TEST(EscapedTest, EscapesC1ControlsAndLineSeparatorsByCodePoint) {
  EXPECT_EQ(Escaped("a\xc2\x85" "b"), "a\\u0085b");
  EXPECT_EQ(Escaped("\xc2\x9b" "31mred"), "\\u009b31mred");
  EXPECT_EQ(Escaped("\xc2\x80\xc2\x9f"), "\\u0080\\u009f");
  EXPECT_EQ(Escaped("one\xe2\x80\xa8two\xe2\x80\xa9three"), "one\\u2028two\\u2029three");
  EXPECT_EQ(Quoted("x\xc2\x85"), "\"x\\u0085\"");
  EXPECT_EQ(Printable("\"x\xc2\x9b\""), "\"x\\u009b\"");
  // Their neighbours are printable and stay: U+00A0 (no-break space), U+2027.
  for (const char* text : {"\xc2\xa0", "\xe2\x80\xa7"}) {
    EXPECT_EQ(Escaped(text), text) << absl::CHexEscape(text);
    EXPECT_TRUE(IsOneCleanLine(text)) << absl::CHexEscape(text);
  }
  // In text that is not UTF-8, each byte is escaped as ever.
  EXPECT_EQ(Escaped("\xc2\x85\xff"), "\\xc2\\x85\\xff");
  for (const char* raw : {"\xc2\x85", "\xc2\x9b", "\xc2\x80", "\xc2\x9f", "\xe2\x80\xa8",
                          "\xe2\x80\xa9", "name\xc2\x9b" "2J"}) {
    EXPECT_FALSE(IsOneCleanLine(raw)) << absl::CHexEscape(raw);
    EXPECT_TRUE(IsOneCleanLine(Escaped(raw))) << absl::CHexEscape(raw);
    EXPECT_TRUE(IsOneCleanLine(Quoted(raw))) << absl::CHexEscape(raw);
    EXPECT_TRUE(IsOneCleanLine(Printable(raw))) << absl::CHexEscape(raw);
  }
}

// The bidirectional controls, with which a terminal would show a name in another order ("Trojan
// Source": "a\u202eb.txt" shows as "atxt.b"), are written as \uHHHH in every form; the
// characters beside each range stay as they are.
TEST(EscapedTest, EscapesBidirectionalControlsByCodePoint) {
  const struct {
    const char* raw;
    const char* escaped;
  } controls[] = {
      {"\xd8\x9c", "\\u061c"},     {"\xe2\x80\x8e", "\\u200e"}, {"\xe2\x80\x8f", "\\u200f"},
      {"\xe2\x80\xaa", "\\u202a"}, {"\xe2\x80\xab", "\\u202b"}, {"\xe2\x80\xac", "\\u202c"},
      {"\xe2\x80\xad", "\\u202d"}, {"\xe2\x80\xae", "\\u202e"}, {"\xe2\x81\xa6", "\\u2066"},
      {"\xe2\x81\xa7", "\\u2067"}, {"\xe2\x81\xa8", "\\u2068"}, {"\xe2\x81\xa9", "\\u2069"},
  };
  for (const auto& [raw, escaped] : controls) {
    EXPECT_FALSE(IsOneCleanLine(raw)) << escaped;
    EXPECT_EQ(Escaped(raw), escaped);
    EXPECT_EQ(Printable(raw), escaped);
    EXPECT_EQ(Quoted(raw, '\''), absl::StrCat("'", escaped, "'"));
  }
  // A path that a terminal would show as "report_fdp.exe" keeps its order when quoted.
  const std::string path = "report_\xe2\x80\xae" "exe.pdf";
  EXPECT_FALSE(IsOneCleanLine(path));
  EXPECT_EQ(Quoted(path), "\"report_\\u202eexe.pdf\"");
  EXPECT_TRUE(IsOneCleanLine(Quoted(path)));
  // Their neighbours U+061B, U+061D, U+200D, U+2010, U+202F, U+2065 and U+206A are printable.
  for (const char* kept : {"\xd8\x9b", "\xd8\x9d", "\xe2\x80\x8d", "\xe2\x80\x90",
                           "\xe2\x80\xaf", "\xe2\x81\xa5", "\xe2\x81\xaa"}) {
    EXPECT_EQ(Escaped(kept), kept) << absl::CHexEscape(kept);
    EXPECT_TRUE(IsOneCleanLine(kept)) << absl::CHexEscape(kept);
  }
}

// Printable escapes what is not printable, and leaves quotes and backslashes as they are.
TEST(PrintableTest, EscapesOnlyWhatIsNotPrintable) {
  EXPECT_EQ(Printable(R"(Message type "a.B" has no field named "x" \ 'y')"),
            R"(Message type "a.B" has no field named "x" \ 'y')");
  EXPECT_EQ(Printable("a\nb\t\x1b[0m\x7f"), "a\\nb\\t\\x1b[0m\\x7f");
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"), "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac");
  EXPECT_EQ(Printable("\"caf\xc3\xa9\xff\""), "\"caf\\xc3\\xa9\\xff\"");
  // Escaped writes the same text with its quotes and backslashes escaped too.
  EXPECT_EQ(Escaped(R"("x" \ 'y')"), R"(\"x\" \\ \'y\')");
}

// Every code point alone, and between an ASCII letter and a hex digit: the output of each form is
// one clean line, a printable character comes out as it is, and one that is not comes out as its
// escape (C's for ASCII, \uHHHH beyond). IsOneCleanLine takes the character exactly when it is
// printable.
TEST(EscapedTest, EveryCodePointComesOutOnOneCleanLine) {
  int escaped = 0, kept = 0;
  for (const uint32_t code : SweptCodePoints()) {
    const std::string c = Encode(code);
    const bool unprintable = ReferenceUnprintable(code);
    ASSERT_EQ(IsOneCleanLine(c), !unprintable) << code;
    std::string want = c;
    if (unprintable) {
      want = code < 0x80 ? absl::CHexEscape(c) : absl::StrFormat("\\u%04x", code);
    } else if (code < 0x80) {
      want = absl::CHexEscape(c);  // a quote or a backslash: escaped by Escaped only
    }
    ASSERT_EQ(Escaped(c), want) << code;
    ASSERT_EQ(Printable(c), unprintable ? want : c) << code;
    for (const std::string& text : {c, "a" + c + "0", c + c}) {
      ASSERT_TRUE(IsOneCleanLine(Escaped(text))) << code;
      ASSERT_TRUE(IsOneCleanLine(Quoted(text))) << code;
      ASSERT_TRUE(IsOneCleanLine(Printable(text))) << code;
    }
    // A C string literal of the text reads back as the text.
    std::string back;
    ASSERT_TRUE(absl::CUnescape(Escaped("a" + c + "0"), &back)) << code;
    ASSERT_EQ(back, "a" + c + "0") << code;
    (unprintable ? escaped : kept) += 1;
  }
  EXPECT_EQ(escaped, 0x20 + 1 + 0x20 + 2 + 5 + 4 + 3);
  EXPECT_GT(kept, 60000);
}

// Random mixes of printable text, controls, C1 controls, separators, bidirectional controls and
// stray bytes: every form
// is one clean line, and Escaped's reads back, as a C string literal, as the text.
TEST(EscapedTest, RandomTextComesOutOnOneCleanLineAndReadsBack) {
  const std::vector<std::string> pieces = {
      "a",          "0",          "f",          "\"",           "'",  "\\", "\n", "\x1b",
      "\x7f",       "\x01",       "\xc3\xa9",   "\xe6\x97\xa5", "\xf0\x9f\x98\x80",
      "\xc2\x85",   "\xc2\x9b",   "\xe2\x80\xa8", "\xe2\x80\xa9", "\xff", "\xc2", "\xe2\x80",
      "\xe2\x80\xae", "\xe2\x81\xa6", "\xd8\x9c"};
  std::mt19937 rng(2028);
  int utf8 = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    for (int n = rng() % 12; n > 0; --n) text += pieces[rng() % pieces.size()];
    utf8 += IsUtf8(text);
    ASSERT_TRUE(IsOneCleanLine(Escaped(text))) << absl::CHexEscape(text);
    ASSERT_TRUE(IsOneCleanLine(Quoted(text, '\''))) << absl::CHexEscape(text);
    ASSERT_TRUE(IsOneCleanLine(Printable(text))) << absl::CHexEscape(text);
    std::string back;
    ASSERT_TRUE(absl::CUnescape(Escaped(text), &back)) << absl::CHexEscape(text);
    ASSERT_EQ(back, text) << absl::CHexEscape(text);
  }
  EXPECT_GT(utf8, 1000);
  EXPECT_LT(utf8, 19000);
}

}  // namespace
}  // namespace kiln
