// Live recovery's state transfer (docs/elastic.md §3): how fast a replacement takes parameters and Adam state from the members.
//
//   gradwire-run -n 3 --keep-going --max-restarts 1 -- state_transfer --bytes 1G [--csv FILE]
//
// Every rank holds a float model of --bytes / 12 parameters in 8 tensors, trained with Adam:
// parameters, first and second moments together come to --bytes. The last rank raises
// SIGKILL after step 1; the launcher starts it again (GRADWIRE_REJOIN=1). The members step on
// (each step all-reduces the whole model) until it is taken in, then one step more. The
// replacement then prints what it took, from elastic_all_reduce::last_state_transfer (bytes,
// and the seconds from the first chunk posted to the last one in), with the rate in GB/s,
// the seconds its join took from the start of its strategy's constructor (connect, request,
// the members' step in progress, welcome, transfer). Every rank prints its parameters' hash
// after the replacement's first step (the script checks they are equal). --csv appends a row.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <gradwire/aggregation/elastic_all_reduce.hpp>
#include <gradwire/asio.hpp>
#include <gradwire/gradwire.hpp>
#include <gradwire/support/fnv1a.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gw = gradwire;

namespace {

std::size_t parse_bytes(const std::string& text) {
  std::size_t at = 0;
  const double v = std::stod(text, &at);
  const std::string unit = text.substr(at);
  const double scale = unit == "K" ? 1024.0 : unit == "M" ? 1024.0 * 1024 : unit == "G" ? 1024.0 * 1024 * 1024 : 1.0;
  if (!(v > 0) || (!unit.empty() && unit != "K" && unit != "M" && unit != "G"))
    throw std::invalid_argument("--bytes " + text + ": expected a positive size such as 100M or 1G");
  return static_cast<std::size_t>(v * scale);
}

using strategy_type = gw::strategy<gw::host_tensor<float>, gw::optim::adam, gw::aggregation::elastic_all_reduce, gw::transport::asio_tcp>;

unsigned long long hash_of(const strategy_type& s) {
  gw::support::fnv1a h;
  for (const auto& t : s.parameters()) h.add(std::as_bytes(std::span<const float>(t.data(), t.size())));
  return static_cast<unsigned long long>(h.value());
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = 100u << 20;
  std::string csv;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      if (flag == "--bytes") bytes = parse_bytes(argv[++i]);
      else if (flag == "--csv") csv = argv[++i];
      else throw std::invalid_argument("unknown flag " + flag + " (--bytes SIZE, --csv FILE)");
    }
    const auto began = std::chrono::steady_clock::now();
    gw::transport::asio_tcp t = gw::cluster::join_tcp();
    const int rank = t.rank(), size = t.size();
    const bool replacement = gw::concepts::rejoined(t);
    constexpr std::size_t tensors = 8;
    const std::size_t elements = bytes / 12 / tensors;
    std::vector<gw::host_tensor<float>> params;
    for (std::size_t j = 0; j < tensors; ++j) {
      params.emplace_back(gw::shape{elements});
      std::fill_n(params.back().data(), elements, replacement ? 9.f : 0.25f);
    }
    std::vector<std::vector<float>> grads(tensors, std::vector<float>(elements, 0.f));
    for (std::size_t j = 0; j < tensors; ++j)
      for (std::size_t i = 0; i < elements; i += 4096) grads[j][i] = 0.01f * float(j + 1);  // a sparse nonzero
    const auto joining = std::chrono::steady_clock::now();
    strategy_type s(std::move(t), std::move(params), gw::optim::adam({.lr = 1e-3}));
    const double join_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - joining).count();
    const int victim = size - 1;
    if (replacement) {
      const auto stats = s.aggregation().last_state_transfer();
      s.step(grads);
      std::printf("rank %d: took %.1f MB of state in %.3f s: %.2f GB/s (join %.2f s, since start %.1f s, step %llu)\n",
                  rank, double(stats.bytes) / 1e6, stats.seconds, double(stats.bytes) / stats.seconds / 1e9, join_seconds,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(),
                  static_cast<unsigned long long>(s.aggregation().applying_step()));
      if (!csv.empty())
        std::ofstream(csv, std::ios::app) << bytes << ',' << size << ',' << stats.bytes << ',' << stats.seconds << ','
                                          << double(stats.bytes) / stats.seconds / 1e9 << ',' << join_seconds << '\n';
      std::printf("rank %d: hash %016llx\n", rank, hash_of(s));
      return 0;
    }
    std::uint64_t steps_after_join = 0;
    for (int k = 0;; ++k) {
      s.step(grads);
      if (rank == victim && k == 1) std::raise(SIGKILL);
      if (!s.aggregation().joined_ranks().empty() && ++steps_after_join > 1) break;
      if (k > 10000) throw std::runtime_error("the replacement was never taken in");
    }
    std::printf("rank %d: hash %016llx\n", rank, hash_of(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "state_transfer: %s\n", e.what());
    return 1;
  }
  return 0;
}
