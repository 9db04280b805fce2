# cmake -DNM=... -DOBJECT=file.o -DTRANSPORT=asio_tcp -P instances_external.cmake
# Passes when OBJECT (instances_external.cpp compiled for TRANSPORT in compiled mode) refers
# to every collective the runtime instantiates for TRANSPORT and defines none of them: the
# `extern template` declarations in include/gradwire/instances/ hold.
execute_process(COMMAND ${NM} -C ${OBJECT} RESULT_VARIABLE result OUTPUT_VARIABLE symbols ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} ${OBJECT} failed: ${err}")
endif()
set(names "ring_all_reduce<" "halving_doubling_all_reduce<" "one_shot_all_reduce<" "hierarchical_all_reduce<"
          "all_reduce<gradwire::collective::auto_," "broadcast<" "check_same_model<")
set(defined "")
set(missing "")
foreach(name IN LISTS names)
  # nm -C: "<address> W void gradwire::collective::NAME<gradwire::transport::TRANSPORT, float>(...)"
  string(REGEX MATCHALL "[^\n]* [A-Za-z] [^\n]*gradwire::collective::${name}[^\n]*gradwire::transport::${TRANSPORT}[,>][^\n]*"
         lines "${symbols}")
  if(NOT lines)
    list(APPEND missing "${name}")
  endif()
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^ +U ")
      list(APPEND defined "${line}")
    endif()
  endforeach()
endforeach()
if(missing)
  message(FATAL_ERROR "${OBJECT} does not refer to the collectives ${missing} over ${TRANSPORT} (the test no longer uses them)")
endif()
if(defined)
  list(JOIN defined "\n" defined)
  message(FATAL_ERROR "compiled mode: a translation unit instantiated its own copy of collectives over ${TRANSPORT} "
                      "(the extern template declarations in include/gradwire/instances/ no longer cover them):\n${defined}")
endif()
message(STATUS "compiled mode: the collectives over ${TRANSPORT} are the runtime's (the object refers to them, defines none)")
