# cmake -DCXX=... -DSOURCE=... -DINCLUDE=... -DFLAGS="..." -P expect_vectorised.cmake
# Compiles SOURCE with FLAGS and -fopt-info-vec-optimized and fails unless GCC reports
# "loop vectorized" for the loop after every GRADWIRE_VECTORIZE in kernels/host.hpp:
# a kernel edited into something the auto-vectoriser refuses is caught here.
set(header ${INCLUDE}/gradwire/kernels/host.hpp)
file(STRINGS ${header} lines)
set(number 0)
set(expected "")
foreach(line IN LISTS lines)
  math(EXPR number "${number} + 1")
  if(line MATCHES "^[ \t]*GRADWIRE_VECTORIZE(_OR\\([a-z_]+\\))?[ \t]*$")
    math(EXPR loop "${number} + 1")
    list(APPEND expected ${loop})
  endif()
endforeach()
list(LENGTH expected count)
if(count EQUAL 0)
  message(FATAL_ERROR "no GRADWIRE_VECTORIZE loops found in ${header}")
endif()
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
execute_process(
  COMMAND ${CXX} -std=c++20 ${flags} -fno-math-errno -fopenmp-simd -DGRADWIRE_OPENMP_SIMD -fopt-info-vec-optimized
          -I${INCLUDE} -c ${SOURCE} -o /dev/null
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} failed:\n${err}")
endif()
set(missing "")
foreach(loop IN LISTS expected)
  # GCC reports a loop at its `for` line or, for a braced body, at the body's first line.
  math(EXPR body "${loop} + 1")
  if(NOT "${out}${err}" MATCHES "host\\.hpp:(${loop}|${body}):[0-9]+: optimized: loop vectorized")
    list(APPEND missing ${loop})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "with ${FLAGS}, GCC did not vectorise the kernel loops at host.hpp lines ${missing}:\n${err}")
endif()
message(STATUS "with ${FLAGS}: all ${count} kernel loops vectorised (host.hpp lines ${expected})")
