// Compiled by ctest with -DCASE=N: a rendezvous store that misses one member of
// concepts::rendezvous_store is refused where a function takes the concept, naming it.
// CASE=0 is the control that must compile.
#include <gradwire/rendezvous/host_identity.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace gw = gradwire;

// Every member but the one each case leaves out.
template <bool Set, bool Get, bool Timeout>
struct store {
  void set(const std::string&, std::span<const std::byte>)
    requires Set
  {}
  std::vector<std::byte> get(const std::string&)
    requires Get
  {
    return {};
  }
  void set_timeout(std::chrono::milliseconds)
    requires Timeout
  {}
};

#if CASE == 0
using S = store<true, true, true>;
static_assert(gw::concepts::rendezvous_store<S> && !gw::concepts::rendezvous_store<store<true, false, true>>);
#elif CASE == 1
using S = store<false, true, true>;  // no set
#elif CASE == 2
using S = store<true, false, true>;  // no get
#elif CASE == 3
using S = store<true, true, false>;  // no set_timeout
#endif

// What a join does with its store.
void join(S& s) { (void)gw::rendezvous::exchange_topology(s, "p/", 0, 1, "id", "name", std::chrono::seconds(1)); }

int main() {}
