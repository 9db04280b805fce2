// Fuzzes checkpoint loading (checkpoint.hpp): load_checkpoint on a file of the fuzzer's bytes.
//
// Input: [mode][file]. mode bit 0: write the right CRC-32C trailer first (so that the
// fuzzer reaches the checks behind the checksum; without it, it tests the checksum);
// bits 1..2: the model's optimizer (sgd, momentum, adam, adamw); bit 3: double instead
// of float. The file goes to a temporary file in /dev/shm (the loader reads from a path).
// Properties: only errc::config rejects, naming the file, and leaves the model as it
// was; a file that loads is exactly what save_checkpoint writes for the loaded model
// and step (so nothing in it was ignored).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint_model.hpp"
#include "fuzz_support.hpp"

namespace fs = std::filesystem;
using gradwire::errc;

namespace {

const fs::path& scratch() {
  static const fs::path dir = [] {
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("gradwire-fuzz-checkpoint-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

struct cleanup {
  ~cleanup() {
    std::error_code ignored;
    fs::remove_all(scratch(), ignored);
  }
} const at_exit;

void write(const fs::path& p, const std::vector<std::byte>& bytes) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  GRADWIRE_FUZZ_CHECK(f != nullptr, "cannot write " + p.string());
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

std::vector<std::byte> read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

template <class V, class Optimizer>
void load(const std::vector<std::byte>& file) {
  using model_type = gradwire::fuzz::checkpoint_model<V, Optimizer>;
  const fs::path in = scratch() / "in.ckpt";
  write(in, file);
  model_type model(Optimizer{}, 7);
  const model_type before(Optimizer{}, 7);
  auto same = [](const model_type& a, const model_type& b) {
    if (a.storage != b.storage) return false;
    for (std::size_t i = 0; i < a.states.size(); ++i) {
      std::vector<V> x, y;
      std::vector<long> cx, cy;
      a.states[i].for_each_buffer([&](std::span<const V> s) { x.insert(x.end(), s.begin(), s.end()); });
      b.states[i].for_each_buffer([&](std::span<const V> s) { y.insert(y.end(), s.begin(), s.end()); });
      a.states[i].for_each_counter([&](const long& c) { cx.push_back(c); });
      b.states[i].for_each_counter([&](const long& c) { cy.push_back(c); });
      // Bitwise: a NaN loaded from a file is still "the same" as itself.
      if (x.size() != y.size() || (!x.empty() && std::memcmp(x.data(), y.data(), x.size() * sizeof(V)) != 0) || cx != cy)
        return false;
    }
    return true;
  };
  std::uint64_t step = 0;
  try {
    step = gradwire::load_checkpoint(in, model);
  } catch (const gradwire::error& e) {
    gradwire::fuzz::expect_error(e, {errc::config}, in.string());
    GRADWIRE_FUZZ_CHECK(same(model, before), "a refused checkpoint changed the model");
    return;
  }
  const fs::path out = scratch() / "out.ckpt";
  gradwire::save_checkpoint(out, model, step);
  GRADWIRE_FUZZ_CHECK(read(out) == file, "a checkpoint that loads is not what saving the loaded model writes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  gradwire::fuzz::input input(data, size);
  const std::uint8_t mode = input.byte();
  const auto rest = input.rest();
  std::vector<std::byte> file(rest.begin(), rest.end());
  if ((mode & 1) && file.size() >= 4) {
    const std::uint32_t crc = gradwire::support::crc32c(std::span(file).first(file.size() - 4));
    std::memcpy(file.data() + file.size() - 4, &crc, 4);
  }
  namespace optim = gradwire::optim;
  const bool wide = mode & 8;
  switch ((mode >> 1) & 3) {
    case 0: wide ? load<double, optim::sgd>(file) : load<float, optim::sgd>(file); break;
    case 1: wide ? load<double, optim::momentum>(file) : load<float, optim::momentum>(file); break;
    case 2: wide ? load<double, optim::adam>(file) : load<float, optim::adam>(file); break;
    default: wide ? load<double, optim::adamw>(file) : load<float, optim::adamw>(file); break;
  }
  return 0;
}
