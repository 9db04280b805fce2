# cmake -DNM=... -DOBJECT=file.o -DTRANSPORT=asio_tcp -P instances_external.cmake
# Passes when OBJECT (instances_external.cpp compiled for TRANSPORT in compiled mode) refers
# to every collective the runtime instantiates for TRANSPORT and defines none of them: the
# `extern template` declarations in include/gradwire/instances/ hold.
execute_process(COMMAND ${NM} -C ${OBJECT} RESULT_VARIABLE result OUTPUT_VARIABLE symbols ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} ${OBJECT} failed: ${err}")
endif()
set(tr "gradwire::transport::${TRANSPORT}")
set(names "collective::check_same_model<${tr}>" "collective::communicator<${tr}>::async")
foreach(v float double)
  list(APPEND names "collective::ring_all_reduce<${tr}, ${v}>" "collective::halving_doubling_all_reduce<${tr}, ${v}>"
       "collective::one_shot_all_reduce<${tr}, ${v}>" "collective::hierarchical_all_reduce<${tr}, ${v}>"
       "collective::all_reduce<gradwire::collective::auto_, ${tr}, ${v}>" "collective::broadcast<${tr}, ${v}>"
       "aggregation::all_reduce_agent<gradwire::collective::auto_, ${v}, ${tr}>::setup")
endforeach()
set(defined "")
set(missing "")
foreach(name IN LISTS names)
  # nm -C: "<address or blanks> <type letter> [void ]gradwire::NAME..."; U: undefined here.
  string(REGEX MATCHALL "[^\n]* [A-Za-z] (void )?gradwire::${name}[^\n]*" lines "${symbols}")
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
  list(JOIN missing "\n" missing)
  message(FATAL_ERROR "${OBJECT} does not refer to these instances over ${TRANSPORT} (the test no longer uses them):\n${missing}")
endif()
if(defined)
  list(JOIN defined "\n" defined)
  message(FATAL_ERROR "compiled mode: a translation unit instantiated its own copy of collectives over ${TRANSPORT} "
                      "(the extern template declarations in include/gradwire/instances/ no longer cover them):\n${defined}")
endif()
message(STATUS "compiled mode: the collectives over ${TRANSPORT} are the runtime's (the object refers to them, defines none)")
