// The all-reduce benchmarks' --algorithm flag: which gradwire all_reduce runs (auto: the library's choice by size).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <gradwire/collective/all_reduce.hpp>
#include <span>
#include <string_view>

namespace gradwire::bench {

enum class algorithm { automatic, ring, halving_doubling };

inline const char* name_of(algorithm a) {
  return a == algorithm::ring ? "ring" : a == algorithm::halving_doubling ? "halving_doubling" : "auto";
}

template <class Tr>
void run_all_reduce(algorithm a, collective::communicator<Tr>& comm, std::span<float> data) {
  switch (a) {
    case algorithm::ring: return collective::all_reduce<collective::ring>(comm, data);
    case algorithm::halving_doubling: return collective::all_reduce<collective::halving_doubling>(comm, data);
    case algorithm::automatic: return collective::all_reduce(comm, data);
  }
}

// Takes "--algorithm X" out of argv (the shared parser does not know it); exits with
// status 2 on a value it does not know.
inline algorithm take_algorithm_flag(int& argc, char** argv) {
  algorithm a = algorithm::automatic;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--algorithm") continue;
    const std::string_view value = i + 1 < argc ? argv[i + 1] : "";
    if (value == "ring") a = algorithm::ring;
    else if (value == "halving_doubling") a = algorithm::halving_doubling;
    else if (value == "auto") a = algorithm::automatic;
    else {
      std::fprintf(stderr, "%s: --algorithm takes ring, halving_doubling or auto, got '%.*s'\n", argv[0],
                   static_cast<int>(value.size()), value.data());
      std::exit(2);
    }
    for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
    argc -= 2;
    --i;
  }
  return a;
}

}  // namespace gradwire::bench
