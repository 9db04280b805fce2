# cmake -DCXX=... -DSOURCE=... -DINCLUDE=... -DCASE=N -DEXPECT=regex -P expect_compile_error.cmake
# Passes when compiling SOURCE with -DCASE=N fails with output matching EXPECT, or,
# for EXPECT "", when it compiles cleanly (the control case).
execute_process(
  COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE} -DCASE=${CASE} ${SOURCE}
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
