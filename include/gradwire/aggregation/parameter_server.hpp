// Parameter servers (ParameterServerStrategy, Downpour, SSP, backup workers): variables sharded over server ranks.
//
// Roles: the last `servers` ranks serve (the order of a TF_CONFIG cluster: chief,
// workers, ps); the others are workers. Every tensor is cut into pieces (a tensor larger
// than split_bytes is split evenly over the servers) and the pieces are dealt to the
// servers largest first, each to the least loaded one, so shards are balanced by size
// (ps/sharding.hpp). A server owns its pieces' values and optimizer state and applies
// every update (ps/server.hpp).
//
// A worker's step pushes its gradient (one message per server with that server's
// pieces) and pulls the parameters back (ps/worker.hpp). A server's push starts as soon
// as every tensor it holds a piece of is ready, so it travels while backward still runs;
// finish waits for the pushes and the pull. Over a transport with one-sided access
// (concepts::one_sided_transport, e.g. UCX between processes of one machine) to a server
// it prefers it for, each server exposes one landing zone per worker: the worker puts its
// gradient there and gets the parameters from there, and only small request and reply
// headers travel as messages (ps/windows.hpp). The mode (ps/modes.hpp) decides when a
// server applies gradients and when it answers a pull.
//
// A server's version counts steps: closed steps (sync modes), or the number of gradients
// every live worker has pushed (async modes, the slowest worker's clock). A gradient's
// staleness is the server's version when it arrives minus the version the worker pulled
// (0 in sync modes; at most s under bounded_staleness<s>); its update lag is the number
// of updates the server applied in between (what an async gradient really missed).
//
// Fault tolerance (async modes, over a transport that can tolerate a loss): a worker
// that dies is dropped by the servers, the others go on, and the chief reports it. A lost
// server is an error on every rank, unless it has a standby (ps::options::standby): then
// the standby, which applied every update the server did, takes its shard over and the
// workers switch to it (ps/replica.hpp); servers checkpoint their shards every K steps and
// at exit, and a job restarted with the same checkpoint directory resumes from them.
//
// Compressed pushes: parameter_server<Mode, Codec>, e.g. parameter_server<ps::sync>(o)
// .compress(compress::error_feedback<compress::top_k>(compress::top_k(0.01))). Each worker
// encodes every piece of a push with the codec's single encode, through a state of that
// piece's own that it keeps (error feedback's residual, PowerSGD's Q), and the server decodes
// the piece before it applies or sums it (ps/push_codec.hpp): the server's update is the
// mean (sync) or each (async) of decode(encode(g_w)), in every mode, over messages and
// one-sided windows alike (a window's gradient zone is sized for the payload). Standbys
// mirror the decoded updates in V, and pulls carry the parameters in V: only the push is
// compressed, so a step's traffic falls at most to half. What a push costs a worker and a
// server in compute is one encode and one decode; the codecs' costs are on their own pages.
// Setup refuses (errc::mismatch, on every rank) ranks that lay pushes out differently.
// Without a codec (no_codec, the default) none of this is compiled: the push is the pieces in V.
//
// This header is the policy the user names; the per-job state is ps::agent. It does not
// include the codecs (gradwire/compress/): a program includes the one it uses.
#pragma once

#include <type_traits>
#include <utility>

#include "../concepts.hpp"
#include "../optim/sgd.hpp"
#include "../ps/agent.hpp"
#include "../ps/modes.hpp"
#include "../ps/options.hpp"
#include "../ps/stats.hpp"
#include "no_codec.hpp"

namespace gradwire::aggregation {

// Mode: concepts::ps_mode (ps::sync, ps::async, ps::bounded_staleness<s>, ps::backup_workers<b>).
// Codec: no_codec, or the concepts::compressor the workers' pushes go through (compress(codec):
// compress::fp16, bf16, int8, top_k, powersgd, error_feedback<...>, or a user's), checked
// for the parameters' value type where strategy<> builds the agent.
template <class Mode, class Codec = no_codec>
class parameter_server {
  static_assert(concepts::ps_mode<Mode>,
                "aggregation::parameter_server<Mode>: Mode needs static name, on_arrival, backups and max_lead "
                "(use ps::sync, ps::async, ps::bounded_staleness<s> or ps::backup_workers<b>)");

 public:
  using mode = Mode;
  using codec_type = Codec;
  static constexpr bool has_codec = !std::is_same_v<Codec, no_codec>;
  // What strategy<> builds on each rank: a worker's links and step, or a server's loop.
  template <class V, class Tr>
  using agent = ps::agent<Mode, V, Tr, Codec>;

  explicit parameter_server(ps::options o = {}) : options_(std::move(o)) {}
  parameter_server(ps::options o, Codec codec)
    requires(has_codec)
      : options_(std::move(o)), codec_(std::move(codec)) {}

  // The same policy with the workers' pushes through `codec` (a concepts::compressor; the
  // pulls stay in V). A codec given again replaces the first.
  template <class C>
  parameter_server<Mode, C> compress(C codec) const {
    return parameter_server<Mode, C>(options_, std::move(codec));
  }
  const Codec& codec() const noexcept
    requires(has_codec)
  {
    return codec_;
  }

  const ps::options& options() const noexcept { return options_; }
  int servers() const noexcept { return options_.servers; }
  // Servers and their standbys (ps::options::standby) are the last ranks.
  bool is_server(int rank, int size) const noexcept { return rank >= first_server(size); }
  int first_server(int size) const noexcept { return size - options_.serving_ranks(); }

 private:
  ps::options options_;
  [[no_unique_address]] Codec codec_{};
};

namespace detail {
template <class Mode, class V, class Tr>
constexpr bool checks_parameter_server() {
  using agent = ps::agent<Mode, V, Tr>;
  static_assert(concepts::incremental_aggregation<parameter_server<Mode>, V, Tr>);
  static_assert(concepts::aggregation_agent<agent, V, Tr>);
  static_assert(concepts::serving_agent<agent, V, Tr, optim::sgd>);
  // A schedule only with an optimizer whose rate can be set.
  static_assert(concepts::scheduling_agent<agent, V, Tr, optim::sgd>);
  static_assert(!concepts::scheduling_agent<agent, V, Tr, concepts::detail::optimizer_archetype>);
  static_assert(concepts::finishing_agent<agent, Tr>);
  static_assert(concepts::staleness_reporting_agent<agent>);
  static_assert(!concepts::updates_only_through_apply<agent>);  // pulls write the parameters
  return true;
}
// ps::agent's setup needs wait_any (a server answers workers in arrival order): the stand-in
// has it, and no other capability.
static_assert(checks_parameter_server<ps::sync, float, concepts::detail::multiplexing_transport_archetype>());
static_assert(
    checks_parameter_server<ps::bounded_staleness<2>, double, concepts::detail::multiplexing_transport_archetype>());
}  // namespace detail

}  // namespace gradwire::aggregation
