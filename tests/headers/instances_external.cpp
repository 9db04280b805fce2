// Compiled mode: a program that uses the collectives over a shipped transport refers to the
// runtime's copies (src/) and emits none of its own (instances/, docs/building.md).
// instances_external.cmake reads this object's symbols. Taking a function's address
// odr-uses it, so the object either defines it (implicit instantiation) or refers to it;
// for the two classes, one member each stands for the class's explicit instantiation.
// GRADWIRE_TEST_HEADER and GRADWIRE_TEST_TRANSPORT name the transport (CMakeLists.txt).
#include GRADWIRE_TEST_HEADER

#include <cstring>
#include <vector>

namespace gradwire {
namespace {

using Tr = transport::GRADWIRE_TEST_TRANSPORT;
template <class V>
using all_reduce_fn = void (*)(collective::communicator<Tr>&, std::span<V>, collective::reduce_op);

template <class F>
void* address(F f) {
  void* out = nullptr;
  static_assert(sizeof(F) >= sizeof(out));
  std::memcpy(&out, &f, sizeof(out));  // a member function pointer's first word is the function here (Itanium ABI)
  return out;
}

template <class V>
void refer(std::vector<void*>& out) {
  const all_reduce_fn<V> all_reduces[] = {
      &collective::ring_all_reduce<Tr, V>,     &collective::halving_doubling_all_reduce<Tr, V>,
      &collective::one_shot_all_reduce<Tr, V>, &collective::hierarchical_all_reduce<Tr, V>,
      &collective::all_reduce<collective::auto_, Tr, V>};
  for (auto f : all_reduces) out.push_back(address(f));
  void (*broadcast)(collective::communicator<Tr>&, std::span<V>, int) = &collective::broadcast<Tr, V>;
  out.push_back(address(broadcast));
  out.push_back(address(&aggregation::all_reduce_agent<collective::auto_, V, Tr>::setup));
}

}  // namespace
}  // namespace gradwire

std::vector<void*> gradwire_test_instances() {
  using namespace gradwire;
  std::vector<void*> out;
  refer<float>(out);
  refer<double>(out);
  void (*check)(collective::communicator<Tr>&, dtype, std::span<const shape>) = &collective::check_same_model<Tr>;
  out.push_back(address(check));
  out.push_back(address(&collective::communicator<Tr>::async));
  return out;
}
