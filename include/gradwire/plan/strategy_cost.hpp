// Predicted step time and samples/s of each training strategy on a cluster_model, from its messages and stragglers.
//
// W workers (every rank of the cluster), batch b each, a model of P float32 parameters,
// c seconds of compute per step per worker at speed 1. A step's compute is the wait for
// the workers it needs, from the straggler model (straggler_statistics.hpp); its
// communication is priced from the messages the strategy sends (link_cost.hpp):
//   all_reduce<A>          E[max of W] + the bucketed all-reduce of the gradient by A
//   all_reduce<A>, K of N  E[the (W-k)-th compute] + one round of one-byte messages + the
//                          same all-reduce; only W-k gradients count (late ranks run ahead)
//   parameter_server<sync> close to close: the servers' replies leave one after another,
//                          each worker computes once it has its shards and pushes them;
//                          the next close is when the last push is in (so early workers'
//                          pushes overlap the replies to late ones), under the stragglers
//   backup_workers<k>      the same, closing at the (W-k)-th push; only W-k gradients count
//   async                  each worker at its own pace: 1 / (E[its compute] + its push and
//                          pull alone), summed, capped where a link or a server's CPU
//                          saturates
//   bounded_staleness<s>   async's step + E[max over workers of the mean of s + 1 steps'
//                          compute] - E[compute] (no worker gets more than s steps ahead)
//   local_sgd (period H)   E[max over workers of the mean of H steps] + the parameter
//                          all-reduce / H
//   central_storage        E[max of W] + reduce of the gradient onto rank 0 + broadcast
//   sharded (ZeRO-1)       E[max of W] + per bucket a ring reduce-scatter and all-gather
//   compressed all_reduce  E[max of W] + the codec's compute + its route (codec_model.hpp):
//                          encoded ring, all-gather of top-k pairs, or PowerSGD's factors
//   diloco (H, F, delay)   local SGD's wait + the pseudo-gradient all-reduce / H; streaming
//                          fragments hide behind `delay` inner steps
// Compute and communication do not overlap: right for models of one bucket (25 MiB), whose
// only bucket is ready when backward ends; pessimistic for larger ones. Parameter servers
// run on S extra ranks after the W workers (ranks W..W+S-1, host-major: on hosts of
// their own once the workers' hosts are full; with_servers gives that cluster), as
// aggregation::parameter_server puts servers last. What the model does not see:
// statistical efficiency (stale or averaged gradients need more steps to reach an
// accuracy; run the simulator for that), the optimizer's and the reductions' own time,
// and CPU contention between ranks of a host.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../collective/bucketing.hpp"
#include "../compress/low_rank.hpp"
#include "../compress/top_k.hpp"
#include "../error.hpp"
#include "../ps/options.hpp"
#include "../ps/protocol.hpp"
#include "../ps/sharding.hpp"
#include "all_reduce_cost.hpp"
#include "cluster_model.hpp"
#include "codec_model.hpp"
#include "link_cost.hpp"
#include "rooted_cost.hpp"
#include "schedule.hpp"
#include "straggler_statistics.hpp"

namespace gradwire::plan {

// What is trained.
struct workload {
  std::size_t parameters = 0;        // float32 parameters in all
  std::vector<std::size_t> tensors;  // their tensors' sizes, when known (the sum must be `parameters`); empty:
                                     // many small tensors (even shards, buckets cut anywhere)
  int batch = 64;                    // samples per worker per step
  double step_seconds = 0;           // compute per step per worker at speed 1 (forward, backward, optimizer)
  std::vector<shape> shapes;         // their shapes, when known (one per entry of tensors, row-major): PowerSGD
                                     // reads each weight as its own matrix; empty: one near-square matrix per bucket

  // Throws errc::invalid_argument naming what is wrong.
  void validate() const {
    auto bad = [](const std::string& what) { throw error(errc::invalid_argument, "workload: " + what); };
    if (parameters == 0) bad("the model needs at least one parameter");
    if (!tensors.empty() && std::accumulate(tensors.begin(), tensors.end(), std::size_t{0}) != parameters)
      bad("the tensors' sizes add up to " +
          std::to_string(std::accumulate(tensors.begin(), tensors.end(), std::size_t{0})) + ", not the " +
          std::to_string(parameters) + " parameters");
    if (batch < 1) bad("the batch must be >= 1 sample per worker");
    if (!(step_seconds >= 0)) bad("the step compute time must be >= 0 seconds");
    if (!shapes.empty()) {
      bool fits = shapes.size() == tensors.size();
      for (std::size_t i = 0; fits && i < shapes.size(); ++i) fits = shapes[i].elements() == tensors[i];
      if (!fits) bad("the shapes are not one per tensor, each of its tensor's size");
    }
  }
};

enum class strategy_kind : std::uint8_t {
  all_reduce,
  all_reduce_backup_workers,
  ps_sync,
  ps_backup_workers,
  ps_async,
  ps_bounded_staleness,
  local_sgd,
  central_storage,
  sharded,
  compressed_all_reduce,
  diloco
};

// One strategy's prediction.
struct strategy_cost {
  std::string name;  // as the user writes it: all_reduce<ring>, parameter_server<async>, ...
  strategy_kind kind = strategy_kind::all_reduce;
  // Every step applies the mean of gradients all computed from the same parameters, as
  // one process with the combined batch would (backup workers: of the W-k first). False:
  // stale (async, bounded staleness) or drifting (local SGD, H > 1) replicas, whose
  // progress per sample the analytic model cannot see.
  bool synchronous = true;
  bool available = true;       // false: the library would refuse (see note)
  double compute = 0;          // seconds per step waiting for compute
  double communication = 0;    // seconds per step communicating
  double step = 0;             // seconds per step (async: the mean time between one worker's steps)
  double samples_per_second = 0;  // samples whose gradients are applied
  std::string note;
  double bytes_per_step = 0;  // sent by one rank per step, on average (0: not priced)
};

// The cluster a parameter-server job with `c`'s ranks as workers and `servers` servers
// after them runs on: the same links, hosts added (of ranks_per_host each) until the
// servers fit. What the simulator is given to run the job the cost model priced; ranks
// past the last server, if the last host is not full, have nothing to do.
inline cluster_model with_servers(cluster_model c, int servers) {
  const int ranks = c.size() + servers;
  c.hosts = (ranks + c.ranks_per_host - 1) / c.ranks_per_host;
  return c;
}

// The strategies' costs for one cluster and workload; each member prices one strategy.
class strategy_costs {
 public:
  strategy_costs(const cluster_model& c, workload w, cost_options o = {})
      : c_(validated(c)), w_(validated(std::move(w))), o_(o), stats_(c_, c_.size(), w_.step_seconds, o.trials) {
    expected_max_ = stats_.expected_max();
    mean_draw_ = stats_.mean_draw();
  }

  const cluster_model& cluster() const noexcept { return c_; }
  const workload& work() const noexcept { return w_; }
  const cost_options& options() const noexcept { return o_; }
  const compute_statistics& statistics() const noexcept { return stats_; }
  int workers() const noexcept { return c_.size(); }
  // E[the slowest worker's compute]: a synchronous step's compute.
  double expected_max_compute() const noexcept { return expected_max_; }
  // One worker alone (rank 0's speed, no waiting): the reference for speedups.
  double one_worker_samples_per_second() const {
    const double t = stats_.expected(0, mean_draw_);
    return t > 0 ? w_.batch / t : 0;
  }

  // The buckets aggregation::all_reduce and averaging reduce, in elements: planned over
  // the tensors as collective::plan_buckets plans them, or the flat model cut into buckets.
  std::vector<std::size_t> buckets(std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    std::vector<std::size_t> sizes;
    for (const auto& b : bucket_plan(bucket_bytes)) sizes.push_back(b.count);
    return sizes;
  }
  // The same buckets with the tensors in each (none when the tensors are not known).
  std::vector<collective::bucket> bucket_plan(std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    std::vector<collective::bucket> plan;
    if (!w_.tensors.empty()) {
      collective::plan_buckets(w_.tensors, o_.element_bytes, bucket_bytes, plan);
      return plan;
    }
    const std::size_t per_bucket = std::max<std::size_t>(1, bucket_bytes / o_.element_bytes);
    for (std::size_t offset = 0; offset < w_.parameters; offset += per_bucket)
      plan.push_back({0, 0, offset, std::min(per_bucket, w_.parameters - offset)});
    return plan;
  }

  // Each server's shard in elements: ps::sharding over the tensors (tensors above
  // split_bytes cut, pieces dealt largest first), or an even split of a flat model.
  std::vector<std::size_t> shards(int servers, std::size_t split_bytes = ps::options{}.split_bytes) const {
    check_servers(servers);
    // Each worker's messages to each server are priced one by one.
    if (double(servers) * workers() > 4e6)
      throw error(errc::invalid_argument, "parameter servers: " + std::to_string(workers()) + " workers x " +
                                              std::to_string(servers) +
                                              " servers are more messages than the cost model prices (4e6 pairs); "
                                              "give fewer servers");
    std::vector<std::size_t> sizes(static_cast<std::size_t>(servers));
    if (!w_.tensors.empty()) {
      const ps::sharding sharding(w_.tensors, servers, split_bytes / o_.element_bytes);
      for (int s = 0; s < servers; ++s) sizes[static_cast<std::size_t>(s)] = sharding.elements(s);
    } else {
      for (int s = 0; s < servers; ++s)
        sizes[static_cast<std::size_t>(s)] = w_.parameters * static_cast<std::size_t>(s + 1) / static_cast<std::size_t>(servers) -
                                             w_.parameters * static_cast<std::size_t>(s) / static_cast<std::size_t>(servers);
    }
    return sizes;
  }

  // Synchronous all-reduce (mirrored on one host, multi_worker_mirrored across hosts):
  // E[max of W computes] + the bucketed all-reduce of the gradient.
  strategy_cost all_reduce(all_reduce_algorithm a, std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    const auto sizes = buckets(bucket_bytes);
    const all_reduce_cost ar = predict_bucketed_all_reduce(c_, a, sizes, o_);
    strategy_cost s{std::string("all_reduce<") + name_of(a) + ">", strategy_kind::all_reduce, true, ar.available,
                    expected_max_, ar.seconds, 0, 0, ar.note};
    if (a == all_reduce_algorithm::auto_)
      s.note = std::string("runs ") + name_of(ar.runs) + (ar.note.empty() ? "" : "; ") + ar.note;
    if (a == all_reduce_algorithm::one_shot) s.note = "not an aggregation tag; " + s.note;
    if (a != all_reduce_algorithm::one_shot) s.bytes_per_step = ring_bytes(bucket_bytes, double(o_.element_bytes));
    return finish(s, double(w_.batch) * workers());
  }

  // K of N for all-reduce (all_reduce_options::backup_workers = k, with planned steps, so
  // that a late rank runs ahead): a step closes when the (W-k)-th worker is ready; the ranks
  // agree in one round of one-byte messages between every pair (priced as a round of the
  // links), then reduce as plain all-reduce does; only W-k gradients count as samples.
  strategy_cost all_reduce_backup_workers(all_reduce_algorithm a, int backups,
                                          std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    if (backups < 1 || backups >= workers())
      throw error(errc::invalid_argument, "all-reduce backup workers: expected 1.." + std::to_string(workers() - 1) +
                                              " (fewer than the " + std::to_string(workers()) + " workers), got " +
                                              std::to_string(backups));
    strategy_cost s = all_reduce(a, bucket_bytes);
    s.name += ", backup_workers " + std::to_string(backups);
    s.kind = strategy_kind::all_reduce_backup_workers;
    s.compute = stats_.expected_order_statistic(workers() - backups);
    std::vector<message> round;
    for (int from = 0; from < workers(); ++from)
      for (int to = 0; to < workers(); ++to)
        if (from != to) round.push_back({from, to, 1.0});
    s.communication += round_seconds(c_, round);
    s.note = std::to_string(backups) + " of " + std::to_string(workers()) + " gradients dropped per step" +
             (s.note.empty() ? "" : "; " + s.note);
    return finish(s, double(w_.batch) * (workers() - backups));
  }

  // The number of backup workers k (0 .. W/2) for K-of-N all-reduce that applies the most
  // gradients' samples per second under this cluster's stragglers: dropping the k slowest
  // shortens every step but keeps W-k gradients of W. 0: plain all-reduce is best.
  int best_all_reduce_backups(all_reduce_algorithm a = all_reduce_algorithm::auto_) const {
    int best = 0;
    double best_rate = all_reduce(a).samples_per_second;
    for (int k = 1; k <= workers() / 2 && k < workers(); ++k) {
      const double rate = all_reduce_backup_workers(a, k).samples_per_second;
      if (rate > best_rate) best = k, best_rate = rate;
    }
    return best;
  }

  // Synchronous parameter servers (ps::sync): every worker pushes its gradient shards
  // (a request header, the shard, then its pull request) to every server and waits for
  // the replies ([reply header][shard]), which go out once the step is full. Priced close
  // to close (ps_step): the replies leave one after another on the servers' links, so the
  // first workers compute and push while later ones still wait for theirs.
  strategy_cost ps_sync(int servers) const {
    const double period = ps_step(servers, workers());
    strategy_cost s{"parameter_server<sync>", strategy_kind::ps_sync, true, true, expected_max_,
                    period - expected_max_, 0, 0, ps_note(servers)};
    return finish(s, double(w_.batch) * workers());
  }

  // Backup workers (ps::backup_workers<k>): a step closes at the (W-k)-th gradient, the k
  // late ones are dropped (their pushes still cross the links, after the close); only
  // W-k gradients count as samples.
  strategy_cost ps_backup_workers(int servers, int backups) const {
    if (backups < 1 || backups >= workers())
      throw error(errc::invalid_argument, "backup workers: expected 1.." + std::to_string(workers() - 1) +
                                              " (fewer than the " + std::to_string(workers()) + " workers), got " +
                                              std::to_string(backups));
    const double compute = stats_.expected_order_statistic(workers() - backups);
    const double period = ps_step(servers, workers() - backups);
    strategy_cost s{"parameter_server<backup_workers<" + std::to_string(backups) + ">>",
                    strategy_kind::ps_backup_workers,
                    true,
                    true,
                    compute,
                    period - compute,
                    0,
                    0,
                    ps_note(servers) + "; " + std::to_string(backups) + " of " + std::to_string(workers()) +
                        " gradients dropped per step"};
    return finish(s, double(w_.batch) * (workers() - backups));
  }

  // Asynchronous parameter servers (ps::async): worker w steps every E[its compute] + its
  // own push and pull round trip; the rates add up, scaled down where the busiest link
  // or server CPU would pass saturation.
  strategy_cost ps_async(int servers) const {
    std::vector<double> own(static_cast<std::size_t>(workers()));
    for (int w = 0; w < workers(); ++w) own[static_cast<std::size_t>(w)] = stats_.expected(w, mean_draw_);
    return ps_free_running("parameter_server<async>", strategy_kind::ps_async, servers, own, "");
  }

  // Bounded staleness (ps::bounded_staleness<s>): as async, but no worker runs more than s
  // steps ahead of the slowest, so the pace is async's (its step time, link caps included)
  // plus what waiting for stragglers adds: E[max over workers of the mean of s + 1 steps'
  // compute] - E[mean compute] (s = 0: the slowest every step, as sync; large s: the
  // slowest worker's mean). Stragglers and saturated links add up: while the others wait
  // for a straggler, the link they would use idles.
  strategy_cost ps_bounded_staleness(int servers, int staleness) const {
    if (staleness < 0)
      throw error(errc::invalid_argument, "bounded staleness: s must be >= 0 steps, got " + std::to_string(staleness));
    std::vector<double> own(static_cast<std::size_t>(workers()));
    double mean = 0;
    for (int w = 0; w < workers(); ++w) mean += own[static_cast<std::size_t>(w)] = stats_.expected(w, mean_draw_);
    mean /= workers();
    strategy_cost s = ps_free_running("parameter_server<bounded_staleness<" + std::to_string(staleness) + ">>",
                                      strategy_kind::ps_bounded_staleness, servers, own, "");
    const double wait = std::max(0.0, stats_.expected_max_mean(staleness + 1) - mean);
    s.compute += wait;
    s.step += wait;
    s.samples_per_second = s.step > 0 ? workers() * double(w_.batch) / s.step : 0;
    return s;
  }

  // Local SGD (aggregation::averaging<H>): H local steps, then one all-reduce (auto_) of
  // the parameters, averaged; the wait is for the slowest worker's H steps together.
  strategy_cost local_sgd(int period, std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    if (period < 1)
      throw error(errc::invalid_argument, "local SGD: the period must be >= 1 step, got " + std::to_string(period));
    const auto sizes = buckets(bucket_bytes);
    const all_reduce_cost ar = predict_bucketed_all_reduce(c_, all_reduce_algorithm::auto_, sizes, o_);
    strategy_cost s{"local_sgd (averaging<" + std::to_string(period) + ">)",
                    strategy_kind::local_sgd,
                    period == 1,
                    ar.available,
                    stats_.expected_max_mean(period),
                    ar.seconds / period,
                    0,
                    0,
                    std::string("parameters all-reduced by ") + name_of(ar.runs) + " every " + std::to_string(period) +
                        " steps"};
    s.bytes_per_step = ring_bytes(bucket_bytes, double(o_.element_bytes)) / period;
    return finish(s, double(w_.batch) * workers());
  }

  // ZeRO-1 (aggregation::sharded): per bucket a ring reduce-scatter of the gradient and a
  // ring all-gather of the parameters, the ring all-reduce's two phases as two collectives
  // (each with its own call check); the optimizer state per rank is 1/N.
  strategy_cost sharded(std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    double comm = 0, bytes = 0;
    for (std::size_t b : buckets(bucket_bytes)) {
      const double part = longest_chunk_bytes(b, static_cast<std::size_t>(workers()), o_.element_bytes);
      comm += 2 * ring_steps_seconds(c_, workers() - 1, part, o_);
      bytes += 2.0 * (workers() - 1) * part;
    }
    strategy_cost s{"sharded (ZeRO-1)", strategy_kind::sharded, true, true, expected_max_, comm, 0, 0,
                    "reduce-scatter + all-gather per bucket; optimizer state 1/" + std::to_string(workers()) +
                        " per rank"};
    s.bytes_per_step = bytes;
    return finish(s, double(w_.batch) * workers());
  }

  // All-reduce of compressed gradients (aggregation::compressed_all_reduce, codec_model.hpp):
  // ring codecs reduce-scatter and all-gather encoded chunks (bytes_per_element each), top-k
  // all-gathers every rank's kept pairs, PowerSGD all-reduces P then Q per bucket; plus the
  // codec's compute on every rank.
  strategy_cost compressed_all_reduce(const codec_model& codec,
                                      std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    if (!codec.compresses()) {
      strategy_cost s = all_reduce(all_reduce_algorithm::ring, bucket_bytes);
      s.bytes_per_step = ring_bytes(bucket_bytes, double(o_.element_bytes));
      return s;
    }
    const auto n = static_cast<std::size_t>(workers());
    double comm = 0, bytes = 0, codec_seconds = 0;
    for (const collective::bucket& bucket : bucket_plan(bucket_bytes)) {
      const std::size_t b = bucket.count;
      switch (codec.path) {
        case codec_model::route::ring: {
          const double part = longest_chunk_bytes(b, n, 1) * codec.bytes_per_element;
          comm += 2 * ring_steps_seconds(c_, workers() - 1, part, o_);
          bytes += 2.0 * (workers() - 1) * part;
          codec_seconds += codec.seconds_per_element * double(b);
          break;
        }
        case codec_model::route::gather: {
          const double kept = double(compress::top_k(codec.fraction).k(b)) * codec.bytes_per_element;
          comm += ring_steps_seconds(c_, workers() - 1, kept, o_);
          bytes += double(workers() - 1) * kept;
          codec_seconds += codec.seconds_per_element * double(b);
          break;
        }
        case codec_model::route::low_rank: {
          // The codec's own plan: a matrix per weight when the shapes are known (the rank
          // each can use, the small ones and the vectors plain), else one near-square matrix.
          const auto plan = low_rank_plan(bucket, static_cast<std::size_t>(codec.rank));
          for (std::size_t factor : {plan.p_size, plan.q_size}) {
            if (factor == 0) continue;
            comm += predict_all_reduce(c_, all_reduce_algorithm::auto_, factor, o_).seconds;
            bytes += 2.0 * (workers() - 1) / workers() * double(factor) * double(o_.element_bytes);
          }
          for (const auto& m : plan.matrices)
            codec_seconds += codec.seconds_per_element * double(m.shape.rank) * double(m.count);
          break;
        }
      }
    }
    // Not the mean gradient but its compressed image: progress per sample is the codec's
    // (docs/strategies/compression.md), which this model does not see.
    strategy_cost s{"compressed all_reduce (" + codec.name + ")", strategy_kind::compressed_all_reduce, false, true,
                    expected_max_ + codec_seconds, comm, 0, 0,
                    detail_codec_note(codec, bytes, ring_bytes(bucket_bytes, double(o_.element_bytes)))};
    s.bytes_per_step = bytes;
    return finish(s, double(w_.batch) * workers());
  }

  // DiLoCo (aggregation::averaging with an outer optimizer): H inner steps, then the
  // pseudo-gradient all-reduced (auto_) and the outer step. Streaming with F fragments:
  // each fragment's all-reduce (1/F of the model) runs behind `delay` inner steps of
  // compute, so only what outlasts them waits: per step F x max(0, its all-reduce - delay x
  // compute) / H. The wait is for the slowest worker's H steps, as local SGD's.
  strategy_cost diloco(int period, int fragments = 1, int delay = 0,
                       std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    if (period < 1 || fragments < 1 || delay < 0)
      throw error(errc::invalid_argument, "DiLoCo: the period (" + std::to_string(period) + ") and fragments (" +
                                              std::to_string(fragments) + ") must be >= 1 and the delay (" +
                                              std::to_string(delay) + ") >= 0");
    const double compute = stats_.expected_max_mean(period);
    const auto sizes = buckets(bucket_bytes);
    const all_reduce_cost whole = predict_bucketed_all_reduce(c_, all_reduce_algorithm::auto_, sizes, o_);
    double comm = whole.seconds / period;
    if (fragments > 1 || delay > 0) {
      const std::size_t per_fragment = (w_.parameters + static_cast<std::size_t>(fragments) - 1) / fragments;
      const double one = predict_all_reduce(c_, all_reduce_algorithm::auto_, per_fragment, o_).seconds;
      comm = fragments * std::max(0.0, one - delay * compute) / period;
    }
    strategy_cost s{"diloco (H " + std::to_string(period) + ", F " + std::to_string(fragments) + ", delay " +
                        std::to_string(delay) + ")",
                    strategy_kind::diloco,
                    false,
                    whole.available,
                    compute,
                    comm,
                    0,
                    0,
                    "pseudo-gradients all-reduced by " + std::string(name_of(whole.runs)) + " every " +
                        std::to_string(period) + " steps" +
                        (fragments > 1 ? ", in " + std::to_string(fragments) + " fragments" : "")};
    s.bytes_per_step = ring_bytes(bucket_bytes, double(o_.element_bytes)) / period;
    return finish(s, double(w_.batch) * workers());
  }

  // Central storage (aggregation::central, owner rank 0): the gradient reduced onto the
  // owner bucket by bucket (a tree below small_all_reduce_bytes, else scatter-gather),
  // then the parameters broadcast from it (a binomial tree of the whole model).
  strategy_cost central_storage(std::size_t bucket_bytes = collective::default_bucket_bytes) const {
    double comm = 0;
    for (std::size_t b : buckets(bucket_bytes)) comm += reduce_seconds(c_, b, 0, o_);
    comm += broadcast_seconds(c_, w_.parameters, 0, o_);
    strategy_cost s{"central_storage", strategy_kind::central_storage, true, true, expected_max_, comm, 0, 0,
                    "owner rank 0 takes the whole gradient and sends the whole model"};
    return finish(s, double(w_.batch) * workers());
  }

 private:
  // PowerSGD's plan of a bucket (compress::low_rank::buffer_plan), as the codec makes it.
  compress::low_rank::buffer_plan low_rank_plan(const collective::bucket& bucket, std::size_t rank) const {
    if (w_.shapes.empty()) return compress::low_rank::buffer_plan::near_square(bucket.count, rank);
    return compress::low_rank::buffer_plan::of_tensors(
        std::span<const shape>(w_.shapes).subspan(bucket.first_tensor, bucket.end_tensor - bucket.first_tensor), rank);
  }

  template <class T>
  static T validated(T t) {
    t.validate();
    return t;
  }

  void check_servers(int servers) const {
    if (servers < 1)
      throw error(errc::invalid_argument, "parameter servers: expected at least 1, got " + std::to_string(servers));
  }

  // What one rank sends in a ring all-reduce of every bucket at `element_bytes` each.
  double ring_bytes(std::size_t bucket_bytes, double element_bytes) const {
    double bytes = 0;
    for (std::size_t b : buckets(bucket_bytes))
      bytes += 2.0 * (workers() - 1) * longest_chunk_bytes(b, static_cast<std::size_t>(workers()), 1) * element_bytes;
    return bytes;
  }
  static std::string detail_codec_note(const codec_model& codec, double bytes, double plain) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.1f", bytes > 0 ? plain / bytes : 0.0);
    return codec.name + ": " + ratio + "x fewer bytes than the plain ring";
  }

  static strategy_cost finish(strategy_cost s, double samples_per_step) {
    s.step = s.compute + s.communication;
    s.samples_per_second = s.step > 0 && s.available ? samples_per_step / s.step : 0;
    return s;
  }

  std::string ps_note(int servers) const {
    const int first = workers(), last = workers() + servers - 1;
    const bool one_host = c_.host(last) == c_.host(first);
    return std::to_string(servers) + (servers == 1 ? " server" : " servers") + (one_host ? " on host " : " on hosts ") +
           std::to_string(c_.host(first)) + (one_host ? "" : ".." + std::to_string(c_.host(last)));
  }

  // Worker w's push to every server holding a shard: request header, shard, pull request.
  void add_push(int w, const std::vector<std::size_t>& shard, std::vector<message>& out) const {
    constexpr double header = sizeof(ps::detail::request_header);
    for (std::size_t s = 0; s < shard.size(); ++s) {
      if (shard[s] == 0) continue;  // a server with nothing of this model gets no messages
      const int server = workers() + static_cast<int>(s);
      out.push_back({w, server, header});
      out.push_back({w, server, double(shard[s]) * double(o_.element_bytes)});
      out.push_back({w, server, header});
    }
  }
  // Every server's reply to worker w: [reply header][its shard].
  void add_replies(int w, const std::vector<std::size_t>& shard, std::vector<message>& out) const {
    for (std::size_t s = 0; s < shard.size(); ++s)
      if (shard[s] > 0) out.push_back(reply(static_cast<int>(s), w, shard[s]));
  }
  message reply(int server, int w, std::size_t elements) const {
    return {workers() + server, w, double(sizeof(ps::detail::reply_header)) + double(elements) * double(o_.element_bytes)};
  }

  // A synchronous step from one close to the next. At its close each server posts its
  // replies, worker after worker; worker w computes once it has every shard, then pushes;
  // a server closes the next step when the pushes of `needed` workers are in (all of
  // them, or W-k with backups). So the first workers' pushes overlap the replies to the
  // last ones, and servers that close apart stay apart: the cycle is run with each
  // worker's mean compute until it repeats itself (a few times). Then each worker's push
  // lands a fixed time after its compute ends, and the close is the `needed`-th of those
  // landings under the straggler draws (compute_statistics): a straggler that got its
  // reply early costs less than one that got it last.
  double ps_step(int servers, int needed) const {
    const auto shard = shards(servers);
    const double o = seconds_of(c_.overhead);
    const auto ranks = static_cast<std::size_t>(workers() + servers), w_count = static_cast<std::size_t>(workers());
    std::vector<message> replies, pushes;
    for (int s = 0; s < servers; ++s)
      for (int w = 0; w < workers(); ++w)
        if (shard[static_cast<std::size_t>(s)] > 0) replies.push_back(reply(s, w, shard[static_cast<std::size_t>(s)]));
    for (int w = 0; w < workers(); ++w) add_push(w, shard, pushes);
    std::vector<double> mean(w_count), close(ranks, 0), ready(ranks, 0), landed(w_count);
    for (int w = 0; w < workers(); ++w) mean[static_cast<std::size_t>(w)] = stats_.expected(w, mean_draw_);
    std::vector<std::vector<double>> in(static_cast<std::size_t>(servers));
    double previous = 0;
    for (int cycle = 0; cycle < 4; ++cycle) {
      const auto answered = round_times(c_, replies, close);
      std::fill(ready.begin(), ready.end(), 0.0);
      for (std::size_t i = 0; i < replies.size(); ++i) {
        auto& r = ready[static_cast<std::size_t>(replies[i].to)];
        r = std::max(r, answered[i].arrived + o);
      }
      for (std::size_t w = 0; w < w_count; ++w) ready[w] += mean[w];
      const auto pushed = round_times(c_, pushes, ready);
      // Server s's arrival of each worker's push: its header, shard and pull request.
      for (auto& v : in) v.assign(w_count, 0);
      std::fill(landed.begin(), landed.end(), 0.0);
      for (std::size_t i = 0; i < pushes.size(); ++i) {
        const auto w = static_cast<std::size_t>(pushes[i].from);
        auto& t = in[static_cast<std::size_t>(pushes[i].to - workers())][w];
        t = std::max(t, pushed[i].arrived + o);
        landed[w] = std::max(landed[w], t);
      }
      previous = *std::max_element(close.begin(), close.end());
      for (int s = 0; s < servers; ++s) {
        auto& v = in[static_cast<std::size_t>(s)];
        if (shard[static_cast<std::size_t>(s)] == 0) continue;
        std::nth_element(v.begin(), v.begin() + (needed - 1), v.end());
        close[static_cast<std::size_t>(workers() + s)] = v[static_cast<std::size_t>(needed - 1)];
      }
    }
    // The last cycle's landings, each worker's compute drawn instead of its mean.
    for (std::size_t w = 0; w < w_count; ++w) landed[w] -= mean[w];
    return stats_.expected_order_statistic(needed, landed) - previous;
  }

  // Workers that never wait for each other: worker w steps every own[w] + its round trip;
  // the links and the servers' CPUs, loaded at those rates, cap the total.
  strategy_cost ps_free_running(std::string name, strategy_kind kind, int servers, const std::vector<double>& own,
                                std::string note) const {
    const auto shard = shards(servers);
    link_loads load(c_);
    double rate = 0, compute = 0;
    std::vector<message> mine;
    for (int w = 0; w < workers(); ++w) {
      mine.clear();
      add_push(w, shard, mine);
      const double push = round_seconds(c_, mine);
      const auto pushed = mine.size();
      add_replies(w, shard, mine);
      const double pull = round_seconds(c_, std::span<const message>(mine).subspan(pushed));
      const double cycle = own[static_cast<std::size_t>(w)] + push + pull;
      const double r = cycle > 0 ? 1 / cycle : 0;
      rate += r;
      compute += own[static_cast<std::size_t>(w)];
      load.add(mine, r);
    }
    const double busiest = load.utilisation();
    if (busiest > 1) {
      rate /= busiest;
      note = "capped by the busiest link or server (" + std::to_string(int(busiest * 100 + 0.5)) + "% demanded)";
    }
    strategy_cost s{std::move(name), kind, false, true, compute / workers(), 0, 0, 0, ps_note(servers)};
    if (!note.empty()) s.note += "; " + note;
    s.step = rate > 0 ? workers() / rate : 0;
    s.communication = std::max(0.0, s.step - s.compute);
    s.samples_per_second = rate * w_.batch;
    return s;
  }

  cluster_model c_;
  workload w_;
  cost_options o_;
  compute_statistics stats_;
  double expected_max_ = 0, mean_draw_ = 1;
};

}  // namespace gradwire::plan
