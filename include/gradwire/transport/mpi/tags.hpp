// How gradwire's 64-bit tags become MPI's int tags, and the tag kept for the transport's own control messages.
//
// MPI tags are ints from 0 to MPI_TAG_UB, which the standard lets be as low as 32767;
// gradwire's are up to 2^48 (collective::make_tag: sequence << 16 | step; the parameter
// server's and per_peer's sit far above). So a message travels under a fold of its tag:
// the tag's chunks of log2(W) bits XOR-ed together, W the largest power of two <= MPI_TAG_UB
// (2^30 under OpenMPI), and the MPI tag W itself carries control messages (an abort).
//
// Why that is safe without carrying the full tag (which would cost a header, a copy or a
// derived datatype on every message): tags below W fold to themselves, and the tags of
// one collective differ only in their step, which a fold keeps apart. Two tags that do
// fold together (operations thousands of sequence numbers apart, or a user's tags above
// W) still match correctly by MPI's non-overtaking rule, which pairs the messages of one
// (source, tag, communicator) in the order they were sent with the receives in the order
// they were posted, as long as both ranks post them in the same order. gradwire's
// collectives do: they run one at a time, in order, on every rank. A mix-up that slips
// through anyway meets the size check (a mismatch error), not silent corruption, unless
// the sizes agree too. Code that posts its own messages out of order should keep its
// tags below W (mpi::tag_limit()).
#pragma once

#include <bit>
#include <cstdint>

namespace gradwire::transport::detail {

struct mpi_tags {
  // From MPI_TAG_UB (>= 32767 by the standard).
  explicit mpi_tags(int tag_ub) noexcept
      : bits(std::bit_width(static_cast<std::uint64_t>(tag_ub)) - 1), limit(std::uint64_t{1} << bits) {}

  int fold(std::uint64_t tag) const noexcept {
    std::uint64_t folded = 0;
    for (; tag != 0; tag >>= bits) folded ^= tag & (limit - 1);
    return static_cast<int>(folded);
  }
  int control() const noexcept { return static_cast<int>(limit); }

  int bits;              // log2(W)
  std::uint64_t limit;   // W: data tags fold into [0, W); W is the control tag
};

}  // namespace gradwire::transport::detail
