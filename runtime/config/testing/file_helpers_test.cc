#include "runtime/config/testing/file_helpers.h"

#include <filesystem>
#include <string>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::kiln::testing::ReadText;
using ::kiln::testing::ScratchDir;
using ::kiln::testing::WriteText;

TEST(FileHelpersTest, ScratchDirIsFreshAndEmpty) {
  const fs::path dir = ScratchDir("fresh");
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
  WriteText(dir / "left_over", "x");
  fs::create_directories(dir / "sub" / "deeper");
  EXPECT_EQ(ScratchDir("fresh"), dir);
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(FileHelpersTest, WriteThenReadKeepsEveryByte) {
  const fs::path path = ScratchDir("bytes") / "f";
  std::string bytes;
  for (int c = 0; c < 256; ++c) bytes.push_back(static_cast<char>(c));
  bytes += "\r\n\n\r";
  WriteText(path, bytes);
  EXPECT_EQ(ReadText(path), bytes);
  WriteText(path, "short");  // replaces, not appends
  EXPECT_EQ(ReadText(path), "short");
  WriteText(path, "");
  EXPECT_EQ(ReadText(path), "");
  EXPECT_EQ(fs::file_size(path), 0u);
}

TEST(FileHelpersTest, ReadOfAMissingFileIsEmpty) {
  EXPECT_EQ(ReadText(ScratchDir("missing") / "nothing"), "");
}

// EXPECT_FATAL_FAILURE's statement may not use the test's locals.
void WriteIntoAMissingDirectory() { WriteText(ScratchDir("no_dir") / "absent" / "f", "x"); }

TEST(FileHelpersTest, WriteIntoAMissingDirectoryFailsTheTest) {
  EXPECT_FATAL_FAILURE(WriteIntoAMissingDirectory(), "file.good()");
}

}  // namespace
}  // namespace kiln
