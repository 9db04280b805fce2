// One rank's place in a binomial tree rooted at `root` (broadcast and the tree reduce).
#pragma once

#include <array>
#include <cstddef>
#include <span>

namespace gradwire::collective::detail {

// Ranks relative to the root: relative rank v hangs under v - m, where m is v's lowest
// set bit, and its children are v + m' for every smaller power of two m' that stays
// below N (at the root: every power of two below N). Children are listed largest subtree
// first, the order a broadcast forwards in.
class binomial_tree {
 public:
  binomial_tree(int ranks, int rank, int root) : ranks_(ranks), root_(root) {
    const int relative = (rank - root + ranks) % ranks;
    int mask = 1;
    for (; mask < ranks; mask <<= 1)
      if (relative & mask) {
        parent_ = rank_of(relative - mask);
        break;
      }
    for (int m = mask >> 1; m > 0; m >>= 1)
      if (relative + m < ranks) peers_[children_++] = rank_of(relative + m);
    if (parent_ >= 0) peers_[children_] = parent_;
  }

  int parent() const noexcept { return parent_; }  // -1 at the root
  std::span<const int> children() const noexcept { return {peers_.data(), children_}; }
  // The children, then the parent: every rank this one exchanges data with.
  std::span<const int> peers() const noexcept { return {peers_.data(), children_ + (parent_ >= 0 ? 1 : 0)}; }
  // The rank at relative position v.
  int rank_of(int v) const noexcept { return (v + root_) % ranks_; }

 private:
  int ranks_, root_;
  int parent_ = -1;
  std::array<int, 33> peers_{};  // at most 31 children (int ranks) and the parent
  std::size_t children_ = 0;
};

}  // namespace gradwire::collective::detail
