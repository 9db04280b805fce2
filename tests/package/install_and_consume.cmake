# cmake -DSOURCE_DIR=... -DBUILD_DIR=... -DWORK_DIR=... -DCOMPONENTS=asio,ucx,mpi,cuda [-DCUDA_COMPILER=...]
#       -P install_and_consume.cmake
#
# 1. Installs this build of gradwire (BUILD_DIR: the components it has, its runtime as it
#    compiled it, as `cmake --install` after a build does for a user) into a fresh prefix,
#    then builds and runs a consumer that asks for them: find_package(gradwire CONFIG
#    REQUIRED COMPONENTS ...), linking the compiled targets, then the header-only ones; then
#    the same consumer with gradwire as its subdirectory.
# 2. Installs a core-only gradwire into another prefix: asking it for a component it lacks,
#    or for one that does not exist, must stop the consumer's configure with a message
#    that names the component and what to do.
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}")
  endif()
endfunction()
# Runs a command that must fail with output containing every one of `needles`.
function(expect_failure needles)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(result EQUAL 0)
    message(FATAL_ERROR "expected a failure, but it succeeded: ${ARGN}\n${out}")
  endif()
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")  # CMake wraps long messages
  foreach(needle IN LISTS needles)
    string(FIND "${flat}" "${needle}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the failure does not say \"${needle}\": ${ARGN}\n${out}")
    endif()
  endforeach()
endfunction()
set(off -DGRADWIRE_BUILD_TESTS=OFF -DGRADWIRE_BUILD_EXAMPLES=OFF -DGRADWIRE_BUILD_BENCHMARKS=OFF)
# Release at -O1: these builds check packaging, not code generation (-O3 took 1.4x the CPU).
set(consumer_flags -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")
if(CUDA_COMPILER)
  list(APPEND consumer_flags -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()

# 1. Everything this build has.
# The runtime that this build compiled (ctest runs after the build), not a third compile of it.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/consumer ${consumer_flags}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix "-DGRADWIRE_COMPONENTS=${COMPONENTS}")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)
message(STATUS "find_package(gradwire COMPONENTS ${COMPONENTS}): the consumer built and ran")
# The same installation, consumed header-only (gradwire::header_only, <component>_header_only):
# the consumer must not link the runtime, and must still build and run.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/consumer-header-only ${consumer_flags}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix "-DGRADWIRE_COMPONENTS=${COMPONENTS}" -DGRADWIRE_CONSUMER_HEADER_ONLY=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-header-only)
run(${WORK_DIR}/consumer-header-only/consumer)
file(STRINGS ${WORK_DIR}/consumer-header-only/CMakeFiles/consumer.dir/link.txt link_line)
if(link_line MATCHES "libgradwire")
  message(FATAL_ERROR "the header-only consumer links gradwire's runtime: ${link_line}")
endif()
message(STATUS "the same installation consumed header-only: the consumer built and ran without the runtime")
# The consumer must have asked for every component this build has (not lost on the way).
file(STRINGS ${WORK_DIR}/consumer/CMakeCache.txt asked REGEX "^GRADWIRE_COMPONENTS:")
if(NOT asked STREQUAL "GRADWIRE_COMPONENTS:STRING=${COMPONENTS}")
  message(FATAL_ERROR "the consumer was configured with ${asked}, not ${COMPONENTS}")
endif()

# gradwire as a subdirectory of the consumer's build (its runtime built there, compiled mode).
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/consumer-subdirectory ${consumer_flags}
    "-DGRADWIRE_COMPONENTS=${COMPONENTS}" -DGRADWIRE_CONSUMER_SOURCE_DIR=${SOURCE_DIR})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-subdirectory)
run(${WORK_DIR}/consumer-subdirectory/consumer)
message(STATUS "add_subdirectory(gradwire): the consumer built and ran")

# 2. A core-only, header-only installation.
# Header-only (GRADWIRE_HEADER_ONLY=ON): nothing to build before installing it.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/core-build ${off} -DGRADWIRE_ASIO=OFF -DGRADWIRE_UCX=OFF -DGRADWIRE_MPI=OFF
    -DGRADWIRE_CUDA=OFF -DGRADWIRE_HEADER_ONLY=ON -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/core-prefix)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/core-build)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/core-consumer ${consumer_flags}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/core-prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/core-consumer)
run(${WORK_DIR}/core-consumer/consumer)
expect_failure("component 'ucx' is not in this installation;it was configured without it;-DGRADWIRE_UCX=ON;libucx-dev;Installed components: none."
  ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/missing ${consumer_flags}
  -DCMAKE_PREFIX_PATH=${WORK_DIR}/core-prefix "-DGRADWIRE_COMPONENTS=ucx")
expect_failure("gradwire has no component 'nccl'"
  ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/unknown ${consumer_flags}
  -DCMAKE_PREFIX_PATH=${WORK_DIR}/core-prefix "-DGRADWIRE_COMPONENTS=nccl")
message(STATUS "a missing or unknown component is a clear configure error")
