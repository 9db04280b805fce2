# cmake -DCXX=... -DSOURCE=... -DINCLUDE=... -DCASE=N -DEXPECT=regex ["-DFLAGS=a b"] -P expect_compile_error.cmake
# Passes when compiling SOURCE with -DCASE=N fails with output matching EXPECT, or,
# for EXPECT "", when it compiles cleanly (the control case). FLAGS: how CXX checks a
# source without building it (default: -std=c++20 -fsyntax-only; nvcc: -std=c++20 -cuda,
# its front end only, into the working directory).
if(NOT FLAGS)
  set(FLAGS "-std=c++20 -fsyntax-only")
endif()
separate_arguments(FLAGS UNIX_COMMAND "${FLAGS}")
execute_process(
  COMMAND ${CXX} ${FLAGS} -I${INCLUDE} -DCASE=${CASE} ${SOURCE}
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(EXPECT STREQUAL "")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "control case ${CASE} should compile but failed:\n${err}")
  endif()
  return()
endif()
if(result EQUAL 0)
  message(FATAL_ERROR "case ${CASE} compiled, but it must be rejected with: ${EXPECT}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "case ${CASE} failed to compile, but without the message '${EXPECT}':\n${err}")
endif()
message(STATUS "case ${CASE} rejected as expected: ${CMAKE_MATCH_0}")
