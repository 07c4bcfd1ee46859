// Test-only file helpers: a fresh scratch directory under the test's TEST_TMPDIR, and whole-file
// reads and writes that keep every byte (no newline translation).
//
//   const std::filesystem::path dir = kiln::testing::ScratchDir("bom");
//   kiln::testing::WriteText(dir / "bom.json", "\xEF\xBB\xBF{}");
//   EXPECT_EQ(kiln::testing::ReadText(dir / "bom.json"), "\xEF\xBB\xBF{}");
#ifndef KILN_RUNTIME_CONFIG_TESTING_FILE_HELPERS_H_
#define KILN_RUNTIME_CONFIG_TESTING_FILE_HELPERS_H_

#include <filesystem>
#include <string>

namespace kiln {
namespace testing {

// Returns `name` under $TEST_TMPDIR (the system's temporary directory outside Bazel), emptied
// first: removed with everything in it, then created. Not thread-safe for one `name`.
std::filesystem::path ScratchDir(const std::string& name);

// Returns every byte of the file at `path`, or "" when it cannot be opened. Thread-safe.
std::string ReadText(const std::filesystem::path& path);

// Replaces the file at `path` with exactly `text`; a failed write is a fatal gtest failure of the
// calling test (the caller continues: check HasFatalFailure() where that matters). Thread-safe
// for distinct paths.
void WriteText(const std::filesystem::path& path, const std::string& text);

}  // namespace testing
}  // namespace kiln

#endif  // KILN_RUNTIME_CONFIG_TESTING_FILE_HELPERS_H_
