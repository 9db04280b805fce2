# cmake -DCXX=... -DINCLUDE=... -DHEADER=gradwire/x.hpp -DFORBIDDEN=regex ["-DFLAGS=a b"] -P includes_only.cmake
# Passes when a translation unit made of `#include <HEADER>` alone compiles and reads no
# header whose path matches FORBIDDEN: a header includes what it uses, and a user who
# names one strategy does not compile the others (scripts/header-cost measures the cost).
if(NOT FLAGS)
  set(FLAGS "-std=c++20 -fsyntax-only")
endif()
separate_arguments(FLAGS UNIX_COMMAND "${FLAGS}")
string(MAKE_C_IDENTIFIER "${HEADER}" name)
set(tu "${CMAKE_CURRENT_BINARY_DIR}/includes_only_${name}.cpp")
file(WRITE "${tu}" "#include <${HEADER}>\n")
# -H lists every header read, one per line, on stderr.
execute_process(COMMAND ${CXX} ${FLAGS} -H -I${INCLUDE} ${tu} RESULT_VARIABLE result ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "<${HEADER}> does not compile alone:\n${err}")
endif()
# -H prints ". path" per header (more dots: deeper); match FORBIDDEN against each of
# gradwire's own headers as a path under INCLUDE (gradwire/ps/agent.hpp).
get_filename_component(root "${INCLUDE}" REALPATH)
string(REGEX MATCHALL "(^|\n)\\.+ [^\n]+" lines "${err}")
set(found "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^\n?\\.+ " "" path "${line}")
  get_filename_component(path "${path}" REALPATH)
  file(RELATIVE_PATH rel "${root}" "${path}")
  if(rel MATCHES "^gradwire/" AND rel MATCHES "${FORBIDDEN}")
    list(APPEND found "${rel}")
  endif()
endforeach()
list(REMOVE_DUPLICATES found)
if(found)
  list(JOIN found "\n" found)
  message(FATAL_ERROR "<${HEADER}> reads headers it does not need (matching '${FORBIDDEN}'):\n${found}")
endif()
message(STATUS "<${HEADER}> compiles alone and reads nothing matching '${FORBIDDEN}'")
