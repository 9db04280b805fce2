// DiLoCo's checkpoints: the anchor, the outer state and the pending fragments saved per rank, restored bit for bit (inproc, asio_tcp); refusals.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <gradwire/checkpoint.hpp>
#include <gradwire/compress/int8.hpp>
#include <gradwire/gradwire.hpp>
#include <gradwire/strategies/diloco.hpp>
#include <gradwire/strategies/local_sgd.hpp>
#include <gradwire/strategies/one_device.hpp>
#include <gradwire/transport/local.hpp>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/diloco_support.hpp"
#include "helpers/errors.hpp"
#if GRADWIRE_HAS_ASIO
#include "helpers/tcp_threads.hpp"
#endif

namespace gw = gradwire;
namespace agg = gw::aggregation;
namespace fs = std::filesystem;
using namespace gradwire::testing::diloco;  // the model, its data, each rank's parameters
using gw::testing::error_of;
using gw::testing::outcome;
using gw::testing::outcome_of;

namespace {
using inner = gw::optim::adamw;  // state of its own per replica (moments, a step count): it must come back too
const inner inner_optimizer({.lr = 0.02});
using data_t = std::vector<std::vector<gradwire::testing::batch_data>>;

// A fresh directory per test, removed afterwards.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    path = fs::temp_directory_path() /
           ("gradwire_diloco_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path file(int rank) const { return path / ("rank" + std::to_string(rank) + ".ckpt"); }
};

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A job of `ranks` ranks, a thread each: inproc, or asio_tcp over loopback.
struct inproc_job {
  using transport = gw::transport::inproc;
  int ranks;
  template <class F>
  void operator()(F&& f) const {
    gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) { f(std::move(t)); });
  }
};
#if GRADWIRE_HAS_ASIO
struct tcp_job {
  using transport = gw::transport::asio_tcp;
  int ranks;
  template <class F>
  void operator()(F&& f) const {
    gw::testing::run_tcp_threads(ranks, "test-diloco-checkpoint", [&](gw::transport::asio_tcp t) { f(std::move(t)); });
  }
};
#endif

// What one run saw on each rank.
struct run_result {
  history_t history;                       // [step][rank]: the parameters after each step it ran
  std::vector<flat_t> flushed, anchor;     // [rank]: after flush() at the end
  std::vector<std::size_t> pending_saved;  // [rank]: updates pending when it saved
  std::vector<std::uint64_t> resumed_at;   // [rank]: the step load_checkpoint returned
};

enum class checkpointing { none, save, resume };

// `steps` steps on every rank of `job`. save: each rank saves its own file after step
// `at` and goes on; resume: fresh strategies (built elsewhere: setup broadcasts other
// parameters) load those files and go on from step `at`.
template <class Strategy, class Job, class Make>
run_result train(const Job& job, const data_t& data, const Make& make, checkpointing ck, int at,
                 const scratch_dir& dir) {
  const auto steps = data.size();
  const auto n = static_cast<std::size_t>(job.ranks);
  run_result out{history_t(steps, std::vector<flat_t>(n)), std::vector<flat_t>(n), std::vector<flat_t>(n),
                 std::vector<std::size_t>(n), std::vector<std::uint64_t>(n)};
  job([&](typename Job::transport t) {
    const int rank = t.rank();
    const auto r = static_cast<std::size_t>(rank);
    Strategy s(std::move(t), make_params(ck == checkpointing::resume ? rank + 5 : rank), inner_optimizer, make());
    std::size_t first = 0;
    if (ck == checkpointing::resume) first = out.resumed_at[r] = gw::load_checkpoint(dir.file(rank), s);
    for (std::size_t k = first; k < steps; ++k) {
      train_step(s, data, k, rank);
      out.history[k][r] = snapshot(s);
      if (ck == checkpointing::save && k + 1 == static_cast<std::size_t>(at)) {
        out.pending_saved[r] = s.aggregation().pending_updates();
        gw::save_checkpoint(dir.file(rank), s, static_cast<std::uint64_t>(at));
      }
    }
    s.flush();
    out.flushed[r] = snapshot(s);
    out.anchor[r].assign(s.aggregation().anchor().begin(), s.aggregation().anchor().end());
  });
  return out;
}

// The same run uninterrupted, checkpointed after step `at` (and going on), and restored from
// those checkpoints: all three agree bit for bit on every step after `at` and after flush().
template <class Strategy, class Job, class Make>
void check_resume(const Job& job, int steps, int at, const Make& make, std::size_t pending_at_save) {
  scratch_dir dir;
  const auto data = make_data(steps, job.ranks);
  const run_result plain = train<Strategy>(job, data, make, checkpointing::none, at, dir);
  const run_result saved = train<Strategy>(job, data, make, checkpointing::save, at, dir);
  const run_result resumed = train<Strategy>(job, data, make, checkpointing::resume, at, dir);
  const auto n = static_cast<std::size_t>(job.ranks);
  // Saved where the brief asks: fragments in flight (waited for by the save) when streamed.
  REQUIRE(saved.pending_saved == std::vector<std::size_t>(n, pending_at_save));
  REQUIRE(resumed.resumed_at == std::vector<std::uint64_t>(n, static_cast<std::uint64_t>(at)));
  REQUIRE(saved.history == plain.history);  // saving changes nothing
  REQUIRE(saved.flushed == plain.flushed);
  for (auto k = static_cast<std::size_t>(at); k < static_cast<std::size_t>(steps); ++k) {
    CAPTURE(k + 1);
    REQUIRE(resumed.history[k] == plain.history[k]);  // every rank, every bit
  }
  REQUIRE(resumed.flushed == plain.flushed);
  REQUIRE(resumed.anchor == plain.anchor);
  // Not vacuous: the anchor moved away from where the restored strategies started.
  REQUIRE(plain.anchor[0] != initial<float>(5));
  REQUIRE(plain.anchor[0] != initial<float>(0));
}

// Strategies left with updates pending warn when they end (test_diloco checks that): not here.
struct quiet_log {
  std::FILE* sink = std::tmpfile();
  quiet_log() { gw::observe::set_log_sink(sink); }
  ~quiet_log() {
    gw::observe::set_log_sink(nullptr);
    if (sink) std::fclose(sink);
  }
};

template <class Transport, class Codec = agg::no_codec>
using diloco_s = gw::diloco<gw::host_tensor<float>, inner, agg::dynamic_period, Transport, Codec>;
}  // namespace

static_assert(gw::concepts::checkpointing_agent<diloco_s<gw::transport::inproc>::agent_type, gw::transport::inproc>);
static_assert(gw::concepts::checkpoint_model_with_agent_state<diloco_s<gw::transport::inproc>>);
// Local SGD keeps nothing beyond the parameters and the optimizer state: its format is unchanged.
static_assert(!gw::concepts::checkpoint_model_with_agent_state<gw::local_sgd<gw::host_tensor<float>, inner, 4>>);

TEST_CASE("DiLoCo restored from per-rank checkpoints goes on bit for bit, streamed fragments in flight included") {
  struct setting {
    int ranks, period, fragments, delay, steps, at;
    std::size_t pending;  // updates pending after step `at`
  };
  // F = 1 saved between two outer steps; F = 4, delay 2, after step 9: fragment 0 (started
  // after 8) and fragment 1 (after 9) in flight; F = 3, delay 3, after step 7: fragment 0
  // (after 6) pending; one rank: pending without any all-reduce.
  const auto c = GENERATE(setting{2, 4, 1, 0, 13, 6, 0}, setting{3, 4, 4, 2, 14, 9, 2}, setting{2, 6, 3, 3, 15, 7, 1},
                          setting{1, 4, 4, 2, 11, 9, 2});
  CAPTURE(c.ranks, c.period, c.fragments, c.delay, c.steps, c.at);
  check_resume<diloco_s<gw::transport::inproc>>(
      inproc_job{c.ranks}, c.steps, c.at,
      [&] { return agg::diloco(c.period, {.fragments = c.fragments, .delay = c.delay}); }, c.pending);
}

TEST_CASE("DiLoCo with int8 pseudo-gradients restored from checkpoints goes on bit for bit") {
  // Fragment 1 of 2 starts after step 6 and lands after 7.
  check_resume<diloco_s<gw::transport::inproc, gw::compress::int8>>(
      inproc_job{3}, 11, 6, [] { return agg::diloco(4, {.fragments = 2, .delay = 1}, gw::compress::int8{}); }, 1);
}

#if GRADWIRE_HAS_ASIO
TEST_CASE("streaming DiLoCo over asio_tcp ranks restored from checkpoints with fragments in flight goes on bit for bit") {
  check_resume<diloco_s<gw::transport::asio_tcp>>(
      tcp_job{3}, 14, 9, [] { return agg::diloco(4, {.fragments = 4, .delay = 2}); }, 2);
}
#endif

TEST_CASE("local SGD's checkpoint keeps format version 1: what a one-device strategy writes for the same state") {
  scratch_dir dir;
  constexpr int ranks = 2, steps = 3;
  const auto data = make_data(steps, ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int rank = t.rank();
    gw::local_sgd<gw::host_tensor<float>, inner, 2> s(t, make_params(rank), inner_optimizer, agg::averaging<2>());
    for (int k = 0; k < steps; ++k) train_step(s, data, static_cast<std::size_t>(k), rank);
    gw::save_checkpoint(dir.file(rank), s, steps);
  });
  for (int rank = 0; rank < ranks; ++rank) {
    CAPTURE(rank);
    const auto bytes = read_file(dir.file(rank));
    REQUIRE(bytes.size() > 8);
    REQUIRE((bytes[4] == 1 && bytes[5] == 0));  // version u16
    // Two tensors, adamw: 2 buffers and 1 counter each; 24 floats of parameters, 48 of moments.
    REQUIRE(bytes.size() == 32 + std::string("adamw").size() + 2 * 3 * 8 + (24 + 48) * 4 + 2 * 8 + 4);
    gw::one_device<gw::host_tensor<float>, inner> one(make_params(7), inner_optimizer);
    REQUIRE(gw::load_checkpoint(dir.file(rank), one) == steps);
    const auto again = dir.path / "again.ckpt";
    gw::save_checkpoint(again, one, steps);
    REQUIRE(read_file(again) == bytes);
  }
}

TEST_CASE("DiLoCo's checkpoints are refused where they do not fit, with a config error naming the file") {
  using one_rank = gw::strategy<gw::host_tensor<float>, inner, agg::diloco_averaging<4>, gw::transport::local>;
  const quiet_log quiet;
  scratch_dir dir;
  const auto file = dir.file(0);
  const auto data = make_data(7, 1);
  auto trained = [&](int fragments) {
    one_rank s(make_params(0), inner_optimizer, agg::diloco<4>({.fragments = fragments, .delay = 2}));
    for (std::size_t k = 0; k < data.size(); ++k) train_step(s, data, k, 0);
    return s;
  };
  auto refused = [&](const std::pair<gw::errc, std::string>& e, const std::string& says) {
    CAPTURE(e.second);
    REQUIRE(e.first == gw::errc::config);
    REQUIRE_THAT(e.second, Catch::Contains(file.string()) && Catch::Contains(says));
  };
  {
    auto s = trained(4);
    REQUIRE(s.aggregation().pending_updates() == 2);  // fragments 2 and 3, started after steps 6 and 7
    gw::save_checkpoint(file, s, 7);
  }
  const auto good = read_file(file);
  REQUIRE((good[4] == 2 && good[5] == 0));  // version 2: with the aggregation's state
  const std::string kind = "averaging (period 4, 4 fragments, delay 2, outer optimizer 'momentum')";

  SECTION("into local SGD, which keeps no such state") {
    gw::strategy<gw::host_tensor<float>, inner, agg::averaging<4>, gw::transport::local> plain(make_params(0),
                                                                                              inner_optimizer);
    refused(error_of([&] { gw::load_checkpoint(file, plain); }),
            "holds the state of an aggregation, " + kind + ", but this strategy's aggregation keeps none");
  }
  SECTION("local SGD's file into DiLoCo") {
    gw::strategy<gw::host_tensor<float>, inner, agg::averaging<4>, gw::transport::local> plain(make_params(0),
                                                                                              inner_optimizer);
    gw::save_checkpoint(file, plain, 1);
    auto s = trained(4);
    refused(error_of([&] { gw::load_checkpoint(file, s); }),
            "holds no aggregation state, but this strategy's aggregation, " + kind + ", keeps some");
  }
  SECTION("into DiLoCo of other settings") {
    auto s = trained(2);
    refused(error_of([&] { gw::load_checkpoint(file, s); }),
            "saved by " + kind + ", this strategy's aggregation is averaging (period 4, 2 fragments, delay 2, outer "
                                 "optimizer 'momentum'); build the strategy with the settings");
  }
  SECTION("into DiLoCo of the same settings but int8 pseudo-gradients") {
    using int8_diloco = agg::diloco_averaging<agg::dynamic_period, gw::compress::int8>;
    gw::strategy<gw::host_tensor<float>, inner, int8_diloco, gw::transport::local> s(
        make_params(0), inner_optimizer, agg::diloco(4, {.fragments = 4, .delay = 2}, gw::compress::int8{}));
    refused(error_of([&] { gw::load_checkpoint(file, s); }),
            "saved by " + kind + ", this strategy's aggregation is averaging (period 4, 4 fragments, delay 2, outer "
                                 "optimizer 'momentum', codec 'int8')");
  }
  SECTION("a corrupt or truncated file, and the strategy is left as it was") {
    auto s = trained(4);
    const flat_t params = snapshot(s);
    const flat_t anchor(s.aggregation().anchor().begin(), s.aggregation().anchor().end());
    const auto pending = s.aggregation().pending_updates();
    for (std::size_t i = 0; i < good.size(); ++i) {
      CAPTURE(i);
      auto bad = good;
      bad[i] ^= 0x01;
      write_file(file, bad);
      REQUIRE(outcome_of([&] { gw::load_checkpoint(file, s); }).kind == gw::errc::config);
    }
    for (std::size_t keep : {good.size() - 1, good.size() - 4, good.size() / 2, std::size_t{100}, std::size_t{40}}) {
      CAPTURE(keep);
      write_file(file, std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep)));
      refused(error_of([&] { gw::load_checkpoint(file, s); }), "truncated");
    }
    REQUIRE(snapshot(s) == params);
    REQUIRE(flat_t(s.aggregation().anchor().begin(), s.aggregation().anchor().end()) == anchor);
    REQUIRE(s.aggregation().pending_updates() == pending);
  }
}

TEST_CASE("a const strategy is not saved while a fragment's all-reduce runs: invalid_argument says what to do") {
  // Fragment 1 of 2 starts after step 2 on the async engine and lands after step 3.
  constexpr int ranks = 2, steps = 4;
  scratch_dir dir;
  const auto data = make_data(steps, ranks);
  std::vector<outcome> const_save(ranks), plain_save(ranks);
  gw::transport::run_inproc(ranks, [&](gw::transport::inproc t) {
    const int rank = t.rank();
    const auto r = static_cast<std::size_t>(rank);
    diloco_s<gw::transport::inproc> s(t, make_params(rank), inner_optimizer, agg::diloco(4, {.fragments = 2, .delay = 1}));
    for (std::size_t k = 0; k < 2; ++k) train_step(s, data, k, rank);
    const_save[r] = outcome_of([&] { gw::save_checkpoint(dir.file(rank), std::as_const(s), 2); });
    plain_save[r] = outcome_of([&] { gw::save_checkpoint(dir.file(rank), s, 2); });  // waits, then saves
    for (std::size_t k = 2; k < steps; ++k) train_step(s, data, k, rank);
    s.flush();
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r, const_save[r].what);
    REQUIRE(const_save[r].kind == gw::errc::invalid_argument);
    REQUIRE_THAT(const_save[r].what, Catch::Contains("a fragment's all-reduce is still running in the background") &&
                                         Catch::Contains("save_checkpoint on a non-const strategy waits for it"));
    REQUIRE_FALSE(plain_save[r].failed());
    REQUIRE(fs::exists(dir.file(r)));
  }
}
