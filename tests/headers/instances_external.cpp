// Compiled mode: a program that uses the collectives over a shipped transport refers to the
// runtime's copies (src/) and emits none of its own (instances/, docs/building.md).
// instances_external.cmake reads this object's symbols. Taking each function's address
// odr-uses it, so the object either defines it (implicit instantiation) or refers to it.
// GRADWIRE_TEST_HEADER and GRADWIRE_TEST_TRANSPORT name the transport (CMakeLists.txt).
#include GRADWIRE_TEST_HEADER

namespace gradwire {
namespace {

using Tr = transport::GRADWIRE_TEST_TRANSPORT;
template <class V>
using all_reduce_fn = void (*)(collective::communicator<Tr>&, std::span<V>, collective::reduce_op);

template <class V>
void refer(std::vector<void*>& out) {
  const all_reduce_fn<V> all_reduces[] = {
      &collective::ring_all_reduce<Tr, V>,       &collective::halving_doubling_all_reduce<Tr, V>,
      &collective::one_shot_all_reduce<Tr, V>,   &collective::hierarchical_all_reduce<Tr, V>,
      &collective::all_reduce<collective::auto_, Tr, V>};
  for (auto f : all_reduces) out.push_back(reinterpret_cast<void*>(f));
  void (*broadcast)(collective::communicator<Tr>&, std::span<V>, int) = &collective::broadcast<Tr, V>;
  out.push_back(reinterpret_cast<void*>(broadcast));
}

}  // namespace
}  // namespace gradwire

std::vector<void*> gradwire_test_instances() {
  std::vector<void*> out;
  gradwire::refer<float>(out);
  gradwire::refer<double>(out);
  void (*check)(gradwire::collective::communicator<gradwire::Tr>&, gradwire::dtype, std::span<const gradwire::shape>) =
      &gradwire::collective::check_same_model<gradwire::Tr>;
  out.push_back(reinterpret_cast<void*>(check));
  return out;
}
