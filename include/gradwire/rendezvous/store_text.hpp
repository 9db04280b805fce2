// Text through any rendezvous store (concepts::rendezvous_store): a string travels as its bytes.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"

namespace gradwire::rendezvous {

template <concepts::rendezvous_store Store>
void set_text(Store& store, const std::string& key, const std::string& text) {
  store.set(key, std::as_bytes(std::span(text.data(), text.size())));
}

// Waits as store.get(key) does.
template <concepts::rendezvous_store Store>
std::string get_text(Store& store, const std::string& key) {
  const std::vector<std::byte> v = store.get(key);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

}  // namespace gradwire::rendezvous
