// Eigen/Core for the example's headers, without GCC 12's false uninitialized warnings from AVX-512.
//
// With -march=native on an AVX-512 machine, GCC 12 warns that '__Y' "may be used
// uninitialized" inside its own avx512fintrin.h wherever Eigen's packet code is inlined:
// the _mm512_undefined_* helpers are self-initialised on purpose (GCC bug 105593). GCC
// checks the pragmas at each inlined location, so silencing the two warnings where Eigen
// is first included covers Eigen's code and nothing of ours.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#else
#include <Eigen/Core>
#endif
