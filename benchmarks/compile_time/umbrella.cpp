// A translation unit that includes the umbrella header and nothing else: the floor every
// user pays. Not built by CMake; benchmarks/compile_time.sh measures it.
#include <gradwire/gradwire.hpp>
