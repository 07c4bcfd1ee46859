#include "tools/cli_flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/config/quoted.h"

ABSL_FLAG(int, test_int, 0, "An int");
ABSL_FLAG(std::optional<int>, test_opt, std::nullopt, "An optional int");
ABSL_FLAG(bool, test_bool, false, "A bool");
ABSL_FLAG(std::string, test_str, "", "A string");
ABSL_FLAG(double, test_double, 0.0, "A double");
ABSL_FLAG(uint64_t, test_u64, 0, "A uint64");

namespace kiln {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kFix[] = "; give sizes like 1,2,4,8";

// Runs CheckFlags on `args` (argv[0] added).
absl::Status Check(const std::vector<std::string>& args) {
  std::vector<std::string> storage = {"tool"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  return CheckFlags(static_cast<int>(argv.size()), argv.data(), "tool");
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

// The path CheckFlags tells flagfiles apart by.
std::string Canonical(const std::string& path) {
  return std::filesystem::weakly_canonical(path).string();
}

// The reference for an entry ParseIntList refuses: an optional sign and digits only is an
// integer out of range, anything else not an integer.
bool LooksDecimal(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

// Random integers over all of int, written with random spaces, signs and leading zeros, parse
// back exactly.
TEST(ParseIntListTest, SweepRandomListsRoundTrip) {
  std::mt19937 rng(7);
  auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  const int special[] = {INT_MIN, INT_MIN + 1, -1, 0, 1, INT_MAX - 1, INT_MAX};
  const char* spaces[] = {"", " ", "  ", "\t", " \t "};
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int> want(1 + pick(pick(1) == 0 ? 4 : 300));
    std::string text;
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = pick(3) == 0 ? special[pick(6)]
                             : std::uniform_int_distribution<int>(INT_MIN, INT_MAX)(rng);
      std::string digits =
          std::to_string(static_cast<int64_t>(want[i]) < 0 ? -static_cast<int64_t>(want[i])
                                                           : static_cast<int64_t>(want[i]));
      if (pick(5) == 0) digits = std::string(1 + pick(3), '0') + digits;  // leading zeros
      const std::string sign = want[i] < 0 ? "-" : (pick(4) == 0 ? "+" : "");
      absl::StrAppend(&text, i == 0 ? "" : ",", spaces[pick(4)], sign, digits, spaces[pick(4)]);
    }
    absl::StatusOr<std::vector<int>> got = ParseIntList(text, "capture_sizes", kFix);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status();
    ASSERT_EQ(*got, want) << text;
  }
  // Nothing but spaces and commas is an empty list (the caller says what that means).
  for (const char* blank : {"", " ", ",", " , ,\t", ",,,,"}) {
    absl::StatusOr<std::vector<int>> got = ParseIntList(blank, "capture_sizes", kFix);
    ASSERT_TRUE(got.ok()) << '"' << blank << "\": " << got.status();
    EXPECT_TRUE(got->empty());
  }
}

// One bad entry among good ones: out of range (however many digits), not an integer (hex,
// floats, signs alone or doubled, control bytes, non-ASCII digits), or an empty entry. The message
// names the flag and the entry (escaped), says which of the two it is, and ends with the fix.
TEST(ParseIntListTest, SweepBadEntriesAreNamed) {
  std::mt19937 rng(11);
  auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  const std::vector<std::string> not_integers = {
      "x",   "1.5", "1e3",  "0x10",     "--1",       "+-1", "1-", "1 2",   "+",   "-",
      "inf", "nan", "\x01", "\xd9\xa1", "8\x1b[31m", "\"",  "\\", "1_000", "0b1", "\xff"};
  int out_of_range = 0, not_integer = 0, empty = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> entries;
    const int good = pick(6);
    for (int i = 0; i < good; ++i) entries.push_back(std::to_string(pick(1000) - 10));
    std::string bad;
    switch (pick(3)) {
      case 0: {  // beyond int, by one or by hundreds of digits
        const int64_t edge =
            pick(1) == 0 ? int64_t{INT_MAX} + 1 + pick(1000) : int64_t{INT_MIN} - 1 - pick(1000);
        bad = pick(1) == 0 ? std::to_string(edge)
                           : absl::StrCat(pick(1) == 0 ? "-" : "+", 1 + pick(8),
                                          std::string(pick(400) + 10, '0' + pick(9)));
        break;
      }
      case 1:
        bad = not_integers[pick(static_cast<int>(not_integers.size()) - 1)];
        break;
      default:
        bad = "";  // an empty entry
    }
    entries.insert(entries.begin() + pick(static_cast<int>(entries.size())), bad);
    const std::string text = absl::StrJoin(entries, pick(1) == 0 ? "," : " , ");
    absl::StatusOr<std::vector<int>> got = ParseIntList(text, "capture_sizes", kFix);
    if (bad.empty() && good == 0) {  // a lone empty entry: the empty list
      ASSERT_TRUE(got.ok()) << got.status();
      continue;
    }
    ASSERT_FALSE(got.ok()) << text;
    ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message = Message(got.status());
    ASSERT_THAT(message, StartsWith("--capture_sizes"));
    ASSERT_THAT(message, EndsWith(kFix));
    if (bad.empty()) {
      ++empty;
      ASSERT_THAT(message, HasSubstr("has an empty entry")) << text;
    } else {
      const std::string want =
          absl::StrCat("--capture_sizes has \"", Escaped(bad), "\", which is ",
                       LooksDecimal(bad) ? "out of range" : "not an integer");
      (LooksDecimal(bad) ? out_of_range : not_integer) += 1;
      ASSERT_THAT(message, HasSubstr(want)) << text;
    }
    ASSERT_EQ(message.find('\n'), std::string::npos);
  }
  EXPECT_GT(out_of_range, 500);
  EXPECT_GT(not_integer, 500);
  EXPECT_GT(empty, 400);
}

TEST(ParseIntListTest, VeryLongLists) {
  std::vector<int> want(200000);
  std::string text;
  for (int i = 0; i < static_cast<int>(want.size()); ++i) {
    want[i] = i * 7 - 1000;
    absl::StrAppend(&text, i == 0 ? "" : ",", want[i]);
  }
  absl::StatusOr<std::vector<int>> got = ParseIntList(text, "prefill_sizes", kFix);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
  absl::StrAppend(&text, ",");
  EXPECT_THAT(Message(ParseIntList(text, "prefill_sizes", kFix).status()),
              HasSubstr("has an empty entry"));
}

// Random command lines of valid flags, each form absl takes (--flag=v, -flag=v, --flag v, bools
// bare and negated, empty strings, anything after "--"), pass; one bad argument put among them
// fails with a message that names it.
TEST(CheckFlagsTest, SweepCommandLines) {
  std::mt19937 rng(3);
  auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
  const std::vector<std::vector<std::string>> valid = {{"--test_int=5"},
                                                       {"-test_int=-7"},
                                                       {"--test_int", "12"},
                                                       {"--test_bool"},
                                                       {"--notest_bool"},
                                                       {"--test_bool=false"},
                                                       {"--test_str="},
                                                       {"--test_str=a=b,c"},
                                                       {"--test_str", "--"},
                                                       {"--test_opt=3"},
                                                       {"--test_double=1e-3"},
                                                       {"--test_double=nan"},
                                                       {"--test_u64=18446744073709551615"},
                                                       {"--help"},
                                                       {"--test_int= 5"}};
  struct Bad {
    std::vector<std::string> args;
    std::string message;
    bool last;  // only at the end (it takes the next argument as its value otherwise)
  };
  const std::vector<Bad> bad = {
      {{"--nosuch=1"}, "Unknown flag --nosuch; run with --help", false},
      {{"llama"}, "Unexpected argument \"llama\"; tool takes only flags", false},
      {{"-"}, "Unexpected argument \"-\"", false},
      {{"\x1b[2J"}, "Unexpected argument \"\\x1b[2J\"", false},
      {{"--test_int"}, "Flag --test_int needs a value", true},
      {{"--test_int="}, "Flag --test_int is empty; give it a value or leave it out", false},
      {{"--test_opt="}, "Flag --test_opt is empty", false},
      {{"--test_int=lots"}, "Bad value \"lots\" for --test_int", false},
      {{"--test_int=2147483648"}, "Bad value \"2147483648\" for --test_int", false},
      {{"--test_u64=-1"}, "Bad value \"-1\" for --test_u64", false},
      {{"--test_bool=maybe"}, "Bad value \"maybe\" for --test_bool", false},
      {{"--test_bool="}, "Flag --test_bool is empty", false},
      {{"--notest_bool=true"}, "Flag --notest_bool takes no value; give --test_bool=false", false},
      {{"--notest_int"},
       "Flag --notest_int: only plain boolean flags have a --no form; give "
       "--test_int=VALUE",
       false},
      {{"--notest_opt"}, "Flag --notest_opt: only plain boolean flags", false},
      {{"--flagfile"}, "Flag --flagfile needs a value", true},
      {{"--flagfile="}, "Flag --flagfile is empty", false},
  };
  int passed = 0, failed = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> args;
    const int n = pick(6);
    for (int i = 0; i < n; ++i) {
      const std::vector<std::string>& v = valid[pick(static_cast<int>(valid.size()) - 1)];
      args.insert(args.end(), v.begin(), v.end());
    }
    const bool with_bad = pick(2) != 0;
    const Bad& b = bad[pick(static_cast<int>(bad.size()) - 1)];
    if (with_bad) {
      // At an argument boundary: after a whole valid group, not between a flag and its value.
      size_t at = args.size();
      if (!b.last) {
        std::vector<size_t> boundaries = {0};
        for (size_t i = 0; i < args.size(); ++i) {
          const bool takes_next = args[i] == "--test_int" || args[i] == "--test_str";
          if (takes_next) ++i;  // the value belongs to the flag
          boundaries.push_back(i + 1);
        }
        at = boundaries[pick(static_cast<int>(boundaries.size()) - 1)];
      }
      args.insert(args.begin() + at, b.args.begin(), b.args.end());
    }
    if (pick(3) == 0 && !(with_bad && b.last)) {  // after "--", anything goes
      args.push_back("--");
      args.push_back("positional");
      args.push_back("--nosuch");
    }
    const absl::Status status = Check(args);
    if (!with_bad) {
      ++passed;
      ASSERT_TRUE(status.ok()) << absl::StrJoin(args, " ") << ": " << status;
      continue;
    }
    ++failed;
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << absl::StrJoin(args, " ");
    ASSERT_THAT(Message(status), HasSubstr(b.message)) << absl::StrJoin(args, " ");
    ASSERT_EQ(Message(status).find('\n'), std::string::npos);
  }
  EXPECT_GT(passed, 400);
  EXPECT_GT(failed, 1000);
}

// A flagfile is read as absl reads it, and everything wrong with it is named with its file and
// line, before absl could loop on it, block on it or exit with its own status.
TEST(CheckFlagsTest, Flagfiles) {
  const std::string good =
      WriteFile("good.flags",
                "# a comment\n\n   --test_int=5\n--test_bool\n\t--test_str=x y\n"
                "--test_opt=4\r\n--test_int\n--test_str=value taken by --test_int above\n");
  EXPECT_THAT(Message(Check({"--flagfile=" + good})),
              HasSubstr("Bad value \"--test_str=value taken by --test_int above\" for --test_int"));
  const std::string fine =
      WriteFile("fine.flags", "# a comment\n\n   --test_int=5\n--test_bool\n--test_opt=4\r\n");
  EXPECT_TRUE(Check({"--flagfile=" + fine}).ok()) << Check({"--flagfile=" + fine});
  EXPECT_TRUE(Check({"--flagfile", fine}).ok());
  EXPECT_TRUE(Check({"--flagfile=" + fine + "," + fine}).ok());

  // What is wrong inside a file: the file and the line.
  const std::string unknown = WriteFile("unknown.flags", "--test_int=1\n\n--nosuch=3\n");
  EXPECT_EQ(Message(Check({"--flagfile=" + unknown})),
            "--flagfile " + Quoted(unknown) +
                " line 3: Unknown flag --nosuch; run with --help to list "
                "the flags");
  const std::string value = WriteFile("value.flags", "--test_int=lots\n");
  EXPECT_THAT(Message(Check({"--flagfile=" + value})),
              HasSubstr(Quoted(value) + " line 1: Bad value \"lots\" for --test_int"));
  const std::string positional = WriteFile("positional.flags", "--test_int=1\nllama\n");
  EXPECT_THAT(Message(Check({"--flagfile=" + positional})),
              HasSubstr(Quoted(positional) + " line 2: \"llama\" is not a flag"));
  const std::string dashes = WriteFile("dashes.flags", "--\n--test_int=1\n");
  EXPECT_THAT(Message(Check({"--flagfile=" + dashes})),
              HasSubstr(Quoted(dashes) + " line 1: \"--\" ends the flags"));
  const std::string last = WriteFile("last.flags", "--test_int\n");
  EXPECT_THAT(Message(Check({"--flagfile=" + last})),
              HasSubstr(Quoted(last) + " line 1: Flag --test_int needs a value"));
  // Nested: each file on the way is named.
  const std::string outer = WriteFile("outer.flags", "--test_bool\n--flagfile=" + unknown + "\n");
  EXPECT_EQ(Message(Check({"--flagfile=" + outer})),
            "--flagfile " + Quoted(outer) + " line 2: --flagfile " + Quoted(unknown) +
                " line 3: Unknown flag --nosuch; run with --help to list the flags");

  // Files that cannot be flagfiles: refused as a bad flag value (InvalidArgument), before
  // anything blocks on them or reads them for ever, naming the path and what it is.
  const auto refused = [](const std::string& path, const std::string& message) {
    const absl::Status status = Check({"--flagfile=" + path});
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << path << ": " << status;
    EXPECT_THAT(Message(status), StartsWith(message)) << path;
    EXPECT_TRUE(IsOneCleanLine(Message(status))) << status;
  };
  refused(::testing::TempDir(),
          "Cannot read --flagfile \"" + ::testing::TempDir() +
              "\": Is a directory; check that the path names a readable file");
  refused("/no/such/file",
          "Cannot open --flagfile \"/no/such/file\": No such file or directory; check the path");
  refused("/dev/zero", "Cannot read --flagfile \"/dev/zero\": Is a device, not a regular file");
  const std::string fifo = absl::StrCat(::testing::TempDir(), "/fifo.flags");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused(fifo, "Cannot read --flagfile \"" + fifo +  // must not wait for a writer
                    "\": Is a FIFO (named pipe), which would block until written");
  const std::string big = WriteFile("big.flags", std::string((1 << 20) + 1, '#'));
  refused(big, "Cannot read --flagfile \"" + big +
                   "\": it holds 1048577 bytes, more than the 1048576 a file of settings may");
  // 1 MiB itself is read.
  const std::string full = WriteFile("full.flags", std::string(1 << 20, '#'));
  EXPECT_TRUE(Check({"--flagfile=" + full}).ok()) << Check({"--flagfile=" + full});
  if (::geteuid() != 0) {  // root reads files whatever their mode
    const std::string locked = WriteFile("locked.flags", "--test_int=1\n");
    ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
    refused(locked, "Cannot open --flagfile \"" + locked + "\": Permission denied");
  }
  // Inside another flagfile, the refusal names that file and line too.
  const std::string names_dir =
      WriteFile("names_dir.flags", "--test_int=1\n--flagfile=" + ::testing::TempDir() + "\n");
  refused(names_dir, "--flagfile " + Quoted(names_dir) + " line 2: Cannot read --flagfile \"" +
                         ::testing::TempDir() + "\": Is a directory");
  EXPECT_THAT(Message(Check({"--flagfile=" + fine + ",," + fine})),
              HasSubstr("--flagfile=" + fine + ",," + fine + " has an empty entry"));
}

// Flagfiles that name themselves, each other, or fan out: absl would read them until memory runs
// out; CheckFlags stops with a message.
TEST(CheckFlagsTest, FlagfileLoopsAndFanOut) {
  const std::string self = absl::StrCat(::testing::TempDir(), "/self.flags");
  WriteFile("self.flags", "--test_int=1\n--flagfile=" + self + "\n");
  EXPECT_THAT(
      Message(Check({"--flagfile=" + self})),
      HasSubstr(absl::StrCat("--flagfile ", Quoted(self), " is already being read (",
                             Quoted(Canonical(self)), " -> ", Quoted(Canonical(self)), ")")));
  // The same file by another spelling of its path.
  const std::string dotted = absl::StrCat(::testing::TempDir(), "/./self.flags");
  EXPECT_THAT(Message(Check({"--flagfile=" + dotted})), HasSubstr("is already being read"));
  const std::string a = absl::StrCat(::testing::TempDir(), "/a.flags");
  const std::string b = absl::StrCat(::testing::TempDir(), "/b.flags");
  WriteFile("a.flags", "--flagfile=" + b + "\n");
  WriteFile("b.flags", "--test_bool\n--flagfile=" + a + "\n");
  EXPECT_THAT(Message(Check({"--flagfile=" + a})), HasSubstr("is already being read"));

  // A chain of 8 files is read; 9 is too deep.
  std::string next = WriteFile("chain0.flags", "--test_int=3\n");
  for (int i = 1; i <= 8; ++i) {
    const std::string file = WriteFile(absl::StrCat("chain", i, ".flags"), "--flagfile=" + next);
    if (i == 7) {
      EXPECT_TRUE(Check({"--flagfile=" + file}).ok()) << Check({"--flagfile=" + file});
    }
    next = file;
  }
  EXPECT_THAT(Message(Check({"--flagfile=" + next})), HasSubstr("is nested 9 files deep"));
  // Each level names the next one twice: 2^7 reads.
  next = WriteFile("fan0.flags", "--test_int=3\n");
  for (int i = 1; i <= 7; ++i) {
    next = WriteFile(absl::StrCat("fan", i, ".flags"),
                     absl::StrCat("--flagfile=", next, "\n--flagfile=", next, "\n"));
  }
  EXPECT_THAT(Message(Check({"--flagfile=" + next})), HasSubstr("More than 64 flagfiles"));
}

// A flagfile's path and a flag's value holding an ESC (a terminal escape), a newline and U+009B (a
// terminal's CSI) are named escaped, every message on one clean line.
TEST(CheckFlagsTest, OddPathsAndValuesAreEscaped) {
  const std::string odd = "odd\033[31m\n\302\2332J";
  const std::string escaped = "odd\\x1b[31m\\n\\u009b2J";
  const auto clean = [&](const absl::Status& status, const std::string& want) {
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(Message(status), HasSubstr(want));
    EXPECT_THAT(Message(status), HasSubstr(escaped));
    EXPECT_TRUE(IsOneCleanLine(Message(status))) << absl::CHexEscape(Message(status));
  };
  // The file and line of what is wrong inside a flagfile.
  const std::string unknown = WriteFile(odd + ".flags", "--test_int=1\n--nosuch=3\n");
  clean(Check({"--flagfile=" + unknown}),
        absl::StrCat("--flagfile ", Quoted(unknown), " line 2: Unknown flag --nosuch"));
  // A path with a newline cannot be named inside a flagfile: the odd file, given on the command
  // line, names others. A loop below it: the chain read, each file quoted.
  const std::string self = absl::StrCat(::testing::TempDir(), "/self_loop.flags");
  WriteFile("self_loop.flags", "--flagfile=" + self + "\n");
  const std::string top = WriteFile(odd + "_top.flags", "--flagfile=" + self + "\n");
  clean(Check({"--flagfile=" + top}),
        absl::StrCat("--flagfile ", Quoted(top), " line 1: --flagfile ", Quoted(self),
                     " line 1: --flagfile ", Quoted(self), " is already being read (",
                     Quoted(Canonical(top)), " -> ", Quoted(Canonical(self)), " -> ",
                     Quoted(Canonical(self)), "), so it would be read for ever"));
  // Nested too deep: the chain.
  std::string next = WriteFile("plain_chain0.flags", "--test_int=3\n");
  std::vector<std::string> chain = {Quoted(Canonical(next))};
  for (int i = 1; i <= 7; ++i) {
    next = WriteFile(absl::StrCat("plain_chain", i, ".flags"), "--flagfile=" + next);
    chain.insert(chain.begin(), Quoted(Canonical(next)));
  }
  next = WriteFile(odd + "_chain8.flags", "--flagfile=" + next);
  chain.insert(chain.begin(), Quoted(Canonical(next)));
  clean(Check({"--flagfile=" + next}),
        absl::StrCat(" is nested 9 files deep (", absl::StrJoin(chain, " -> "), "); at most 8"));
  // Past 64 files read: the last one.
  const std::string fine = WriteFile(odd + "_fine.flags", "--test_int=1\n");
  const std::string plain = WriteFile("plain_fine.flags", "--test_int=1\n");
  clean(Check({absl::StrCat("--flagfile=", absl::StrJoin(std::vector<std::string>(64, plain), ","),
                            ",", fine)}),
        absl::StrCat("More than 64 flagfiles are read (the last ", Quoted(fine), ")"));
  // A list of flagfiles with an empty entry, as typed.
  clean(Check({"--flagfile=" + fine + ",," + fine}),
        absl::StrCat("--flagfile=", Escaped(fine), ",,", Escaped(fine),
                     " has an empty entry; list the files separated by single commas"));
  // A value the flag does not parse, also where absl's own complaint repeats it.
  clean(Check({"--test_int=" + odd}), absl::StrCat("Bad value ", Quoted(odd), " for --test_int: "));
  clean(Check({"--test_bool=" + odd}), absl::StrCat("Bad value ", Quoted(odd), " for --test_bool"));
  clean(Check({"--test_double=" + odd}),
        absl::StrCat("Bad value ", Quoted(odd), " for --test_double"));
}

}  // namespace
}  // namespace kiln
