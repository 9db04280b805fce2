// Replays a fuzz harness's corpus and regression inputs without libFuzzer (any compiler):
// every file under the directories given is fed to LLVMFuzzerTestOneInput once.
//
//   fuzz_replay_<harness> DIR... [--min-files N]
//
// A finding aborts (as under libFuzzer) after naming the file; fewer than N files in all
// (default 1) is a failure too, so a corpus that went missing cannot pass.
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
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    // A copy of exactly the file's size, so that ASan (where it is on) sees reads past the end.
    auto* copy = static_cast<std::uint8_t*>(std::malloc(bytes.size() + 1));
    std::copy(bytes.begin(), bytes.end(), copy);
    LLVMFuzzerTestOneInput(copy, bytes.size());
    std::free(copy);
  }
  std::printf("replayed %zu input(s)\n", files.size());
  if (files.size() < min_files) {
    std::fprintf(stderr, "expected at least %zu input(s): is the corpus missing?\n", min_files);
    return 1;
  }
  return 0;
}
