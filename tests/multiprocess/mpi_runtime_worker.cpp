// One rank of the MPI runtime tests (test_mpi.py Runtime): the thread level transport::mpi needs, and a rank killed under mpirun --enable-recovery.
//
//   mpi_runtime_worker thread-level single|funneled|serialized|multiple
//       The program initialises MPI itself (MPI_Init_thread at that level), then builds
//       transport::mpi. Prints "rank R: provided LEVEL" (MPI_Query_thread), then either
//       "rank R: REFUSED <errc>: <message>" or, once an all-reduce over the transport
//       matched its reference, "rank R: PASS joined".
//   mpi_runtime_worker recovery DIR          (2 ranks, under mpirun --enable-recovery)
//       After a checked all-reduce, rank 0 posts a receive from rank 1 (tag 4242, 12345
//       bytes); both ranks write DIR/rankR.pid. The test kills rank 1 (SIGKILL), waits until
//       it is gone and creates DIR/killed; rank 0 then waits on its receive, and afterwards
//       runs an all-reduce of 1000 floats, each until step_timeout() (GRADWIRE_STEP_TIMEOUT),
//       and prints "rank 0: EXPECTED <errc> after S s: <message>" for each. Rank 1 only
//       waits to be killed (a bounded poll: "FAIL not killed" after 60 s).
//   mpi_runtime_worker imrecv-fails          (2 ranks)
//       MPI_Imrecv fails (MPI_ERR_TRUNCATE) for rank 0's receive from rank 1 (tag 4242,
//       12345 bytes): the worker defines MPI_Imrecv itself (the MPI profiling interface),
//       takes the message off MPI with PMPI_Mrecv, and returns the error. Rank 0 waits on
//       the receive with a 60 s deadline and prints "rank 0: EXPECTED <errc>: <message>"
//       and "rank 0: MPI says: <MPI_Error_string(MPI_ERR_TRUNCATE)>"; then both ranks run a
//       checked all-reduce and print "PASS imrecv-fails".
//   mpi_runtime_worker drop-arriving         (2 ranks; the test runs it over the TCP BTL)
//       Rank 1 sends 16 MiB (bytes 0x5A) and then 8 bytes to rank 0, both on tag 4243.
//       Rank 0 posts a receive for each and waits for the 8 bytes only: by MPI's
//       non-overtaking rule the 16 MiB were matched first (its MPI_Imrecv is counted through
//       the profiling interface), and are still arriving. Rank 0 then drops that receive,
//       fills its buffer with 0x11, runs checked all-reduces (MPI progresses whatever is
//       still in flight) and checks that no byte of the buffer changed: a dropped receive
//       writes nothing into its buffer once dropped. Prints "rank R: PASS drop-arriving".
//   mpi_runtime_worker comm-freed            (2 ranks)
//       Builds transport::mpi three times in a row, each with a checked all-reduce, and
//       records (the profiling interface again) every MPI_Comm_idup and MPI_Comm_free. Each
//       transport must free the communicator it duplicated, and only that one, by the time
//       it is destroyed. Prints "rank R: PASS comm-freed 3 of 3".
//   mpi_runtime_worker large-message         (2 ranks)
//       Rank 1 sends rank 0 one message of 2 GiB + 8 bytes (past MPI's int count of bytes)
//       whose 32-bit words are a pattern of their index; rank 0 checks every word. Both
//       ranks then check that a message of 2 GiB + 2 bytes (not a multiple of 4) is refused
//       with invalid_argument before it is posted. Prints "rank R: PASS large-message".
//   mpi_runtime_worker drop-send             (2 ranks)
//       Rank 0 posts a 16 MiB send to rank 1 (tag 4246), which has posted no receive, and
//       drops it: the drop must hand the send to MPI at once (MPI_Request_free), not test it
//       until it completes (every MPI_Test is counted through the profiling interface).
//       Rank 1 then receives the message whole. Prints "rank R: PASS drop-send".
// A worker, not a Catch2 test: it checks its all-reduces against references itself (exit 1
// with "FAIL ..."), and test_mpi.py asserts the errc, the words and the times it prints.
#include <gradwire/gradwire.hpp>
#include <gradwire/mpi.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

namespace gw = gradwire;
namespace col = gradwire::collective;

// Armed by imrecv-fails: the next MPI_Imrecv of 12345 bytes fails. Otherwise MPI's own.
std::atomic<bool> fail_next_imrecv{false};
// drop-arriving's large message: how many MPI_Imrecv calls received one.
constexpr long long arriving_bytes = 16LL << 20;
std::atomic<int> large_imrecvs{0};

extern "C" int MPI_Imrecv(void* buf, int count, MPI_Datatype type, MPI_Message* message, MPI_Request* request) {
  int type_size = 0;
  PMPI_Type_size(type, &type_size);
  if (static_cast<long long>(count) * type_size == 12345 && fail_next_imrecv.exchange(false)) {
    // The message is taken off MPI (so that the sender completes and MPI_Finalize finds
    // nothing pending), but the call reports an error, as a failing MPI_Imrecv would.
    PMPI_Mrecv(buf, count, type, message, MPI_STATUS_IGNORE);
    return MPI_ERR_TRUNCATE;
  }
  if (static_cast<long long>(count) * type_size == arriving_bytes) ++large_imrecvs;
  return PMPI_Imrecv(buf, count, type, message, request);
}

// drop-send: MPI_Test calls made by this process.
std::atomic<long> mpi_tests{0};

extern "C" int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  ++mpi_tests;
  return PMPI_Test(request, flag, status);
}

// comm-freed: the communicators the program duplicated and freed, in order.
std::mutex comm_calls_mutex;
std::vector<MPI_Comm> duplicated_comms, freed_comms;

extern "C" int MPI_Comm_idup(MPI_Comm comm, MPI_Comm* newcomm, MPI_Request* request) {
  const int rc = PMPI_Comm_idup(comm, newcomm, request);
  std::lock_guard lock(comm_calls_mutex);
  duplicated_comms.push_back(*newcomm);
  return rc;
}

extern "C" int MPI_Comm_free(MPI_Comm* comm) {
  {
    std::lock_guard lock(comm_calls_mutex);
    freed_comms.push_back(*comm);
  }
  return PMPI_Comm_free(comm);
}

namespace {

int my_rank = -1;

[[noreturn]] void fail(const std::string& what) {
  std::printf("rank %d: FAIL %s\n", my_rank, what.c_str());
  std::fflush(stdout);
  std::_Exit(1);  // not through MPI_Finalize: a peer may be gone
}

void say(const std::string& line) {
  std::printf("rank %d: %s\n", my_rank, line.c_str());
  std::fflush(stdout);
}

std::string kind_name(gw::errc e) { return gw::make_error_code(e).message(); }

// The deadline of a wait in these scenarios: long enough that only a hang reaches it.
gw::deadline within(std::chrono::seconds patience = std::chrono::seconds(60)) { return gw::clock::now() + patience; }

// All-reduce of rank-dependent values, compared with the sum computed here.
void checked_all_reduce(col::communicator<gw::transport::mpi>& comm) {
  const int n = comm.size();
  std::vector<double> v(1001);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(comm.rank() + 1) * static_cast<double>(i);
  col::all_reduce(comm, std::span<double>(v));
  const double ranks = n * (n + 1) / 2.0;  // 1 + 2 + ... + n
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != ranks * static_cast<double>(i))
      fail("all-reduce element " + std::to_string(i) + " is " + std::to_string(v[i]) + ", reference " +
           std::to_string(ranks * static_cast<double>(i)));
}

int thread_level(const std::string& level_name) {
  const int wanted = level_name == "single"       ? MPI_THREAD_SINGLE
                     : level_name == "funneled"   ? MPI_THREAD_FUNNELED
                     : level_name == "serialized" ? MPI_THREAD_SERIALIZED
                     : level_name == "multiple"   ? MPI_THREAD_MULTIPLE
                                                  : -1;
  if (wanted < 0) fail("unknown thread level " + level_name);
  int provided = -1;
  MPI_Init_thread(nullptr, nullptr, wanted, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  int queried = -1;
  MPI_Query_thread(&queried);
  say("provided " + gw::transport::detail::mpi_thread_level_name(queried));
  try {
    col::communicator<gw::transport::mpi> comm(gw::transport::mpi{});
    checked_all_reduce(comm);
    col::barrier(comm);
    say("PASS joined");
  } catch (const gw::error& e) {
    say("REFUSED " + kind_name(e.kind()) + ": " + e.what());
  }
  // The program initialised MPI, so it finalises it (after its transports are gone), as
  // mpi/runtime.hpp asks; a refused transport left nothing behind that would block this.
  MPI_Finalize();
  return 0;
}

int recovery(const std::filesystem::path& dir) {
  gw::transport::mpi t;
  my_rank = t.rank();
  if (t.size() != 2) fail("recovery needs 2 ranks");
  col::communicator<gw::transport::mpi> comm(std::move(t));  // deadline: step_timeout()
  checked_all_reduce(comm);  // both ranks talk, so MPI's links are up before the kill
  std::vector<std::byte> never(12345);
  std::optional<gw::transport::mpi::request> pending;
  if (my_rank == 0) pending = comm.transport().async_recv(1, 4242, never);
  {
    const auto tmp = dir / ("rank" + std::to_string(my_rank) + ".tmp");
    std::ofstream(tmp) << getpid() << "\n";
    std::filesystem::rename(tmp, dir / ("rank" + std::to_string(my_rank) + ".pid"));
  }
  say("ready");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  if (my_rank == 1) {  // waits for its SIGKILL
    while (std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fail("not killed within 60 s");
  }
  while (!std::filesystem::exists(dir / "killed")) {  // the test killed rank 1 and saw it gone
    if (std::chrono::steady_clock::now() > give_up) fail("the test did not say rank 1 was killed within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto expect_timeout = [&](const std::string& what, auto&& fn) {
    const auto started = gw::clock::now();
    try {
      fn();
    } catch (const gw::error& e) {
      const double took = std::chrono::duration<double>(gw::clock::now() - started).count();
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.3f", took);
      say("EXPECTED " + kind_name(e.kind()) + " after " + seconds + " s: " + e.what());
      return;
    }
    fail(what + " completed although rank 1 was killed");
  };
  expect_timeout("the receive posted before the kill", [&] {
    comm.transport().wait(*pending, gw::clock::now() + gw::step_timeout());
  });
  std::vector<float> data(1000, 1.0f);
  expect_timeout("an all-reduce after the kill", [&] { col::all_reduce(comm, std::span<float>(data)); });
  say("DONE");
  // Not through MPI_Finalize: the job lost a rank, and what MPI does at finalisation then
  // (OpenMPI 4.1 with --enable-recovery: returns) is not what this test is about.
  std::_Exit(0);
}

// The job of a 2-rank mode over transport::mpi (returned as a prvalue: no move needed).
col::communicator<gw::transport::mpi> two_ranks(const std::string& mode) {
  gw::transport::mpi t;
  my_rank = t.rank();
  if (t.size() != 2) fail(mode + " needs 2 ranks");
  return col::communicator<gw::transport::mpi>(std::move(t));
}

// A receive whose MPI_Imrecv fails completes with that error (not a timeout at its
// deadline, nor a success with nothing received).
int imrecv_fails() {
  auto comm = two_ranks("imrecv-fails");
  checked_all_reduce(comm);
  std::vector<std::byte> data(12345, std::byte{7});
  if (my_rank == 1) {
    auto sent = comm.transport().async_send(0, 4242, data);
    comm.transport().wait(sent, within());
  } else {
    fail_next_imrecv = true;
    auto received = comm.transport().async_recv(1, 4242, data);
    try {
      comm.transport().wait(received, within());
      fail("the receive completed although its MPI_Imrecv failed");
    } catch (const gw::error& e) {
      say("EXPECTED " + kind_name(e.kind()) + ": " + e.what());
    }
    if (fail_next_imrecv) fail("MPI_Imrecv was never called for the receive");
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(MPI_ERR_TRUNCATE, text, &length);
    say("MPI says: " + std::string(text, static_cast<std::size_t>(length)));
  }
  checked_all_reduce(comm);  // the transport goes on after a failed receive
  say("PASS imrecv-fails");
  return 0;
}

// A receive dropped while its message is arriving is let finish before the drop returns:
// the buffer is the caller's again, and MPI writes nothing into it afterwards.
int drop_arriving() {
  auto comm = two_ranks("drop-arriving");
  checked_all_reduce(comm);
  std::vector<std::byte> large(static_cast<std::size_t>(arriving_bytes), std::byte{0x5A});
  std::vector<std::byte> small(8, std::byte{0x5A});
  if (my_rank == 1) {
    auto first = comm.transport().async_send(0, 4243, large);
    auto second = comm.transport().async_send(0, 4243, small);
    comm.transport().wait(second, within());
    comm.transport().wait(first, within());
  } else {
    std::fill(large.begin(), large.end(), std::byte{0});
    {
      auto first = comm.transport().async_recv(1, 4243, large);
      auto second = comm.transport().async_recv(1, 4243, small);
      comm.transport().wait(second, within());
      if (large_imrecvs != 1) fail("the 16 MiB receive was not matched before the 8 bytes behind it arrived");
    }  // `first` dropped here, its message still arriving
    std::fill(large.begin(), large.end(), std::byte{0x11});
  }
  for (int i = 0; i < 3; ++i) {
    checked_all_reduce(comm);  // MPI progresses what is in flight
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (my_rank == 0) {
    const auto changed = std::count_if(large.begin(), large.end(), [](std::byte b) { return b != std::byte{0x11}; });
    if (changed != 0) fail(std::to_string(changed) + " bytes of a dropped receive's buffer were written after the drop");
  }
  say("PASS drop-arriving");
  return 0;
}

// Every transport frees the communicator it duplicated when it is destroyed: a program
// that builds one per phase (or per test) does not leak MPI communicators.
int comm_freed() {
  constexpr int transports = 3;
  for (int k = 0; k < transports; ++k) {
    auto comm = two_ranks("comm-freed");
    checked_all_reduce(comm);
    std::lock_guard lock(comm_calls_mutex);
    if (duplicated_comms.size() != static_cast<std::size_t>(k + 1) || freed_comms.size() != static_cast<std::size_t>(k))
      fail("transport " + std::to_string(k) + " alive: " + std::to_string(duplicated_comms.size()) + " duplicated, " +
           std::to_string(freed_comms.size()) + " freed");
  }
  std::lock_guard lock(comm_calls_mutex);
  if (freed_comms.size() != duplicated_comms.size())
    fail(std::to_string(duplicated_comms.size()) + " communicators duplicated, " + std::to_string(freed_comms.size()) +
         " freed");
  for (std::size_t i = 0; i < freed_comms.size(); ++i)
    if (freed_comms[i] != duplicated_comms[i] || freed_comms[i] == MPI_COMM_WORLD)
      fail("transport " + std::to_string(i) + " freed a communicator it did not duplicate");
  say("PASS comm-freed " + std::to_string(freed_comms.size()) + " of " + std::to_string(transports));
  return 0;
}

// A message above 2 GiB (MPI counts are ints) travels whole, in 4-byte units; one that
// cannot be counted so is refused, not cut or sent short.
int large_message() {
  auto comm = two_ranks("large-message");
  const std::size_t words = (std::size_t{1} << 29) + 2;  // 2 GiB + 8 bytes
  const auto pattern = [](std::size_t i) { return static_cast<std::uint32_t>(i * 2654435761u + 12345u); };
  std::vector<std::uint32_t> data(words);
  const auto bytes = std::as_writable_bytes(std::span<std::uint32_t>(data));
  if (my_rank == 1) {
    for (std::size_t i = 0; i < words; ++i) data[i] = pattern(i);
    auto sent = comm.transport().async_send(0, 4244, bytes);
    comm.transport().wait(sent, within(std::chrono::seconds(120)));
  } else {
    auto received = comm.transport().async_recv(1, 4244, bytes);
    comm.transport().wait(received, within(std::chrono::seconds(120)));
    for (std::size_t i = 0; i < words; ++i)
      if (data[i] != pattern(i))
        fail("word " + std::to_string(i) + " of the 2 GiB message is " + std::to_string(data[i]) + ", sent " +
             std::to_string(pattern(i)));
  }
  const auto odd = bytes.first((std::size_t{1} << 31) + 2);
  for (const bool send : {true, false}) {
    try {
      auto r = send ? comm.transport().async_send(1 - my_rank, 4245, odd) : comm.transport().async_recv(1 - my_rank, 4245, odd);
      fail(std::string(send ? "a send" : "a receive") + " of 2 GiB + 2 bytes was posted");
    } catch (const gw::error& e) {
      if (e.kind() != gw::errc::invalid_argument || std::string(e.what()).find("2147483650 bytes") == std::string::npos)
        fail(std::string("2 GiB + 2 bytes refused as ") + kind_name(e.kind()) + ": " + e.what());
    }
  }
  checked_all_reduce(comm);  // the refusals left the transport usable
  say("PASS large-message");
  return 0;
}

// A dropped send never blocks the caller: MPI cannot cancel it, so it is handed to MPI,
// which delivers it when the receiver comes (the caller keeps the buffer until then).
int drop_send() {
  auto comm = two_ranks("drop-send");
  checked_all_reduce(comm);
  std::vector<std::byte> large(std::size_t{16} << 20, std::byte{0x5A});
  if (my_rank == 0) {
    std::optional<gw::transport::mpi::request> sent(comm.transport().async_send(1, 4246, large));
    const long before = mpi_tests;
    sent.reset();  // rank 1 has posted no receive: the send cannot have completed
    if (const long tested = mpi_tests - before; tested != 0)
      fail("dropping a send that had not completed tested it " + std::to_string(tested) +
           " times, waiting for it, instead of handing it to MPI");
  }
  col::barrier(comm);  // only now does rank 1 receive
  if (my_rank == 1) {
    std::fill(large.begin(), large.end(), std::byte{0});
    auto received = comm.transport().async_recv(0, 4246, large);
    comm.transport().wait(received, within());
    const auto wrong = std::count_if(large.begin(), large.end(), [](std::byte b) { return b != std::byte{0x5A}; });
    if (wrong != 0) fail(std::to_string(wrong) + " bytes of the dropped send arrived wrong");
  }
  col::barrier(comm);  // rank 0 keeps its buffer until rank 1 has the message
  say("PASS drop-send");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string arg = argc > 2 ? argv[2] : "";
  try {
    if (mode == "thread-level") return thread_level(arg);
    if (mode == "recovery") return recovery(arg);
    if (mode == "imrecv-fails") return imrecv_fails();
    if (mode == "drop-arriving") return drop_arriving();
    if (mode == "comm-freed") return comm_freed();
    if (mode == "large-message") return large_message();
    if (mode == "drop-send") return drop_send();
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::fprintf(stderr, "usage: mpi_runtime_worker thread-level single|funneled|serialized|multiple | recovery DIR | imrecv-fails | drop-arriving | comm-freed | large-message | drop-send\n");
  return 2;
}
