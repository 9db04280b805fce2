# GRADWIRE_SANITIZE: builds every target of this project (tests, the multi-process workers,
# examples and snippets that tests run) with a sanitizer; scripts/sanitize configures it.
#   address: AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer, any UB report
#            ends the process (-fno-sanitize-recover), so a test cannot pass over it;
#   thread:  ThreadSanitizer.
# Only this project's targets get the flags (add_compile_options at the top level, before
# its subdirectories); the installed package and its consumers never do.
set(GRADWIRE_SANITIZE "" CACHE STRING "Sanitize every target of this build: address (ASan+UBSan), thread (TSan) or empty")
set_property(CACHE GRADWIRE_SANITIZE PROPERTY STRINGS "" address thread)
if(GRADWIRE_SANITIZE STREQUAL "")
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  message(FATAL_ERROR "gradwire: GRADWIRE_SANITIZE needs g++ or clang++ (found ${CMAKE_CXX_COMPILER_ID})")
endif()
# GRADWIRE_TEST_TIMEOUT_SCALE: how much slower tests run instrumented; a test whose time
# limit is tight for its normal run multiplies it by this (ASan about 2x; TSan 10-50x on
# lock-heavy code: the top-k tutorial takes 3 s, and 600 s under TSan on 2 loaded cores).
# ctest --timeout, which scripts/sanitize raises, only sets the limit of tests that have none.
if(GRADWIRE_SANITIZE STREQUAL "address")
  set(gradwire_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  set(GRADWIRE_TEST_TIMEOUT_SCALE 3)
elseif(GRADWIRE_SANITIZE STREQUAL "thread")
  set(gradwire_sanitize_flags -fsanitize=thread)
  set(GRADWIRE_TEST_TIMEOUT_SCALE 10)
  # g++ warns once per inlined use that TSan does not model atomic_thread_fence, which
  # Boost.Asio's handler blocks use (thousands of lines per TU); gradwire's code has no fences.
  set(gradwire_sanitize_compile_only $<$<CXX_COMPILER_ID:GNU>:-Wno-tsan>)
else()
  message(FATAL_ERROR "gradwire: GRADWIRE_SANITIZE=${GRADWIRE_SANITIZE}: use address, thread or leave it empty")
endif()
if(GRADWIRE_HAS_CUDA)
  message(FATAL_ERROR "gradwire: GRADWIRE_SANITIZE does not instrument nvcc's host code; configure with "
                      "-DGRADWIRE_CUDA=OFF (compute-sanitizer checks the device side)")
endif()
# Frame pointers: the reports' stacks unwind through every frame (fast unwinder).
list(APPEND gradwire_sanitize_flags -fno-omit-frame-pointer)
add_compile_options(${gradwire_sanitize_flags} ${gradwire_sanitize_compile_only})
add_link_options(${gradwire_sanitize_flags})
message(STATUS "gradwire: every target built with ${gradwire_sanitize_flags}")
