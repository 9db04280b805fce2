// DiLoCo: averaging<H, optim::momentum> with DiLoCo's outer optimizer (Nesterov, lr 0.7, momentum 0.9), and its streaming options.
//
// The maths, the schedule of streaming and the costs are at the top of averaging.hpp and in
// docs/strategies/diloco.md. The defaults are the paper's (Douillard et al. 2023, "DiLoCo:
// Distributed Low-Communication Training of Language Models"): outer SGD with Nesterov
// momentum, lr 0.7, momentum 0.9 (inner: the strategy's optimizer, AdamW in the paper).
#pragma once

#include <cstddef>
#include <utility>

#include "../collective/bucketing.hpp"
#include "../concepts.hpp"
#include "../optim/momentum.hpp"
#include "averaging.hpp"

namespace gradwire::aggregation {

struct diloco_options {
  double outer_lr = 0.7;        // DiLoCo's
  double outer_momentum = 0.9;  // DiLoCo's; Nesterov always
  int fragments = 1;            // streaming: F fragments at staggered steps (1: the whole model at once)
  int delay = 0;                // streaming: steps from a fragment's all-reduce to its update, 0 <= delay < H
  std::size_t bucket_bytes = collective::default_bucket_bytes;  // the most one all-reduce call takes
};

// The aggregation type of a DiLoCo strategy: averaging with an outer Nesterov momentum (and
// its pseudo-gradients through Codec: no_codec, or compress::bf16, compress::int8, ...).
template <int H = dynamic_period, class Codec = no_codec>
using diloco_averaging = averaging<H, optim::momentum, Codec>;

// DiLoCo's outer optimizer: SGD with Nesterov momentum.
inline optim::momentum diloco_outer_optimizer(const diloco_options& o = {}) {
  return optim::momentum({.lr = o.outer_lr, .momentum = o.outer_momentum, .nesterov = true});
}

// diloco<H>(): DiLoCo every H steps with the paper's defaults (or `o`'s).
template <int H>
diloco_averaging<H> diloco(const diloco_options& o = {}) {
  static_assert(H != dynamic_period, "gradwire::aggregation::diloco<H>(): give the period in the type, or call "
                                     "diloco(period, options) for one chosen at run time");
  return diloco_averaging<H>(diloco_outer_optimizer(o), o.bucket_bytes).stream(o.fragments, o.delay);
}
// diloco(period): the same with the period chosen at run time (period >= 1, else invalid_argument).
inline diloco_averaging<dynamic_period> diloco(int period, const diloco_options& o = {}) {
  return diloco_averaging<dynamic_period>(period, diloco_outer_optimizer(o), o.bucket_bytes).stream(o.fragments, o.delay);
}
// ... with the pseudo-gradients all-reduced through `codec` (concepts::compressor).
template <class Codec>
diloco_averaging<dynamic_period, Codec> diloco(int period, const diloco_options& o, Codec codec) {
  return diloco(period, o).compress(std::move(codec));
}

static_assert(concepts::incremental_aggregation<diloco_averaging<8>, float, concepts::detail::transport_archetype>);
static_assert(
    concepts::incremental_aggregation<diloco_averaging<dynamic_period>, double, concepts::detail::transport_archetype>);
static_assert(concepts::background_communicating_agent<
              averaging_agent<8, float, concepts::detail::transport_archetype, optim::momentum>>);

}  // namespace gradwire::aggregation
