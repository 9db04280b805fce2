# cmake -DSOURCE_DIR=... -DWORK_DIR=... -P install_and_consume.cmake
# Installs gradwire into a fresh prefix, then builds and runs a consumer that finds it
# with find_package(gradwire CONFIG REQUIRED).
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}")
  endif()
endfunction()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DGRADWIRE_BUILD_TESTS=OFF
    -DGRADWIRE_BUILD_EXAMPLES=OFF -DGRADWIRE_BUILD_BENCHMARKS=OFF -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/build)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/consumer
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)
message(STATUS "find_package(gradwire) consumer built and ran")
