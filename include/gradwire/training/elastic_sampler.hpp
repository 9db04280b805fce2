// Which samples each replica of an elastic job reads, so that within an epoch none is lost or read twice
// however the job shrinks (docs/elastic.md section 2, "Data").
//
// Every replica keeps the same sampler and feeds it the same facts, so all of them agree on
// every share without a message. An epoch is a permutation of the samples (the same seed on
// every replica); each step takes the next global batch of (batch x members of the step's
// partition view), member p reading the p-th slice of it. When the step is applied, the
// shares of the members whose gradients it summed are spent; the others' (a rank lost
// mid-step, whose share no update saw) go back to the end of the epoch's pool, to be read
// later in the epoch by a survivor. A step's partition view is the view whose members the
// previous step summed (elastic_all_reduce_agent::last_step_view()): a survivor that had to
// take the interrupted step from another ends that step in the old view too, so both read
// the next step's shares from the same partition.
//
// A replacement that joins a running job (docs/elastic.md §3) takes the sampler's state from
// the members: save() there, restore() on the replacement (elastic_all_reduce's on_join).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../transport/view.hpp"

namespace gradwire::training {

class elastic_sampler {
 public:
  // `samples` in the data set, `batch` per replica and step, `seed` the same on every replica.
  elastic_sampler(std::size_t samples, std::size_t batch, std::uint64_t seed) : samples_(samples), batch_(batch), seed_(seed) {
    if (batch == 0) throw error(errc::invalid_argument, "elastic_sampler: the batch per replica must be positive");
  }

  // Starts epoch `epoch`: a fresh permutation, nothing spent.
  void begin_epoch(std::uint64_t epoch) {
    epoch_ = epoch;
    pool_.resize(samples_);
    std::iota(pool_.begin(), pool_.end(), std::size_t{0});
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ULL + epoch);
    std::shuffle(pool_.begin(), pool_.end(), rng);
    cursor_ = 0;
    spent_.assign(samples_, 0);
  }

  // Whether the epoch has a whole global batch left for a step partitioned by `partition`.
  bool has_step(const transport::view& partition) const noexcept {
    return cursor_ + static_cast<std::size_t>(partition.size()) * batch_ <= pool_.size();
  }

  // Job rank `rank`'s samples for the next step partitioned by `partition`.
  std::span<const std::size_t> share(const transport::view& partition, int rank) const {
    const int p = partition.position_of(rank);
    if (p < 0 || !has_step(partition))
      throw error(errc::invalid_argument, "elastic_sampler: rank " + std::to_string(rank) +
                                              (p < 0 ? " is not in the step's partition view"
                                                     : " asked for a share past the epoch's end"));
    return std::span<const std::size_t>(pool_).subspan(cursor_ + static_cast<std::size_t>(p) * batch_, batch_);
  }

  // The step partitioned by `partition` was applied, summing the gradients of `summed` (job
  // ranks): their shares are spent, every other member's goes back to the pool.
  void step_applied(const transport::view& partition, std::span<const int> summed) {
    if (!has_step(partition)) throw error(errc::invalid_argument, "elastic_sampler: a step past the epoch's end");
    const std::size_t begin = cursor_;
    cursor_ += static_cast<std::size_t>(partition.size()) * batch_;
    for (int p = 0; p < partition.size(); ++p) {
      const auto first = pool_.begin() + static_cast<std::ptrdiff_t>(begin + static_cast<std::size_t>(p) * batch_);
      const bool in = std::find(summed.begin(), summed.end(), partition.members[static_cast<std::size_t>(p)]) != summed.end();
      if (in) {
        for (auto it = first; it != first + static_cast<std::ptrdiff_t>(batch_); ++it) ++spent_[*it];
      } else {
        const std::vector<std::size_t> back(first, first + static_cast<std::ptrdiff_t>(batch_));
        pool_.insert(pool_.end(), back.begin(), back.end());
      }
    }
  }

  // The epoch begun last, and the samples its steps have read so far (spent or requeued).
  std::uint64_t epoch() const noexcept { return epoch_; }
  std::size_t read() const noexcept { return cursor_; }

  // The whole state, as bytes another replica's restore() takes: the epoch, the pool, how
  // far it is read and what was spent.
  std::vector<std::byte> save() const {
    std::vector<std::uint64_t> words{state_word, samples_, batch_, seed_, epoch_, cursor_, pool_.size(), spent_.size()};
    words.insert(words.end(), pool_.begin(), pool_.end());
    words.insert(words.end(), spent_.begin(), spent_.end());
    std::vector<std::byte> out(words.size() * 8);
    std::memcpy(out.data(), words.data(), out.size());
    return out;
  }
  // Takes the state a save() of a sampler with the same samples, batch and seed gave.
  void restore(std::span<const std::byte> bytes) {
    auto refuse = [](const std::string& why) {
      return error(errc::invalid_argument, "elastic_sampler: cannot restore this state: " + why);
    };
    if (bytes.size() % 8 != 0 || bytes.size() < 64) throw refuse("not a saved sampler (" + std::to_string(bytes.size()) + " bytes)");
    std::vector<std::uint64_t> w(bytes.size() / 8);
    std::memcpy(w.data(), bytes.data(), bytes.size());
    if (w[0] != state_word) throw refuse("not a saved sampler, or another version");
    if (w[1] != samples_ || w[2] != batch_ || w[3] != seed_)
      throw refuse("it is of a sampler of " + std::to_string(w[1]) + " samples, batch " + std::to_string(w[2]) +
                   ", seed " + std::to_string(w[3]) + "; this one has " + std::to_string(samples_) + ", " +
                   std::to_string(batch_) + ", " + std::to_string(seed_));
    if (w[7] != samples_ || w[6] > w.size() || w.size() != 8 + w[6] + w[7] || w[5] > w[6])
      throw refuse("its sizes do not add up");
    for (std::size_t i = 0; i < w[6]; ++i)
      if (w[8 + i] >= samples_) throw refuse("its pool holds sample " + std::to_string(w[8 + i]));
    epoch_ = w[4];
    cursor_ = static_cast<std::size_t>(w[5]);
    pool_.assign(w.begin() + 8, w.begin() + 8 + static_cast<std::ptrdiff_t>(w[6]));
    spent_.assign(w.begin() + 8 + static_cast<std::ptrdiff_t>(w[6]), w.end());
  }

  // How often each sample's gradient was applied this epoch (a check: 0 or 1 each).
  std::span<const std::uint32_t> spent() const noexcept { return spent_; }
  // Samples of the epoch not yet read (fewer than a global batch at its end).
  std::size_t left() const noexcept { return pool_.size() - cursor_; }

 private:
  static constexpr std::uint64_t state_word = 0x6777'7361'6d70'0001ULL;  // "gwsamp", version 1

  std::size_t samples_, batch_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  std::vector<std::size_t> pool_;
  std::size_t cursor_ = 0;
  std::vector<std::uint32_t> spent_;
};

}  // namespace gradwire::training
