// save_checkpoint / load_checkpoint: bit-identical round trips, resumed training, every refusal, atomic replace.
#include <catch2/catch.hpp>

#include "helpers/least_squares.hpp"

#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <gradwire/checkpoint.hpp>
#include <gradwire/gradwire.hpp>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "helpers/errors.hpp"

namespace gw = gradwire;
namespace fs = std::filesystem;
using gw::testing::error_of;

namespace {
// A linear least-squares model y = W x + b, loss 0.5 * mean over the batch of |W x + b - y|^2.
constexpr std::size_t inputs = 7, outputs = 3, batch = 5;

using gradwire::testing::batch_data;
const gradwire::testing::least_squares model{inputs, outputs, batch};

std::vector<batch_data> make_data(int steps) {
  std::mt19937 gen(std::random_device{}());
  std::vector<batch_data> data;
  for (int k = 0; k < steps; ++k) data.push_back(model.random_batch(gen));
  return data;
}

// `extra` appends a tensor; `bias` sets the bias length (both to build mismatched models).
template <class T>
std::vector<gw::host_tensor<T>> make_params(double offset, std::size_t bias = outputs, bool extra = false) {
  std::vector<gw::host_tensor<T>> p;
  p.emplace_back(gw::shape{outputs, inputs});
  p.emplace_back(gw::shape{bias});
  if (extra) p.emplace_back(gw::shape{2});
  for (auto& t : p)
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = T(0.05 * std::sin(double(i) + 1.0) + offset);
  return p;
}

template <class T>
std::vector<std::vector<T>> gradients(const T* w, const T* b, const batch_data& d) {
  return model.gradients(w, b, d);
}

template <class Strategy>
void train(Strategy& s, const std::vector<batch_data>& data, std::size_t from, std::size_t to) {
  for (std::size_t k = from; k < to; ++k) {
    auto p = s.parameters();
    s.step(gradients(p[0].data(), p[1].data(), data[k]));
  }
}

// Every saved byte of a strategy (parameters, optimizer buffers, counters), for bitwise comparison.
template <class Strategy>
std::vector<unsigned char> image(const Strategy& s) {
  using V = typename Strategy::value_type;
  std::vector<unsigned char> out;
  auto add = [&](const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    out.insert(out.end(), c, c + n);
  };
  for (std::size_t i = 0; i < s.parameters().size(); ++i) {
    add(s.parameters()[i].data(), s.parameters()[i].size() * sizeof(V));
    s.optimizer_states()[i].for_each_buffer([&](std::span<const V> b) { add(b.data(), b.size_bytes()); });
    s.optimizer_states()[i].for_each_counter([&](const long& c) { add(&c, sizeof c); });
  }
  return out;
}

// A fresh directory per test, removed afterwards.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    path = fs::temp_directory_path() /
           ("gradwire_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T, class Optimizer>
void check_round_trip_and_resume(const Optimizer& opt, const fs::path& file) {
  using S = gw::one_device<gw::host_tensor<T>, Optimizer>;
  constexpr std::size_t saved_at = 3, steps = 7;
  const auto data = make_data(steps);

  S uninterrupted(make_params<T>(0.0), opt);
  train(uninterrupted, data, 0, saved_at);
  gw::save_checkpoint(file, uninterrupted, saved_at);

  S resumed(make_params<T>(1.0), opt);  // starts elsewhere, with fresh optimizer state
  REQUIRE(image(resumed) != image(uninterrupted));
  REQUIRE(gw::load_checkpoint(file, resumed) == saved_at);
  REQUIRE(image(resumed) == image(uninterrupted));  // parameters, every buffer, every counter
  if constexpr (requires { uninterrupted.optimizer_states()[0].step; })
    REQUIRE(resumed.optimizer_states()[1].step == long(saved_at));

  train(uninterrupted, data, saved_at, steps);
  train(resumed, data, saved_at, steps);
  REQUIRE(image(resumed) == image(uninterrupted));  // bit for bit, not approximately
}

using adam_strategy = gw::one_device<gw::host_tensor<float>, gw::optim::adam>;

// A valid adam checkpoint of a model trained 2 steps.
adam_strategy saved_model(const fs::path& file, std::uint64_t step = 2) {
  adam_strategy s(make_params<float>(0.0), gw::optim::adam({.lr = 0.01}));
  train(s, make_data(2), 0, 2);
  gw::save_checkpoint(file, s, step);
  return s;
}

void require_refused(const std::pair<gw::errc, std::string>& e, const fs::path& file, const std::string& says) {
  CAPTURE(e.second);
  REQUIRE(e.first == gw::errc::config);
  REQUIRE_THAT(e.second, Catch::Contains(file.string()) && Catch::Contains(says));
}
}  // namespace

static_assert(gw::concepts::checkpointable_optimizer<gw::optim::sgd, float>);
static_assert(gw::concepts::checkpointable_optimizer<gw::optim::momentum, double>);
static_assert(gw::concepts::checkpointable_optimizer<gw::optim::adam, float>);
static_assert(gw::concepts::checkpointable_optimizer<gw::optim::adamw, double>);
static_assert(gw::concepts::checkpointable_optimizer<gw::optim::one_of<gw::optim::sgd, gw::optim::adam>, float>);

TEST_CASE("checkpoint round trip is bit-identical and resumed training equals uninterrupted training") {
  scratch_dir dir;
  const auto file = dir.path / "model.ckpt";
  SECTION("sgd, float") { check_round_trip_and_resume<float>(gw::optim::sgd({.lr = 0.1, .weight_decay = 0.01}), file); }
  SECTION("sgd, double") { check_round_trip_and_resume<double>(gw::optim::sgd({.lr = 0.1}), file); }
  SECTION("momentum (Nesterov), float") {
    check_round_trip_and_resume<float>(gw::optim::momentum({.lr = 0.05, .momentum = 0.9, .nesterov = true}), file);
  }
  SECTION("momentum, double") { check_round_trip_and_resume<double>(gw::optim::momentum({.lr = 0.05}), file); }
  SECTION("adam, float") { check_round_trip_and_resume<float>(gw::optim::adam({.lr = 0.01}), file); }
  SECTION("adam, double") { check_round_trip_and_resume<double>(gw::optim::adam({.lr = 0.01}), file); }
  SECTION("adamw, float") { check_round_trip_and_resume<float>(gw::optim::adamw({.lr = 0.01}), file); }
  SECTION("adamw, double") { check_round_trip_and_resume<double>(gw::optim::adamw({.lr = 0.01}), file); }
}

TEST_CASE("an optimizer chosen at run time (optim::one_of) checkpoints under the chosen optimizer's name") {
  scratch_dir dir;
  const auto file = dir.path / "model.ckpt";
  using choice = gw::optim::one_of<gw::optim::sgd, gw::optim::adam, gw::optim::adamw>;
  using chosen_strategy = gw::one_device<gw::host_tensor<float>, choice>;
  SECTION("round trips and resumes as the optimizer itself does") {
    check_round_trip_and_resume<float>(choice(gw::optim::adam({.lr = 0.01})), file);
    check_round_trip_and_resume<double>(choice(gw::optim::sgd({.lr = 0.1})), file);
  }
  SECTION("a file saved with adam loads into a one_of holding adam, and back") {
    const auto saved = image(saved_model(file));
    chosen_strategy chosen(make_params<float>(1.0), choice(gw::optim::adam({.lr = 0.01})));
    REQUIRE(gw::load_checkpoint(file, chosen) == 2);
    REQUIRE(image(chosen) == saved);
    gw::save_checkpoint(file, chosen, 3);
    adam_strategy plain(make_params<float>(2.0), gw::optim::adam({.lr = 0.01}));
    REQUIRE(gw::load_checkpoint(file, plain) == 3);
    REQUIRE(image(plain) == saved);
  }
  SECTION("a one_of holding another optimizer refuses it, naming both") {
    saved_model(file);
    chosen_strategy adamw(make_params<float>(1.0), choice(gw::optim::adamw()));
    const auto before = image(adamw);
    require_refused(error_of([&] { gw::load_checkpoint(file, adamw); }), file,
                    "saved with optimizer 'adam', the strategy uses 'adamw'");
    REQUIRE(image(adamw) == before);
    chosen_strategy sgd(make_params<float>(1.0), choice(gw::optim::sgd()));
    gw::save_checkpoint(file, sgd);
    adam_strategy plain(make_params<float>(1.0));
    require_refused(error_of([&] { gw::load_checkpoint(file, plain); }), file,
                    "saved with optimizer 'sgd', the strategy uses 'adam'");
  }
}

TEST_CASE("checkpoint saved by rank 0 and loaded on every rank resumes mirrored training exactly") {
  scratch_dir dir;
  const auto file = dir.path / "mirrored.ckpt";
  using S = gw::mirrored<gw::host_tensor<double>, gw::optim::adam>;
  constexpr int ranks = 2;
  constexpr std::size_t saved_at = 2, steps = 5;
  std::vector<std::vector<batch_data>> data;  // [rank][step]
  for (int r = 0; r < ranks; ++r) data.push_back(make_data(steps));
  const gw::optim::adam opt({.lr = 0.01});

  std::vector<std::vector<unsigned char>> uninterrupted(ranks), resumed(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    S s(t, make_params<double>(0.0), opt);
    train(s, data[t.rank()], 0, saved_at);
    if (s.rank() == 0) gw::save_checkpoint(file, s, saved_at);
    train(s, data[t.rank()], saved_at, steps);
    uninterrupted[t.rank()] = image(s);
  });
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    S s(t, make_params<double>(5.0 + t.rank()), opt);
    REQUIRE(gw::load_checkpoint(file, s) == saved_at);
    train(s, data[t.rank()], saved_at, steps);
    resumed[t.rank()] = image(s);
  });
  REQUIRE(uninterrupted[0] == uninterrupted[1]);
  REQUIRE(resumed[0] == uninterrupted[0]);
  REQUIRE(resumed[1] == uninterrupted[1]);
}

TEST_CASE("load_checkpoint refuses bad files with a config error naming the file, and leaves the model alone") {
  scratch_dir dir;
  const auto file = dir.path / "model.ckpt";
  const auto saved = image(saved_model(file));
  const auto good = read_file(file);
  adam_strategy target(make_params<float>(1.0), gw::optim::adam());
  const auto before = image(target);
  auto load = [&] { return error_of([&] { gw::load_checkpoint(file, target); }); };

  SECTION("a missing file") {
    fs::remove(file);
    require_refused(load(), file, "no such file");
  }
  SECTION("one corrupt byte in the data: checksum") {
    auto bad = good;
    bad[good.size() / 2] ^= 0x10;
    write_file(file, bad);
    require_refused(load(), file, "checksum mismatch (CRC-32C)");
  }
  SECTION("any one corrupt byte anywhere is refused") {
    for (std::size_t i = 0; i < good.size(); ++i) {
      CAPTURE(i);
      auto bad = good;
      bad[i] ^= 0x01;
      write_file(file, bad);
      REQUIRE(load().first == gw::errc::config);
    }
  }
  SECTION("a truncated file") {
    for (std::size_t keep : {good.size() - 1, good.size() - 4, good.size() / 2, std::size_t{40}, std::size_t{20},
                             std::size_t{3}, std::size_t{0}}) {
      CAPTURE(keep);
      write_file(file, std::vector<char>(good.begin(), good.begin() + std::ptrdiff_t(keep)));
      require_refused(load(), file, "truncated");
    }
  }
  SECTION("bytes appended") {
    auto longer = good;
    longer.push_back(0);
    write_file(file, longer);
    require_refused(load(), file, "truncated or corrupt");
  }
  SECTION("not a checkpoint") {
    write_file(file, std::vector<char>(100, 'x'));
    require_refused(load(), file, "not a gradwire checkpoint");
  }
  SECTION("another format version") {
    auto other = good;
    other[4] = 3;  // version u16 at offset 4 (2 is version 1 with an aggregation's state: test_diloco_checkpoint)
    write_file(file, other);
    require_refused(load(), file, "format version 3, but this gradwire reads versions 1 and 2");
  }
  SECTION("another optimizer") {
    gw::one_device<gw::host_tensor<float>, gw::optim::adamw> adamw(make_params<float>(1.0));
    require_refused(error_of([&] { gw::load_checkpoint(file, adamw); }), file,
                    "saved with optimizer 'adam', the strategy uses 'adamw'");
    gw::one_device<gw::host_tensor<float>, gw::optim::momentum> momentum(make_params<float>(1.0));
    require_refused(error_of([&] { gw::load_checkpoint(file, momentum); }), file,
                    "saved with optimizer 'adam', the strategy uses 'momentum'");
  }
  SECTION("another dtype") {
    gw::one_device<gw::host_tensor<double>, gw::optim::adam> wide(make_params<double>(1.0));
    require_refused(error_of([&] { gw::load_checkpoint(file, wide); }), file, "saved with dtype f32, the model is f64");
  }
  SECTION("another number of tensors") {
    adam_strategy more(make_params<float>(1.0, outputs, true));
    require_refused(error_of([&] { gw::load_checkpoint(file, more); }), file, "checkpoint has 2 tensors, the model 3");
  }
  SECTION("a checkpoint of a model with more tensors than this one") {
    // The other direction: the first tensors match, so only the count can refuse it.
    adam_strategy bigger(make_params<float>(0.0, outputs, true), gw::optim::adam({.lr = 0.01}));
    gw::save_checkpoint(file, bigger, 2);
    require_refused(load(), file, "checkpoint has 3 tensors, the model 2");
  }
  SECTION("another tensor size") {
    adam_strategy wider(make_params<float>(1.0, outputs + 1));
    require_refused(error_of([&] { gw::load_checkpoint(file, wider); }), file,
                    "tensor 1 has 3 elements in the checkpoint, 4 in the model");
  }
  REQUIRE(image(target) == before);  // every refusal came before a byte was loaded
  // The good file still loads after all that.
  write_file(file, good);
  REQUIRE(gw::load_checkpoint(file, target) == 2);
  REQUIRE(image(target) == saved);
}

namespace {
// An adam strategy whose checkpoint file is rewritten between load_checkpoint's two passes:
// the checksum pass reads through the const accessors, the pass that reads into the model
// through the mutable ones, so `rewrite` runs after the first pass and before the second.
struct rewritten_during_load {
  using value_type = adam_strategy::value_type;
  using optimizer_type = adam_strategy::optimizer_type;
  adam_strategy& model;
  std::function<void()> rewrite;
  auto parameters() {
    if (rewrite) std::exchange(rewrite, nullptr)();
    return model.parameters();
  }
  auto parameters() const { return std::as_const(model).parameters(); }
  auto optimizer_states() { return model.optimizer_states(); }
  auto optimizer_states() const { return std::as_const(model).optimizer_states(); }
};
}  // namespace

TEST_CASE("a checkpoint rewritten while it loads is refused as changed, not loaded as it was") {
  scratch_dir dir;
  const auto file = dir.path / "model.ckpt";
  const auto saved = image(saved_model(file, 5));
  const auto good = read_file(file);
  adam_strategy target(make_params<float>(1.0), gw::optim::adam());
  // Sixteen data bytes (the trailing checksum left alone): whether a rewritten file's CRC is
  // above or below the original's is a coin toss, so one flip would not tell '!=' from '<'.
  for (std::size_t k = 0; k < 16; ++k) {
    const std::size_t at = good.size() - 5 - 8 * k;
    CAPTURE(at);
    rewritten_during_load racing{target, [&] {
                                   auto changed = good;
                                   changed[at] ^= 0x20;
                                   write_file(file, changed);  // same inode, same size: the open file sees it
                                 }};
    const auto e = error_of([&] { gw::load_checkpoint(file, racing); });
    CAPTURE(e.second);
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Catch::Contains(file.string()) && Catch::Contains("the file changed while it was being loaded"));
    write_file(file, good);
  }
  rewritten_during_load untouched{target, nullptr};
  REQUIRE(gw::load_checkpoint(file, untouched) == 5);
  REQUIRE(image(target) == saved);
}

TEST_CASE("saving replaces a checkpoint atomically: a failed or interrupted save keeps the previous one") {
  scratch_dir dir;
  const auto file = dir.path / "model.ckpt";
  const auto first = image(saved_model(file, 10));
  const auto tmp = fs::path(file.string() + ".tmp." + std::to_string(::getpid()));
  adam_strategy target(make_params<float>(1.0));

  SECTION("a stale temporary file from a crashed save is ignored by load and overwritten by the next save") {
    write_file(tmp, std::vector<char>(17, 'z'));  // a save killed half-way through
    write_file(fs::path(file.string() + ".tmp.999999"), std::vector<char>(5, 'z'));
    REQUIRE(gw::load_checkpoint(file, target) == 10);
    REQUIRE(image(target) == first);
    train(target, make_data(1), 0, 1);
    gw::save_checkpoint(file, target, 11);
    REQUIRE_FALSE(fs::exists(tmp));  // renamed into place
    adam_strategy again(make_params<float>(2.0));
    REQUIRE(gw::load_checkpoint(file, again) == 11);
    REQUIRE(image(again) == image(target));
  }
  SECTION("a save that cannot write its temporary file fails and leaves the old checkpoint intact") {
    fs::create_directory(tmp);  // open(O_WRONLY) on a directory fails, even as root
    adam_strategy other(make_params<float>(3.0));
    const auto e = error_of([&] { gw::save_checkpoint(file, other, 99); });
    CAPTURE(e.second);
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Catch::Contains(tmp.string()) && Catch::Contains("cannot create the temporary file"));
    REQUIRE(gw::load_checkpoint(file, target) == 10);
    REQUIRE(image(target) == first);
  }
  SECTION("a save that cannot rename its file into place fails naming both, and removes its temporary file") {
    const auto occupied = dir.path / "taken.ckpt";
    fs::create_directory(occupied);  // rename() of a file over a directory fails (EISDIR)
    const auto its_tmp = fs::path(occupied.string() + ".tmp." + std::to_string(::getpid()));
    const auto e = error_of([&] { gw::save_checkpoint(occupied, target, 12); });
    CAPTURE(e.second);
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Catch::Contains(occupied.string()) && Catch::Contains("cannot rename") &&
                               Catch::Contains(its_tmp.string()));
    REQUIRE_FALSE(fs::exists(its_tmp));
    REQUIRE(fs::is_directory(occupied));
  }
  SECTION("a save into a missing directory says so") {
    const auto nowhere = dir.path / "missing" / "model.ckpt";
    const auto e = error_of([&] { gw::save_checkpoint(nowhere, target); });
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Catch::Contains(nowhere.string()) && Catch::Contains("directory exists"));
  }
}
