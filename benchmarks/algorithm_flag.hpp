// The all-reduce benchmarks' --algorithm flag: which gradwire all_reduce runs (auto: the library's choice by size).
#pragma once

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <gradwire/collective/all_reduce.hpp>
#include <span>
#include <string_view>

namespace gradwire::bench {

enum class algorithm { automatic, ring, halving_doubling, hierarchical };

inline const char* name_of(algorithm a) {
  return a == algorithm::ring               ? "ring"
         : a == algorithm::halving_doubling ? "halving_doubling"
         : a == algorithm::hierarchical     ? "hierarchical"
                                            : "auto";
}

template <class Tr>
void run_all_reduce(algorithm a, collective::communicator<Tr>& comm, std::span<float> data) {
  switch (a) {
    case algorithm::ring: return collective::all_reduce<collective::ring>(comm, data);
    case algorithm::halving_doubling: return collective::all_reduce<collective::halving_doubling>(comm, data);
    case algorithm::hierarchical: return collective::all_reduce<collective::hierarchical>(comm, data);
    case algorithm::automatic: return collective::all_reduce(comm, data);
  }
}

// Takes "FLAG VALUE" out of argv (the shared parser does not know it) and returns the
// value, `fallback` if the flag is absent; exits with status 2 on a value not in `choices`.
inline std::string take_choice_flag(int& argc, char** argv, std::string_view flag,
                                    std::initializer_list<std::string_view> choices, std::string_view fallback) {
  std::string chosen(fallback);
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != flag) continue;
    const std::string_view value = i + 1 < argc ? argv[i + 1] : "";
    if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
      std::string list;
      for (auto c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
      std::fprintf(stderr, "%s: %.*s takes one of %s, got '%.*s'\n", argv[0], static_cast<int>(flag.size()),
                   flag.data(), list.c_str(), static_cast<int>(value.size()), value.data());
      std::exit(2);
    }
    chosen = value;
    for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
    argc -= 2;
    --i;
  }
  return chosen;
}

// Takes "--algorithm ring|halving_doubling|hierarchical|auto" out of argv.
inline algorithm take_algorithm_flag(int& argc, char** argv) {
  const std::string a =
      take_choice_flag(argc, argv, "--algorithm", {"ring", "halving_doubling", "hierarchical", "auto"}, "auto");
  return a == "ring"               ? algorithm::ring
         : a == "halving_doubling" ? algorithm::halving_doubling
         : a == "hierarchical"     ? algorithm::hierarchical
                                   : algorithm::automatic;
}

}  // namespace gradwire::bench
