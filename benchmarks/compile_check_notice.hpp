// Included first in every benchmark translation unit of a build configured with
// GRADWIRE_TEST_OPTIMIZATION (benchmarks/CMakeLists.txt): such a build compiles the
// benchmarks only to check that they still compile, at the tests' optimisation, so their
// timings are not the library's. Says so once per program, on stderr, before main.
#pragma once
#include <cstdio>

namespace gradwire::bench::detail {
inline const bool compile_check_notice_printed =
    (std::fprintf(stderr,
                  "benchmark: this binary was compiled at " GRADWIRE_BENCH_COMPILE_CHECK
                  " as a compile check (GRADWIRE_TEST_OPTIMIZATION): its timings are not the library's;"
                  " measure with scripts/bench or the scripts in benchmarks/, which build their own folder\n"),
     true);
}  // namespace gradwire::bench::detail
