// Replays a fuzz harness's corpus and regression inputs without libFuzzer (any compiler):
// every file under the directories given is fed to LLVMFuzzerTestOneInput once.
//
//   fuzz_replay_<harness> DIR... [--min-files N]
//
// A finding aborts (as under libFuzzer) after naming the file. The driver checks its own
// part too (GRADWIRE_REPLAY_CHECK, exit status 1): every file is read whole before it is
// fed, and at least N inputs (default 1) were replayed, so a corpus that went missing or
// a file that cannot be read cannot pass.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

// GRADWIRE_REPLAY_CHECK(property, format, ...): when `property` is false, prints it and
// the printf-style message (its arguments evaluated only then) and exits 1. (This driver
// builds without gradwire's headers, hence not fuzz_support.hpp's GRADWIRE_FUZZ_CHECK.)
#define GRADWIRE_REPLAY_CHECK(property, ...)                           \
  do {                                                                 \
    if (!(property)) {                                                 \
      std::fprintf(stderr, "replay: check failed: %s: ", #property);  \
      std::fprintf(stderr, __VA_ARGS__);                               \
      std::fputc('\n', stderr);                                        \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::size_t min_files = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--min-files" && i + 1 < argc) {
      min_files = std::stoul(argv[++i]);
      continue;
    }
    if (!fs::exists(arg)) continue;  // a harness without regressions yet has no folder
    if (fs::is_regular_file(arg)) files.emplace_back(arg);
    else
      for (const auto& entry : fs::recursive_directory_iterator(arg))
        if (entry.is_regular_file() && entry.path().filename().string().front() != '.') files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::size_t replayed = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    GRADWIRE_REPLAY_CHECK(in.is_open(), "cannot open %s", f.c_str());
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto on_disk = fs::file_size(f);
    GRADWIRE_REPLAY_CHECK(!in.bad() && bytes.size() == on_disk, "read %zu of the %ju bytes of %s", bytes.size(),
                          static_cast<std::uintmax_t>(on_disk), f.c_str());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    // A copy of exactly the file's size, so that ASan (where it is on) sees reads past the end.
    auto* copy = static_cast<std::uint8_t*>(std::malloc(bytes.size() + 1));
    std::copy(bytes.begin(), bytes.end(), copy);
    LLVMFuzzerTestOneInput(copy, bytes.size());
    std::free(copy);
    ++replayed;
  }
  std::printf("replayed %zu input(s)\n", replayed);
  GRADWIRE_REPLAY_CHECK(replayed >= min_files, "expected at least %zu input(s), replayed %zu: is the corpus missing?",
                        min_files, replayed);
  return 0;
}
