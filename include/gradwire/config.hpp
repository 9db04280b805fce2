// How gradwire's non-template code is compiled: in every translation unit (header-only) or once, in a library.
//
// Header-only is the default: `#include` is all a program needs. Defining
// GRADWIRE_SEPARATE_COMPILATION (CMake's gradwire::gradwire and its components do, and
// link the library built from src/) turns the definitions in the *.ipp files into
// declarations, so a translation unit no longer parses, instantiates and optimises the
// transports' engines, the rendezvous store or cluster detection: one library compiles them
// once (docs/building.md). Every translation unit of one program must agree on the mode.
#pragma once

#if defined(GRADWIRE_SEPARATE_COMPILATION)
#define GRADWIRE_HEADER_ONLY 0
#define GRADWIRE_DECL
#else
#define GRADWIRE_HEADER_ONLY 1
#define GRADWIRE_DECL inline
#endif
