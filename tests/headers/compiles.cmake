# cmake -DCXX=... -DINCLUDE=... -DSOURCE=file.cpp ["-DFLAGS=a b"] -P compiles.cmake
# Passes when SOURCE compiles (-fsyntax-only): checks written as static_asserts, run as a test
# so that a failing one is a failed test, not a broken build.
separate_arguments(FLAGS UNIX_COMMAND "${FLAGS}")
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only ${FLAGS} -I${INCLUDE} ${SOURCE}
                RESULT_VARIABLE result ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} does not compile:\n${err}")
endif()
message(STATUS "${SOURCE} compiles")
