// One rank of a multi-process test, started by scripts/gradwire-run (or mpirun) over loopback TCP, UCX or MPI.
//
//   mp_worker collectives | bucketing | async | train       correctness against float64 references
//   mp_worker kill K | mismatch KIND | wrong-token K | join   failure behaviour
//   mp_worker absent K                                        rank K never starts: the others time out naming it
//   mp_worker abort-heard answers|silent                      an abort reaches a busy peer (UCX: waits for its answer, <= 1 s)
//   mp_worker abort-heard both                                ranks 0 and 1 abort at once (UCX: each answers the other's)
//   mp_worker timeout                                         a receive nobody sends: errc::timeout at its deadline
//   mp_worker stall K STEPS | partition R,...                 stopped ranks, cut-off hosts (see loop_steps)
//   mp_worker_ucx one-sided                                  put / get against values computed from ranks
//
// Every rank prints "rank R: PASS ..." and exits 0 when its part holds, or prints
// "rank R: FAIL ..." / the error (a gradwire::error as "FAIL errc::KIND: what()") and exits 1.
// Failure cases expect a specific error and print "rank R: EXPECTED <errc>: <message>";
// tests/multiprocess/test_multiprocess.py starts the ranks, bounds their time and checks
// what each printed.
#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <gradwire/asio.hpp>
#if GRADWIRE_TEST_UCX
#include <gradwire/ucx.hpp>
#endif
#if GRADWIRE_TEST_PER_PEER
#include <gradwire/cluster/per_peer.hpp>
#endif
#if GRADWIRE_TEST_MPI
#include <gradwire/mpi.hpp>
#endif
#include <gradwire/gradwire.hpp>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlp.hpp"  // examples/fashion_mnist

namespace gw = gradwire;
namespace col = gradwire::collective;
// Built over Boost.Asio TCP (mp_worker) and over UCX (mp_worker_ucx, with GRADWIRE_TEST_UCX;
// UCX_TLS picks shared memory or TCP), each also erased behind transport::any_transport
// (mp_worker_any, mp_worker_any_ucx, with GRADWIRE_TEST_ANY), as a CUDA translation unit
// receives it: asio's fused receive-and-add is forwarded, UCX's messages are staged.
#if GRADWIRE_TEST_PER_PEER
// mp_worker_per_peer: UCX among the ranks of a host (GRADWIRE_HOST_ID or the network
// namespace says which), TCP between hosts.
using direct_transport = gw::transport::per_peer<gw::transport::ucx, gw::transport::asio_tcp>;
direct_transport join_direct(const gw::cluster::overrides& o) { return gw::cluster::join_per_peer(o); }
static_assert(gw::concepts::topology_aware_transport<direct_transport> && gw::concepts::metered_transport<direct_transport>);
#elif GRADWIRE_TEST_MPI
// mp_worker_mpi: started by mpirun; ranks come from MPI (the overrides are the launcher's).
using direct_transport = gw::transport::mpi;
direct_transport join_direct(const gw::cluster::overrides&) { return gw::transport::mpi(); }
#elif GRADWIRE_TEST_UCX
using direct_transport = gw::transport::ucx;
direct_transport join_direct(const gw::cluster::overrides& o) { return gw::cluster::join_ucx(o); }
#else
using direct_transport = gw::transport::asio_tcp;
direct_transport join_direct(const gw::cluster::overrides& o) { return gw::cluster::join_tcp(o); }
// The path these tests must cover over TCP: the ring's fused receive-and-add.
static_assert(gw::concepts::accumulating_transport<direct_transport, float> &&
              gw::concepts::accumulating_transport<direct_transport, double>);
#endif
#if GRADWIRE_TEST_ANY
using transport_type = gw::transport::any_transport;
#else
using transport_type = direct_transport;
#endif
transport_type join(const gw::cluster::overrides& o = {}) { return join_direct(o); }
using comm_type = col::communicator<transport_type>;
// Mismatch reports must reach every rank.
static_assert(gw::concepts::failable_transport<transport_type>);

namespace {

int my_rank = -1;

// The errc's enumerator, as the tests name it ("config", "peer_lost").
const char* errc_name(gw::errc kind) {
  switch (kind) {
    case gw::errc::timeout: return "timeout";
    case gw::errc::peer_lost: return "peer_lost";
    case gw::errc::mismatch: return "mismatch";
    case gw::errc::protocol: return "protocol";
    case gw::errc::auth: return "auth";
    case gw::errc::config: return "config";
    case gw::errc::invalid_argument: return "invalid_argument";
    case gw::errc::device: return "device";
  }
  return "unknown";
}

[[noreturn]] void fail(const std::string& what) {
  std::printf("rank %d: FAIL %s\n", my_rank, what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Rank r's input element i for a run seeded `seed`: every rank can compute every
// rank's inputs, so each computes the float64 reference itself.
template <class V>
V input(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(rank) * 0x9e3779b97f4a7c15ULL + i));
  return static_cast<V>(static_cast<double>(h >> 11) * 0x1p-53 * 2.0 - 1.0);
}

template <class V>
std::vector<V> inputs(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<V> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = input<V>(seed, rank, i);
  return v;
}

template <class V>
double reference_sum(std::uint64_t seed, int ranks, std::size_t i) {
  double s = 0;
  for (int r = 0; r < ranks; ++r) s += static_cast<double>(input<V>(seed, r, i));
  return s;
}

template <class V>
void expect_sum(const std::string& what, std::span<const V> got, std::uint64_t seed, int ranks, std::size_t offset,
                double scale = 1.0) {
  const double tolerance = 4.0 * ranks * ranks * std::numeric_limits<V>::epsilon();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = reference_sum<V>(seed, ranks, offset + i) * scale;
    if (!(std::abs(double(got[i]) - want) <= tolerance))
      fail(what + ": element " + std::to_string(offset + i) + " is " + std::to_string(got[i]) + ", reference " +
           std::to_string(want));
  }
}

// Every rank must hold the same bytes: compare each rank's CRC with rank 0's.
template <class V>
void expect_identical(comm_type& comm, const std::string& what, std::span<const V> data) {
  std::vector<double> crc{double(gw::support::crc32c(std::as_bytes(data)))};
  std::vector<double> root = crc;
  col::broadcast(comm, std::span<double>(root), 0);
  if (root != crc) fail(what + ": result differs from rank 0's (not bit-identical)");
}

std::uint64_t shared_seed(comm_type& comm) {
  std::vector<double> seed{comm.rank() == 0 ? double(std::random_device{}() & 0xffffffu) : 0.0};
  col::broadcast(comm, std::span<double>(seed), 0);
  return static_cast<std::uint64_t>(seed[0]);
}

template <class V>
void check_collectives(comm_type& comm, std::uint64_t seed) {
  const int n = comm.size(), me = comm.rank();
  const char* type = sizeof(V) == 4 ? "float" : "double";
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000003}}) {
    const std::string at = std::string(type) + " count " + std::to_string(count);
    auto run = [&](auto algorithm, const char* name) {
      using A = decltype(algorithm);
      auto v = inputs<V>(seed, me, count);
      col::all_reduce<A>(comm, std::span<V>(v));
      expect_sum<V>(std::string("all_reduce<") + name + "> " + at, v, seed, n, 0);
      expect_identical<V>(comm, std::string("all_reduce<") + name + "> " + at, v);
    };
    run(col::ring{}, "ring");
    run(col::halving_doubling{}, "halving_doubling");
    run(col::hierarchical{}, "hierarchical");  // the flat ring where all ranks share a host
    run(col::auto_{}, "auto");

    auto avg = inputs<V>(seed, me, count);
    col::all_reduce(comm, std::span<V>(avg), col::reduce_op::average);
    expect_sum<V>("all_reduce average " + at, avg, seed, n, 0, 1.0 / n);

    // broadcast from the last rank
    auto b = me == n - 1 ? inputs<V>(seed, n - 1, count) : std::vector<V>(count, V(-7));
    col::broadcast(comm, std::span<V>(b), n - 1);
    if (b != inputs<V>(seed, n - 1, count)) fail("broadcast " + at + " from rank " + std::to_string(n - 1));

    // reduce_scatter: this rank's chunk holds the sum
    auto rs = inputs<V>(seed, me, count);
    const std::span<V> mine = col::reduce_scatter(comm, std::span<V>(rs));
    const std::size_t offset = mine.empty() ? 0 : static_cast<std::size_t>(mine.data() - rs.data());
    expect_sum<V>("reduce_scatter " + at, mine, seed, n, offset);

    // all_gather: each rank contributes its chunk of rank-specific values
    std::vector<V> ag(count, V(-1));
    auto offset_of = [&](std::span<V> c) { return c.empty() ? 0 : static_cast<std::size_t>(c.data() - ag.data()); };
    auto own = col::chunk_of(std::span<V>(ag), n, me);
    for (std::size_t i = 0; i < own.size(); ++i) own[i] = input<V>(seed, me, offset_of(own) + i);
    col::all_gather(comm, std::span<V>(ag));
    for (int r = 0; r < n; ++r) {
      auto theirs = col::chunk_of(std::span<V>(ag), n, r);
      for (std::size_t i = 0; i < theirs.size(); ++i)
        if (theirs[i] != input<V>(seed, r, offset_of(theirs) + i))
          fail("all_gather " + at + ": element " + std::to_string(offset_of(theirs) + i) + " from rank " +
               std::to_string(r));
    }
  }
  col::barrier(comm);
}

void collectives(comm_type& comm) {
  // What the multi-host tests assert (which ranks the transport saw on this rank's host).
  std::printf("rank %d: topology hosts=%d local_rank=%d local_size=%d\n", comm.rank(), comm.host_count(),
              comm.local_rank(), comm.local_size());
  std::fflush(stdout);
  const auto seed = shared_seed(comm);
  check_collectives<float>(comm, seed);
  check_collectives<double>(comm, seed + 1);
  std::printf("rank %d: PASS collectives (seed %llu)\n", comm.rank(), static_cast<unsigned long long>(seed));
}

// 50 tensors of mixed sizes (0 and larger than a bucket among them) through small buckets.
void bucketing(comm_type& comm) {
  const auto seed = shared_seed(comm);
  std::mt19937 sizes_rng(static_cast<unsigned>(seed));
  std::vector<std::vector<float>> tensors(50);
  std::size_t offset = 0;
  std::vector<std::size_t> offsets;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::size_t count = t == 3 ? 0 : t == 7 ? 70000 : sizes_rng() % 5000;
    tensors[t].resize(count);
    for (std::size_t i = 0; i < count; ++i) tensors[t][i] = input<float>(seed, comm.rank(), offset + i);
    offsets.push_back(offset);
    offset += count;
  }
  std::vector<std::span<float>> spans(tensors.begin(), tensors.end());
  col::bucket_buffer buffer(64 << 10);  // 64 KiB buckets: many buckets, one tensor larger than a bucket
  col::bucketed_all_reduce(comm, std::span<const std::span<float>>(spans), buffer);
  for (std::size_t t = 0; t < tensors.size(); ++t)
    expect_sum<float>("bucketed tensor " + std::to_string(t), tensors[t], seed, comm.size(), offsets[t]);
  std::printf("rank %d: PASS bucketing (50 tensors, %zu elements)\n", comm.rank(), offset);
}

// Several all-reduces in flight at once on the background engine.
void async(comm_type& comm) {
  const auto seed = shared_seed(comm);
  std::vector<std::vector<float>> buffers;
  for (int k = 0; k < 6; ++k) buffers.push_back(inputs<float>(seed + k, comm.rank(), 100000 + 1000 * k));
  {
    col::async_engine engine(comm);
    std::vector<col::async_handle> handles;
    for (auto& b : buffers) handles.push_back(col::async_all_reduce(engine, std::span<float>(b)));
    for (auto& h : handles) h.wait(gw::clock::now() + std::chrono::seconds(60));
  }
  for (int k = 0; k < 6; ++k) expect_sum<float>("async buffer " + std::to_string(k), buffers[k], seed + k, comm.size(), 0);
  std::printf("rank %d: PASS async\n", comm.rank());
}

template <class T>
std::vector<std::vector<T>> snapshot(fashion_mnist::mlp<T>& m) {
  std::vector<std::vector<T>> out;
  for (const auto& v : m.parameter_views()) out.emplace_back(v.data(), v.data() + v.size());
  return out;
}

// multi_worker_mirrored (N processes x batch b) reaches the weights of one_device with
// batch N*b, which every rank computes itself on the same generated data. Returns the
// largest relative difference of a tensor (max |a-b| / max |b|).
template <class T, class Optimizer, class Aggregation = gw::aggregation::all_reduce>
double train_and_compare(transport_type transport, const Optimizer& opt, Aggregation aggregation = Aggregation(),
                         int source = 0) {
  using fashion_mnist::mlp;
  const int n = transport.size(), me = transport.rank(), steps = 5;
  const Eigen::Index batch = 8;
  const fashion_mnist::layer_sizes sizes{};
  const std::uint64_t seed = 11;
  // Generated samples, the same on every rank.
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_real_distribution<double> pixel(0.0, 1.0);
  std::uniform_int_distribution<int> label(0, static_cast<int>(sizes.classes) - 1);
  typename mlp<T>::matrix x(sizes.input, batch * n * steps);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<T>(pixel(rng));
  std::vector<int> y(static_cast<std::size_t>(x.cols()));
  for (int& l : y) l = label(rng);
  auto labels = [&](Eigen::Index first, Eigen::Index count) {
    return std::span<const int>(y).subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(count));
  };

  mlp<T> reference(sizes, seed);
  {
    gw::one_device<gw::tensor_view<T>, Optimizer> one(reference.parameter_views(), opt);
    auto g = reference.gradient_views();
    for (int s = 0; s < steps; ++s) {
      reference.loss_and_gradient(x.middleCols(s * batch * n, batch * n), labels(s * batch * n, batch * n));
      one.step(g);
    }
  }
  // Only `source` (whose weights the strategy's setup broadcasts) starts from the
  // reference's weights: the others must receive them.
  mlp<T> model(sizes, me == source ? seed : seed + 100 + me);
  gw::strategy<gw::tensor_view<T>, Optimizer, Aggregation, transport_type> strategy(
      std::move(transport), model.parameter_views(), opt, std::move(aggregation));
  auto g = model.gradient_views();
  for (int s = 0; s < steps; ++s) {
    const Eigen::Index first = s * batch * n + me * batch;
    model.loss_and_gradient(x.middleCols(first, batch), labels(first, batch));
    strategy.step(g);
  }
  const auto a = snapshot(model), b = snapshot(reference);
  double worst = 0;
  for (std::size_t t = 0; t < a.size(); ++t) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a[t].size(); ++i) {
      diff = std::max(diff, std::abs(double(a[t][i]) - double(b[t][i])));
      scale = std::max(scale, std::abs(double(b[t][i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

void train(const std::string& optimizer) {
  auto transport = join();
  const int rank = transport.rank(), rank_count = transport.size();
  double error = 0;
  if (optimizer == "sgd")
    error = train_and_compare<float>(std::move(transport), gw::optim::sgd({.lr = 0.1}));
  else if (optimizer == "momentum")
    error = train_and_compare<float>(std::move(transport), gw::optim::momentum({.lr = 0.05, .momentum = 0.9}));
  else if (optimizer == "adam")  // in double: float Adam amplifies rounding by lr/eps (see the inproc test)
    error = train_and_compare<double>(std::move(transport), gw::optim::adam({.lr = 1e-3}));
  else if (optimizer == "central-momentum")  // central_storage over TCP, owned by the last rank
    error = train_and_compare<float>(std::move(transport), gw::optim::momentum({.lr = 0.05, .momentum = 0.9}),
                                     gw::aggregation::central(rank_count - 1), rank_count - 1);
  else if (optimizer == "local-sgd")  // local_sgd<1> with plain SGD is synchronous SGD
    error = train_and_compare<float>(std::move(transport), gw::optim::sgd({.lr = 0.1}), gw::aggregation::averaging<1>());
  else
    fail("unknown optimizer " + optimizer);
  if (!(error <= 1e-5)) fail("train " + optimizer + ": max relative error " + std::to_string(error));
  std::printf("rank %d: PASS train %s (max relative error %.3g)\n", rank, optimizer.c_str(), error);
}

// --- ordering events between ranks without the transport ------------------------------

// A channel between ranks 0 and 1 beside the transport: files in a directory that rank 0
// makes and names to rank 1 (over the transport, before the events to order). A rank
// signals an event by writing a file; the other waits for it, polling, with a limit. The
// tests use it where the transport itself must stay idle (a rank that is "busy", messages
// that must arrive before their receives are posted), instead of a sleep. Once built, rank
// 0 is out of the transport: rank 1 waits until rank 0's send of the name has returned
// (a UCX send may return well after its message arrived, the sender progressing meanwhile).
class sideband {
 public:
  static constexpr std::uint64_t tag = 7777;
  explicit sideband(transport_type& t) {
    std::array<char, 256> name{};
    const auto until = gw::clock::now() + std::chrono::seconds(30);
    if (t.rank() == 0) {
      char pattern[] = "/tmp/gw-sideband-XXXXXX";
      if (!::mkdtemp(pattern)) fail("sideband: mkdtemp failed");
      dir_ = pattern;
      std::strncpy(name.data(), pattern, name.size() - 1);
      auto s = t.async_send(1, tag, std::as_bytes(std::span(name)));
      t.wait(s, until);
      signal("rank 0 left the transport");
    } else if (t.rank() == 1) {
      auto r = t.async_recv(0, tag, std::as_writable_bytes(std::span(name)));
      t.wait(r, until);
      dir_ = name.data();
      await("rank 0 left the transport");
    }
  }
  // Writes `event` (with `text`) whole: written aside, then renamed into place.
  void signal(const std::string& event, const std::string& text = "") const {
    const std::string path = dir_ + "/" + event;
    {
      std::ofstream f(path + ".part");
      f << text;
      if (!f) fail("sideband: cannot write " + path);
    }
    std::filesystem::rename(path + ".part", path);
  }
  // Waits until the other rank signalled `event` (FAIL after `limit`); returns its text.
  std::string await(const std::string& event, std::chrono::milliseconds limit = std::chrono::seconds(30)) const {
    const std::string path = dir_ + "/" + event;
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (!std::filesystem::exists(path)) {
      if (std::chrono::steady_clock::now() > give_up)
        fail("sideband: '" + event + "' was not signalled within " + std::to_string(limit.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a bounded poll of the file
    }
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    return text.str();
  }
  // By the rank that uses the channel last.
  void remove() const {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

 private:
  std::string dir_;
};

// CLOCK_MONOTONIC in seconds: one clock for every process of this machine.
double monotonic_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes that this process's kernel holds unread on its connected TCP sockets: for
// asio_tcp, what peers sent that the transport has not read yet (on loopback, what was
// written reaches the receiving socket's queue at once).
std::size_t kernel_unread_bytes() {
  std::size_t total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int type = 0, listening = 0, unread = 0;
    socklen_t length = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) continue;
    length = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || listening) continue;
    if (::ioctl(fd, FIONREAD, &unread) == 0 && unread > 0) total += static_cast<std::size_t>(unread);
  }
  return total;
}

// Over asio_tcp: waits (polling, at most 30 s) until the kernel holds at least `bytes`
// unread from the peers. Other transports keep arrivals where a test cannot look.
void await_kernel_bytes([[maybe_unused]] std::size_t bytes, [[maybe_unused]] const std::string& what) {
  if constexpr (std::is_same_v<direct_transport, gw::transport::asio_tcp>) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::size_t have = 0;
    while ((have = kernel_unread_bytes()) < bytes) {
      if (std::chrono::steady_clock::now() > give_up)
        fail(what + ": the kernel holds " + std::to_string(have) + " unread bytes, not the " + std::to_string(bytes) +
             " expected");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a bounded poll of the socket queues
    }
  }
}

// --- failure behaviour ---------------------------------------------------------------

// Runs fn; it must throw gradwire::error of kind `want` whose message contains every
// string of `must_name`. Prints EXPECTED and goes on if so.
void expect_error_no_exit(gw::errc want, std::vector<std::string> must_name, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const gw::error& e) {
    const std::string what = e.what();
    for (const auto& s : must_name)
      if (what.find(s) == std::string::npos) fail("'" + s + "' missing from: " + what);
    if (e.kind() != want) fail("unexpected error: " + what);
    std::printf("rank %d: EXPECTED %s: %s\n", my_rank, gw::make_error_code(e.kind()).message().c_str(), what.c_str());
    std::fflush(stdout);
    return;
  }
  fail("no error was raised");
}

// Runs fn; it must throw gradwire::error of kind `want` (or `also`) whose message
// contains every string of `must_name`. Prints EXPECTED and exits 0 if so.
void expect_error(gw::errc want, std::vector<std::string> must_name, const std::function<void()>& fn,
                  std::optional<gw::errc> also = std::nullopt) {
  try {
    fn();
  } catch (const gw::error& e) {
    const std::string what = e.what();
    bool named = true;
    for (const auto& s : must_name) named = named && what.find(s) != std::string::npos;
    if ((e.kind() == want || e.kind() == also) && named) {
      std::printf("rank %d: EXPECTED %s: %s\n", my_rank, gw::make_error_code(e.kind()).message().c_str(), what.c_str());
      std::fflush(stdout);
      std::exit(0);
    }
    fail("unexpected error: " + what);
  }
  fail("no error was raised");
}

void kill_rank(comm_type& comm, int victim) {
  std::vector<float> data(1 << 20, 1.0f);  // 4 MiB
  expect_error(gw::errc::peer_lost, {"rank " + std::to_string(victim)}, [&] {
    for (int i = 0;; ++i) {
      if (comm.rank() == victim && i == 3) std::raise(SIGKILL);
      col::all_reduce(comm, std::span<float>(data));
    }
  });
}

// Training steps in a loop for the stall and partition tests, which stop or cut off a
// rank from outside (kill -STOP, a link taken down) while the others are in a step:
//   stall K STEPS     every rank but K: PASS after STEPS steps whose result matches a
//                     float64 reference (K was frozen and continued: the warning was only
//                     a warning), or, with GRADWIRE_STALL_TIMEOUT set, EXPECTED timeout
//                     naming rank K (with GRADWIRE_STEP_TIMEOUT: EXPECTED timeout at the
//                     operation deadline, or peer lost from a rank that reached it first).
//   partition R,..    every rank not listed: EXPECTED peer lost naming the listed ranks
//                     (the test cuts their host off; no step may finish after that).
// Each rank prints its pid and "ready" (and writes the pid to $GW_TEST_PID_DIR/rankR.pid)
// before the first step, and creates $GW_TEST_PID_DIR/rankR.step10 once 10 steps are done,
// so that a test can act mid-run without guessing; steps pause briefly.
// GW_TEST_ELEMENTS (default 4096) sets the gradient's size.
void loop_steps(const std::string& mode, const std::string& arg, const std::string& steps_text) {
  auto transport = join();
  const int me = transport.rank(), n = transport.size();
  const std::size_t count = std::strtoull(std::getenv("GW_TEST_ELEMENTS") ? std::getenv("GW_TEST_ELEMENTS") : "4096", nullptr, 10);
  const int steps = steps_text.empty() ? 1000000 : std::stoi(steps_text);
  const float lr = 0.5f;
  std::vector<float> weights(count, 0.0f), gradient(count);
  gw::strategy<gw::tensor_view<float>, gw::optim::sgd, gw::aggregation::all_reduce, transport_type> strategy(
      std::move(transport), {gw::tensor_view<float>(std::span<float>(weights))}, gw::optim::sgd({.lr = lr}));
  std::printf("rank %d: pid %d ready\n", me, static_cast<int>(getpid()));
  std::fflush(stdout);
  if (const char* dir = std::getenv("GW_TEST_PID_DIR")) {  // for the test, which may see stdout late
    if (std::FILE* f = std::fopen((std::string(dir) + "/rank" + std::to_string(me) + ".pid").c_str(), "w")) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
    }
  }
  std::vector<std::string> names;
  std::vector<int> cut;
  if (mode == "partition") {
    std::size_t at = 0;
    for (std::size_t comma; (comma = arg.find(',', at)) != std::string::npos; at = comma + 1) cut.push_back(std::stoi(arg.substr(at, comma - at)));
    cut.push_back(std::stoi(arg.substr(at)));
    names = {cut.size() > 1 ? "lost ranks " : "lost rank ", "no answer to heartbeats"};
    for (int r : cut) names.push_back(std::to_string(r));
  }
  auto run = [&] {
    for (int s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < count; ++i) gradient[i] = input<float>(static_cast<std::uint64_t>(s), me, i);
      strategy.step(std::vector<std::span<const float>>{std::span<const float>(gradient)});
      if (const char* dir = std::getenv("GW_TEST_PID_DIR"); dir && s + 1 == 10)
        if (std::FILE* f = std::fopen((std::string(dir) + "/rank" + std::to_string(me) + ".step10").c_str(), "w"))
          std::fclose(f);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  if (mode == "partition") {
    if (std::find(cut.begin(), cut.end(), me) != cut.end()) {  // cut off: nothing to check here
      try { run(); } catch (const std::exception&) {}
      std::exit(0);
    }
    // Like expect_error, with the moment of detection (the test compares it with the
    // moment it cut the link; every host shares this machine's clock).
    try {
      run();
    } catch (const gw::error& e) {
      const double at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      const std::string what = e.what();
      for (const auto& want : names)
        if (what.find(want) == std::string::npos) fail("'" + want + "' missing from: " + what);
      if (e.kind() != gw::errc::peer_lost) fail("expected peer_lost: " + what);
      std::printf("rank %d: EXPECTED peer lost at %.3f: %s\n", me, at, what.c_str());
      std::fflush(stdout);
      std::exit(0);
    }
    fail("the steps finished although ranks were cut off");
  }
  const int frozen = std::stoi(arg);
  if (std::getenv("GRADWIRE_STALL_TIMEOUT") && me != frozen)
    expect_error(gw::errc::timeout, {"rank " + std::to_string(frozen) + " stalled"}, run);
  if (std::getenv("GRADWIRE_STEP_TIMEOUT") && me != frozen)  // the strategy left the deadline at its default
    expect_error(gw::errc::timeout, {"before its deadline"}, run, gw::errc::peer_lost);
  run();
  double worst = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int s = 0; s < steps; ++s) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += static_cast<double>(input<float>(static_cast<std::uint64_t>(s), r, i));
      want -= lr * (sum / n);
    }
    worst = std::max(worst, std::abs(weights[i] - want));
  }
  if (!(worst <= 1e-4)) fail("stall: weights differ from the float64 reference by " + std::to_string(worst));
  std::printf("rank %d: PASS stall (%d steps, max abs error %.3g)\n", me, steps, worst);
}

void mismatch(comm_type& comm, const std::string& kind) {
  const int odd = 1;
  if (kind == "count") {
    std::vector<float> v(comm.rank() == odd ? 1001 : 1000, 1.0f);
    expect_error(gw::errc::mismatch, {"count=1001", "count=1000"}, [&] { col::all_reduce(comm, std::span<float>(v)); });
  } else if (kind == "dtype") {
    std::vector<float> f(1000, 1.0f);
    std::vector<double> d(1000, 1.0);
    expect_error(gw::errc::mismatch, {"f32", "f64"}, [&] {
      if (comm.rank() == odd)
        col::all_reduce(comm, std::span<double>(d));
      else
        col::all_reduce(comm, std::span<float>(f));
    });
  } else {  // operation
    std::vector<float> v(1000, 1.0f);
    expect_error(gw::errc::mismatch, {"broadcast", "all_reduce"}, [&] {
      if (comm.rank() == odd)
        col::broadcast(comm, std::span<float>(v), 0);
      else
        col::all_reduce(comm, std::span<float>(v));
    });
  }
}

// Rank 1 fails (an abort) while rank 0 is busy, out of the transport; rank 0 must still
// learn why, not only that rank 1 left. UCX's aborting rank waits for every peer's answer
// (abort seen), at most a second, before it goes on (docs/transports.md); over TCP the
// abort frame waits in rank 0's kernel. Times are CLOCK_MONOTONIC, one clock for both.
//   answers  rank 0 enters the transport once rank 1 has begun to abort (a sideband
//            signal); rank 1 exits at once after its fail(). Rank 1 prints when its
//            abort began and returned, rank 0 when it began listening: over UCX the
//            abort returned after rank 0 began listening, well within the second.
//   silent   rank 0 stays out of the transport until rank 1's fail() has returned (a
//            sideband signal), so nobody answers: over UCX the abort gives up waiting
//            after its second. Rank 1 then stays until rank 0 heard why.
template <class Transport>
void abort_heard(Transport& t, const std::string& how) {
  using namespace std::chrono;
  if (how != "answers" && how != "silent" && how != "both")
    fail("abort-heard: answers, silent or both, not '" + how + "'");
  if constexpr (!requires { t.fail(gw::errc::mismatch, std::string()); }) {
    throw std::runtime_error("abort-heard: this transport cannot fail a rank on purpose");
  } else {
    const sideband side(t);
    if (how == "both") {
      // Ranks 0 and 1 abort at once, and stay alive (endpoints open) until both aborts have
      // returned: each must return on the other's answer, not wait out its second.
      const int me = t.rank(), other = 1 - me;
      if (me > 1) return;
      side.signal("ready" + std::to_string(me));
      side.await("ready" + std::to_string(other), seconds(20));
      const double began = monotonic_now();
      t.fail(gw::errc::mismatch, "rank " + std::to_string(me) + " aborts too");
      const double returned = monotonic_now();
      std::printf("rank %d: PASS abort began at %.6f, returned at %.6f, took %.6f s\n", me, began, returned,
                  returned - began);
      std::fflush(stdout);
      side.signal("returned" + std::to_string(me));
      side.await("returned" + std::to_string(other), seconds(20));
      if (me == 1) {
        side.signal("leaving");
      } else {
        side.await("leaving", seconds(20));
        side.remove();
      }
      std::_Exit(0);
    }
    if (t.rank() == 1) {
      side.signal("aborting");
      const double began = monotonic_now();
      t.fail(gw::errc::mismatch, "a reason only rank 1 knows");
      const double returned = monotonic_now();
      std::printf("rank 1: PASS abort began at %.6f, returned at %.6f, took %.6f s\n", began, returned,
                  returned - began);
      std::fflush(stdout);
      if (how == "silent") {
        side.signal("returned");
        side.await("heard", seconds(20));
        side.remove();
      }
      std::_Exit(0);  // no goodbye, no destructors: as abrupt as an exit gets
    }
    if (t.rank() != 0) return;
    side.await(how == "answers" ? "aborting" : "returned", seconds(20));  // busy, not in the transport
    const double listening = monotonic_now();
    std::printf("rank 0: listening at %.6f\n", listening);
    std::fflush(stdout);
    std::vector<std::byte> nothing(4);
    expect_error_no_exit(gw::errc::mismatch, {"rank 1 failed", "a reason only rank 1 knows"}, [&] {
      auto r = t.async_recv(1, 1, nothing);
      t.wait(r, gw::clock::now() + seconds(10));
    });
    if (how == "silent") side.signal("heard");
    else side.remove();
  }
}

// A rank that fails on purpose while a 64 MiB send waits for a receive that never comes:
// the send ends with the failure's own kind, after which the caller frees the buffer and
// the request, and nothing in the transport touches either again, its destruction
// included (the ASan run of this mode sees any such touch). Rank 1 stays out of the
// transport (sideband) until rank 0 is done, so that the send cannot complete and no
// answer of rank 1's races the failure; then its next wait fails. Only over UCX's shared
// memory does it learn why: over a TCP stream rank 0's abort is queued behind the unsent
// rest of the 64 MiB and dropped with the connection (asio_tcp: "its connection closed";
// UCX over TCP: nothing, the wait runs to its deadline). The failure core (issue 36) is
// to carry the reason past a send in flight.
void fail_while_sending(transport_type& t) {
  if constexpr (!requires { t.fail(gw::errc::mismatch, std::string()); }) {
    throw std::runtime_error("fail-sending: this transport cannot fail a rank on purpose");
  } else {
    const std::string why = "rank 0 failed with a send in flight";
    const sideband side(t);
    if (t.rank() == 0) {
      {  // the request and the buffer go at the end of this block, before rank 1 is told
        std::vector<std::byte> big(std::size_t{64} << 20, std::byte{7});
        auto send = t.async_send(1, 1, big);
        t.fail(gw::errc::mismatch, why);
        expect_error_no_exit(gw::errc::mismatch, {why}, [&] { t.wait(send, gw::clock::now() + std::chrono::seconds(10)); });
      }
      side.signal("failed");
      side.await("heard");
      side.remove();
    } else if (t.rank() == 1) {
      side.await("failed");
      std::vector<std::byte> never(4);
      try {
        auto r = t.async_recv(0, 2, never);
        t.wait(r, gw::clock::now() + std::chrono::seconds(5));
        fail("a receive from a rank that failed completed");
      } catch (const gw::error& e) {
        std::printf("rank 1: EXPECTED %s\n", e.what());
      }
      side.signal("heard");
    }
  }
}

// Point-to-point corner cases of the TCP transport between ranks 0 and 1:
// - a receive for a later, small message waited on before the receive of an earlier,
//   large one (the large one is then taken into memory instead of blocking the stream);
// - a message whose size differs from its receive: an error for that receive, and the
//   stream stays in step for the next message;
// - large messages whose receives are posted long after they arrive (copied, and added);
// - a message added into place whose first part, read with an earlier one, ends inside
//   an element (asio_tcp reads up to 64 KiB at a time and splits the stream anywhere);
// - two messages of one size under adjacent tags, received in the other order.
// "Arrived": rank 1 signals (sideband) once it has posted the sends, which hands their
// first bytes to the wire at once; over asio_tcp rank 0 then also waits until its kernel
// holds them unread (the header and more than the 16 KiB a frame is buffered up to), so
// that its first read after posting the receive finds them there.
void point_to_point(transport_type& t) {
  const auto until = [] { return gw::clock::now() + std::chrono::seconds(30); };
  const sideband side(t);
  constexpr std::size_t header = gw::transport::wire::header_size, buffered = std::size_t{16} << 10;
  std::vector<std::byte> large(1 << 20), small(4), big(8 << 20), after(16);
  if (t.rank() == 1) {
    for (std::size_t i = 0; i < large.size(); ++i) large[i] = std::byte(i * 7);
    small = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}};
    std::vector<transport_type::request> sends;
    sends.push_back(t.async_send(0, 1, large));
    sends.push_back(t.async_send(0, 2, small));
    sends.push_back(t.async_send(0, 3, big));  // rank 0 expects 4 MiB here
    for (auto& a : after) a = std::byte{9};
    sends.push_back(t.async_send(0, 4, after));
    for (auto& s : sends) t.wait(s, until());
    // Large messages that arrive long before their receives (read ahead, then resumed):
    // one copied into place, one added into place (the accumulating receive).
    std::vector<float> values(3 << 18);  // 3 MiB: more than the read-ahead and the stage
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i % 1000);
    auto s5 = t.async_send(0, 5, std::as_bytes(std::span<const float>(values)));
    auto s6 = t.async_send(0, 6, std::as_bytes(std::span<const float>(values)));
    side.signal("sent 5 and 6");
    t.wait(s5, until());
    t.wait(s6, until());
    std::vector<std::byte> go(4), odd(13, std::byte{5});
    auto r9 = t.async_recv(0, 9, go);
    t.wait(r9, until());  // rank 0 is not reading now: 7 and 8 wait in its kernel together
    std::vector<double> doubles(100000);
    for (std::size_t i = 0; i < doubles.size(); ++i) doubles[i] = double(i % 777);
    auto s7 = t.async_send(0, 7, odd);
    auto s8 = t.async_send(0, 8, std::as_bytes(std::span<const double>(doubles)));
    side.signal("sent 7 and 8");
    t.wait(s7, until());
    t.wait(s8, until());
    // Two messages of one size under adjacent tags (10 = 0b1010, 11 = 0b1011), received
    // in the other order: each receive gets its own tag's message, whatever the transport
    // does with tags underneath (MPI folds them: tags below tag_limit() must stay apart).
    std::vector<std::byte> ten(8, std::byte{10}), eleven(8, std::byte{11});
    auto s10 = t.async_send(0, 10, ten);
    auto s11 = t.async_send(0, 11, eleven);
    t.wait(s10, until());
    t.wait(s11, until());
  } else if (t.rank() == 0) {
    auto r2 = t.async_recv(1, 2, small);
    t.wait(r2, until());  // waited first, though its message is behind the large one
    auto r1 = t.async_recv(1, 1, large);
    t.wait(r1, until());
    for (std::size_t i = 0; i < large.size(); ++i)
      if (large[i] != std::byte(i * 7)) fail("large message, byte " + std::to_string(i));
    if (small != std::vector<std::byte>{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}}) fail("small message");
    std::vector<std::byte> four_mib(4 << 20);
    auto r3 = t.async_recv(1, 3, four_mib);
    try {
      t.wait(r3, until());
      fail("a 8 MiB message into a 4 MiB receive was not refused");
    } catch (const gw::error& e) {
      // TCP reports both ranks and sizes and the tag; UCX knows only that more came than fitted.
      const std::string want =
          std::is_same_v<direct_transport, gw::transport::asio_tcp>
              ? "message size mismatch: rank 1 sent 8388608 bytes (tag 3) but rank 0 expected 4194304"
              : "4194304";
      if (e.kind() != gw::errc::mismatch || std::string(e.what()).find(want) == std::string::npos)
        fail(std::string("size mismatch reported as: ") + e.what());
    }
    auto r4 = t.async_recv(1, 4, after);
    t.wait(r4, until());
    if (after != std::vector<std::byte>(16, std::byte{9})) fail("the message after the refused one");
    // Tags 5 and 6 arrive before their receives are posted.
    side.await("sent 5 and 6");
    await_kernel_bytes(header + buffered + 1, "tag 5 before its receive");
    std::vector<float> copied(3 << 18, -1.0f), added(3 << 18, 0.5f);
    auto r5 = t.async_recv(1, 5, std::as_writable_bytes(std::span<float>(copied)));
    t.wait(r5, until());
    // Generic, so that the branch a transport lacks is discarded rather than compiled.
    auto receive_added = [&](auto& tr, std::uint64_t tag, auto target) {
      using tr_type = std::remove_cvref_t<decltype(tr)>;
      using value = typename decltype(target)::element_type;
      if constexpr (gw::concepts::accumulating_transport<tr_type, value>) {
        auto r = tr.async_recv_accumulate(1, tag, target);
        tr.wait(r, until());
      } else {
        std::vector<value> in(target.size());
        auto r = tr.async_recv(1, tag, std::as_writable_bytes(std::span<value>(in)));
        tr.wait(r, until());
        for (std::size_t i = 0; i < in.size(); ++i) target[i] += in[i];
      }
    };
    receive_added(t, 6, std::span<float>(added));
    for (std::size_t i = 0; i < copied.size(); ++i) {
      if (copied[i] != float(i % 1000)) fail("large message received late, element " + std::to_string(i));
      if (double(added[i]) != double(i % 1000) + 0.5) fail("large message added late, element " + std::to_string(i));
    }
    std::vector<std::byte> go(4), odd(13);
    auto s9 = t.async_send(1, 9, go);
    t.wait(s9, until());
    // 13 bytes, then 800 KB, arrive: frame 7 whole and the head of 8 wait in the kernel together.
    side.await("sent 7 and 8");
    await_kernel_bytes(2 * header + odd.size() + buffered + 1, "tags 7 and 8 before their receives");
    std::vector<double> sums(100000, 0.25);
    auto r7 = t.async_recv(1, 7, odd);
    receive_added(t, 8, std::span<double>(sums));
    t.wait(r7, until());
    if (odd != std::vector<std::byte>(13, std::byte{5})) fail("13-byte message");
    for (std::size_t i = 0; i < sums.size(); ++i)
      if (sums[i] != double(i % 777) + 0.25) fail("doubles added after a 13-byte message, element " + std::to_string(i));
    std::vector<std::byte> ten(8), eleven(8);
    auto r11 = t.async_recv(1, 11, eleven);
    t.wait(r11, until());  // posted and waited before tag 10's receive, which was sent first
    auto r10 = t.async_recv(1, 10, ten);
    t.wait(r10, until());
    if (eleven != std::vector<std::byte>(8, std::byte{11}) || ten != std::vector<std::byte>(8, std::byte{10}))
      fail("messages under adjacent tags 10 and 11, received in the other order, were swapped");
    side.remove();  // rank 1 signals nothing more
  }
  std::printf("rank %d: PASS point-to-point\n", t.rank());
}

// A receive from the next rank that it never sends, with a short deadline: errc::timeout
// naming the peer, the tag and the size, well before the step timeout.
void timeout(transport_type& t) {
  if (t.size() < 2) fail("timeout needs 2 ranks");
  const int peer = (t.rank() + 1) % t.size();
  std::vector<std::byte> never(12345);
  const auto started = gw::clock::now();
  expect_error_no_exit(gw::errc::timeout, {"receive from rank " + std::to_string(peer), "tag 4242", "12345 bytes"}, [&] {
    auto r = t.async_recv(peer, 4242, never);
    t.wait(r, gw::clock::now() + std::chrono::milliseconds(500));
  });
  const double took = std::chrono::duration<double>(gw::clock::now() - started).count();
  if (took < 0.5) fail("the timeout came after " + std::to_string(took) + " s, before its 0.5 s deadline");
  if (took > 10) fail("the timeout came after " + std::to_string(took) + " s, not at its 0.5 s deadline");
  std::printf("rank %d: PASS timeout after %.3f s\n", t.rank(), took);
}

#if GRADWIRE_TEST_UCX && !GRADWIRE_TEST_ANY  // any_transport does not forward one-sided access
// One-sided access: every rank exposes [inbox: n floats][own: n floats], puts its values
// into the next rank's inbox (one large put through the bulk endpoint, one small one
// through the other) and gets the previous rank's own values (and 9 unaligned bytes of
// its inbox); everything is checked against values computed from the owner's rank.
// Bounds and malformed keys are refused with clear errors.
void one_sided(comm_type& c) {
  auto& t = c.transport();
  const int me = t.rank(), n = t.size(), next = (me + 1) % n, prev = (me + n - 1) % n;
  const std::size_t count = 1000003, small_at = 12345, small = 7;
  auto value = [](int owner, std::size_t i, int salt) {
    return static_cast<float>(mix(static_cast<std::uint64_t>(owner) * 1000003u + i + 77u * salt) % 100000) / 8.0f;
  };
  const float poison = -1.0f;
  std::vector<float> window(2 * count, poison), mine(count), small_values(small);
  for (std::size_t i = 0; i < count; ++i) window[count + i] = mine[i] = value(me, i, 0);
  for (std::size_t i = 0; i < small; ++i) small_values[i] = value(me, i, 1);
  auto exposed = t.expose(std::as_writable_bytes(std::span<float>(window)));

  const auto until = [] { return gw::clock::now() + std::chrono::seconds(30); };
  const std::uint64_t key_size = exposed.key().size();
  std::vector<transport_type::request> sends;
  for (int r = 0; r < n; ++r)
    if (r != me) {
      sends.push_back(t.async_send(r, 900, std::as_bytes(std::span(&key_size, 1))));
      sends.push_back(t.async_send(r, 901, exposed.key()));
    }
  std::uint64_t next_key_size = 0, prev_key_size = 0;
  auto r1 = t.async_recv(next, 900, std::as_writable_bytes(std::span(&next_key_size, 1)));
  t.wait(r1, until());
  std::vector<std::byte> next_key(next_key_size);
  auto r2 = t.async_recv(next, 901, next_key);
  t.wait(r2, until());
  std::vector<std::byte> prev_key;
  if (prev != next) {
    auto r3 = t.async_recv(prev, 900, std::as_writable_bytes(std::span(&prev_key_size, 1)));
    t.wait(r3, until());
    prev_key.resize(prev_key_size);
    auto r4 = t.async_recv(prev, 901, prev_key);
    t.wait(r4, until());
  } else {
    prev_key = next_key;
  }
  for (int r = 0; r < n; ++r)  // the keys of the ranks that are neither neighbour
    if (r != me && r != next && r != prev) {
      std::uint64_t size = 0;
      auto a = t.async_recv(r, 900, std::as_writable_bytes(std::span(&size, 1)));
      t.wait(a, until());
      std::vector<std::byte> key(size);
      auto b = t.async_recv(r, 901, key);
      t.wait(b, until());
    }
  for (auto& r : sends) t.wait(r, until());

  auto to_next = t.attach(next, next_key);
  auto from_prev = t.attach(prev, prev_key);
  if (to_next.size() != 2 * count * sizeof(float)) fail("the attached window's size");
  auto big = t.async_put(to_next, 0, std::as_bytes(std::span<const float>(mine)));
  t.wait(big, until());
  auto little = t.async_put(to_next, small_at * sizeof(float), std::as_bytes(std::span<const float>(small_values)));
  t.wait(little, until());
  std::vector<float> got(count, poison);
  auto g = t.async_get(from_prev, count * sizeof(float), std::as_writable_bytes(std::span<float>(got)));
  t.wait(g, until());
  for (std::size_t i = 0; i < count; ++i)
    if (got[i] != value(prev, i, 0)) fail("get: element " + std::to_string(i) + " of rank " + std::to_string(prev));

  col::barrier(c);  // every rank has put into its neighbour's inbox
  for (std::size_t i = 0; i < count; ++i) {
    const bool in_small = i >= small_at && i < small_at + small;
    const float want = in_small ? value(prev, i - small_at, 1) : value(prev, i, 0);
    if (window[i] != want) fail("put: inbox element " + std::to_string(i) + " from rank " + std::to_string(prev));
  }
  {  // 9 bytes from byte 3 of the small values the rank before prev put into prev's inbox
    const int pp = (prev + n - 1) % n;
    const float first[3] = {value(pp, 0, 1), value(pp, 1, 1), value(pp, 2, 1)};
    std::byte got_bytes[9];
    auto r = t.async_get(from_prev, small_at * sizeof(float) + 3, got_bytes);
    t.wait(r, until());
    if (std::memcmp(got_bytes, reinterpret_cast<const std::byte*>(first) + 3, 9) != 0) fail("get: 9 unaligned bytes");
  }

  auto refused = [&](gw::errc want, const std::string& text, const std::function<void()>& fn) {
    try {
      fn();
    } catch (const gw::error& e) {
      if (e.kind() == want && std::string(e.what()).find(text) != std::string::npos) return;
      fail(std::string("unexpected error: ") + e.what());
    }
    fail("no error for " + text);
  };
  refused(gw::errc::invalid_argument, "do not fit", [&] {
    auto r = t.async_put(to_next, 2 * count * sizeof(float) - 4, std::as_bytes(std::span<const float>(mine).first(2)));
  });
  refused(gw::errc::invalid_argument, "do not fit", [&] {
    auto r = t.async_get(from_prev, std::size_t{1} << 40, std::as_writable_bytes(std::span<float>(got).first(1)));
  });
  refused(gw::errc::protocol, "malformed", [&] { t.attach(next, std::span<const std::byte>(next_key).first(3)); });
  refused(gw::errc::invalid_argument, "empty window", [&] { t.expose({}); });
  refused(gw::errc::invalid_argument, "not in the job", [&] { t.attach(n, next_key); });
  {  // a window moved from is empty: using it is refused, naming what was tried
    auto spare = t.attach(next, next_key);
    const auto kept = std::move(spare);
    refused(gw::errc::invalid_argument, "put to an empty remote window", [&] {
      auto r = t.async_put(spare, 0, std::as_bytes(std::span<const float>(mine).first(1)));
    });
    refused(gw::errc::invalid_argument, "get from an empty remote window", [&] {
      auto r = t.async_get(spare, 0, std::as_writable_bytes(std::span<float>(got).first(1)));
    });
  }
  col::barrier(c);  // nobody's window goes while a peer may still read it
  std::printf("rank %d: PASS one-sided\n", me);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string arg = argc > 2 ? argv[2] : "";
  try {
    const auto spec = gw::cluster::detect();
    my_rank = spec.rank;
    if (mode == "wrong-token") {
      // Rank `arg` carries another job's token: it must be refused, and say so.
      gw::cluster::overrides o;
      if (spec.rank == std::stoi(arg)) {
        o.job_token = "not-this-job";
        expect_error(gw::errc::auth, {"job token"}, [&] { join(o); });
      }
      // The others wait for it until their deadline; once rank 0 gives up, the store it
      // serves goes away, which the ranks still asking it see as a lost peer.
      expect_error(
          gw::errc::timeout, {},
          [&] {
            auto t = join(o);
            comm_type c(std::move(t));
            col::barrier(c);
          },
          gw::errc::peer_lost);
    }
    if (mode == "absent") {
      // Rank `arg` never starts: rank 0, which serves the rendezvous store, gives up at its
      // deadline (GRADWIRE_TIMEOUT) with a timeout naming it; the others time out too, or
      // see the store go with rank 0 (a lost peer). test_multiprocess.py checks the words.
      if (spec.rank == 0)
        expect_error(gw::errc::timeout, {arg + " did not connect"}, [&] { join(); });
      expect_error(gw::errc::timeout, {}, [&] { join(); }, gw::errc::peer_lost);
    }
    if (mode == "train") {
      train(arg);
      return 0;
    }
    if (mode == "stall" || mode == "partition") {
      loop_steps(mode, arg, argc > 3 ? argv[3] : "");
      return 0;
    }
    if (mode == "timeout") {
      auto t = join();
      timeout(t);
      comm_type c(std::move(t));
      col::barrier(c);  // the ranks still agree after a withdrawn receive
      return 0;
    }
    if (mode == "abort-heard") {
      auto t = join();
      abort_heard(t, arg.empty() ? "answers" : arg);
      std::exit(0);  // the transport failed on purpose: no goodbye to say
    }
    if (mode == "fail-sending") {
      {
        auto t = join();
        fail_while_sending(t);
      }  // the failed transport goes here, before the PASS
      std::printf("rank %d: PASS fail-sending\n", spec.rank);
      std::fflush(stdout);
      std::exit(0);
    }
    if (mode == "point-to-point") {
      auto t = join();
      point_to_point(t);
      comm_type c(std::move(t));
      col::barrier(c);
      return 0;
    }
#if GRADWIRE_TEST_UCX && !GRADWIRE_TEST_ANY
    if (mode == "one-sided") {
      comm_type c(join());
      one_sided(c);
      return 0;
    }
#endif
    if (mode == "join") {  // joining only (used for port-in-use)
      auto t = join();
      std::printf("rank %d: PASS join\n", spec.rank);
      return 0;
    }
    comm_type comm(join(), {.timeout = std::chrono::seconds(60)});
    if (mode == "collectives") collectives(comm);
    else if (mode == "bucketing") bucketing(comm);
    else if (mode == "async") async(comm);
    else if (mode == "kill") kill_rank(comm, std::stoi(arg));
    else if (mode == "mismatch") mismatch(comm, arg);
    else {
      std::fprintf(stderr, "usage: mp_worker collectives|bucketing|async|train sgd|momentum|adam|kill K|mismatch count|dtype|op|wrong-token K|absent K|join|timeout|point-to-point|fail-sending|abort-heard answers|silent|both|one-sided (UCX)\n");
      return 2;
    }
    col::barrier(comm);
  } catch (const gw::error& e) {
    // With the kind, for the cases that expect this exit (test_multiprocess.py: a port in
    // use, bad settings): "rank R: FAIL errc::config: MESSAGE".
    std::printf("rank %d: FAIL errc::%s: %s\n", my_rank, errc_name(e.kind()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::printf("rank %d: FAIL %s\n", my_rank, e.what());
    return 1;
  }
  return 0;
}
