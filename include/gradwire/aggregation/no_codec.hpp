// aggregation::no_codec: the Codec of an aggregation whose values travel uncompressed (averaging's and parameter_server's default).
#pragma once

namespace gradwire::aggregation {

// An aggregation's Codec when there is none: values travel as V, and no code for a codec is
// compiled (the aggregations branch on it with if constexpr).
struct no_codec {};

}  // namespace gradwire::aggregation
