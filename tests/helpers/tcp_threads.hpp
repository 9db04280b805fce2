// Test helper: a job of asio_tcp ranks as threads of the test process (a free loopback port, one thread a rank, errors rethrown).
#pragma once

#include <boost/asio.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <gradwire/asio.hpp>
#include <string>
#include <thread>
#include <vector>

namespace gradwire::testing {

// A loopback port that was free a moment ago (the store's listener binds it next).
inline std::uint16_t free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

// Runs fn(transport) for ranks 0..ranks-1 of one asio_tcp job, a thread each, and rethrows
// the first rank's exception after every thread has joined. fn must not use Catch2's
// assertions (not thread-safe): it records, the caller checks.
template <class Fn>
void run_tcp_threads(int ranks, const std::string& job_token, Fn&& fn) {
  const std::uint16_t port = free_port();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        transport::asio_tcp_options o;
        o.rank = r;
        o.size = ranks;
        o.job_token = job_token;
        o.store_port = port;
        fn(transport::asio_tcp(o));
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace gradwire::testing
