# cmake -DCXX=... -DSOURCE=... -DINCLUDE=... -DFLAGS="..." -P expect_vectorised.cmake
# Compiles SOURCE with FLAGS and -fopt-info-vec-optimized and fails unless GCC reports
# "loop vectorized" for the loop after every GRADWIRE_VECTORIZE in kernels/host.hpp and in
# the codecs (compress/): a loop edited into something the auto-vectoriser refuses is
# caught here.
# The headers whose marked loops are checked: the host kernels and the gradient codecs.
file(GLOB_RECURSE codecs RELATIVE ${INCLUDE} ${INCLUDE}/gradwire/compress/*.hpp)
list(SORT codecs)
set(headers gradwire/kernels/host.hpp ${codecs})
set(expected "")  # file:line pairs, the line of each marked loop
foreach(header IN LISTS headers)
  file(STRINGS ${INCLUDE}/${header} lines)
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    if(line MATCHES "^[ \t]*GRADWIRE_VECTORIZE(_OR\\([a-z_]+\\))?[ \t]*$")
      math(EXPR loop "${number} + 1")
      list(APPEND expected "${header}:${loop}")
    endif()
  endforeach()
endforeach()
list(LENGTH expected count)
if(count EQUAL 0)
  message(FATAL_ERROR "no GRADWIRE_VECTORIZE loops found in ${headers}")
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
foreach(place IN LISTS expected)
  string(REGEX REPLACE ":[0-9]+$" "" header "${place}")
  string(REGEX REPLACE "^.*:" "" loop "${place}")
  get_filename_component(file "${header}" NAME)
  string(REPLACE "." "\\." file "${file}")
  # GCC reports a loop at its `for` line or, for a braced body, at the body's first line.
  math(EXPR body "${loop} + 1")
  if(NOT "${out}${err}" MATCHES "${file}:(${loop}|${body}):[0-9]+: optimized: loop vectorized")
    list(APPEND missing ${place})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "with ${FLAGS}, GCC did not vectorise the marked loops at ${missing}:\n${err}")
endif()
message(STATUS "with ${FLAGS}: all ${count} marked loops vectorised (${expected})")
