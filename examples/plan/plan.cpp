// plan: predicted all-reduce times, step times and samples/s of every strategy on a described cluster, and which to choose.
//
//   plan [--params P | --tensors N,N,...] [--step-compute 2ms | --flops-per-sample X --device-flops 50G]
//        [--batch 64] [--workers W] [--cluster "hosts=25 ranks_per_host=4 bandwidth=10Gbit ..." | --cluster-file F]
//        [--servers S] [--backup-workers K] [--staleness S] [--period H] [--trials N]
//        [--simulate [--epochs E] [--target-accuracy A] [--lr LR] [--async-lr LR] [--local-lr LR] [--fashion-mnist PATH]]
//
// The numbers come from the analytic cost models (gradwire/plan/cost_model.hpp):
// the messages each collective and strategy sends, priced on the cluster's links, and the
// straggler model's order statistics. docs/planning.md explains the model and the output.
// --simulate trains Fashion-MNIST with each strategy in virtual time for time to accuracy
// (run_simulation, simulate.hpp).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <gradwire/plan/cost_model.hpp>

#include "plan_options.hpp"
#include "simulate.hpp"

namespace {

namespace plan = gradwire::plan;
using planner::plan_options;

double mib(std::size_t bytes) { return double(bytes) / double(1 << 20); }

void print_inputs(const plan_options& o, const plan::strategy_costs& costs) {
  const auto& c = o.cluster;
  const std::size_t bytes = o.work.parameters * sizeof(float);
  std::printf("# gradwire plan: %d workers on %d host%s x %d, batch %d, %zu float32 parameters (%.2f MiB%s)\n",
              c.size(), c.hosts, c.hosts == 1 ? "" : "s", c.ranks_per_host, o.work.batch, o.work.parameters, mib(bytes),
              o.work.tensors.empty() ? "" : (", " + std::to_string(o.work.tensors.size()) + " tensors").c_str());
  std::printf("# cluster: %s\n#          %s\n", o.cluster_text.c_str(), plan::describe(c).c_str());
  const double step = o.work.step_seconds;
  std::printf("# compute: %.3f ms per step per worker at speed 1 (%s)\n", step * 1e3, o.compute_source.c_str());
  const double slowest = costs.expected_max_compute();
  std::printf("# stragglers: a step waits E[slowest of %d] = %.3f ms (%.2fx); one worker alone averages %.3f ms", c.size(),
              slowest * 1e3, step > 0 ? slowest / step : 1, costs.statistics().expected(0, costs.statistics().mean_draw()) * 1e3);
  if (c.stragglers.random())
    std::printf(" (%d Monte Carlo steps, seed %llu)", costs.statistics().trials(),
                static_cast<unsigned long long>(c.seed));
  std::printf("\n#\n");
}

// The nccl-tests table for one all-reduce of the whole gradient, every algorithm.
void print_all_reduce(const plan_options& o) {
  const auto& c = o.cluster;
  const std::size_t count = o.work.parameters, bytes = count * sizeof(float);
  std::printf("# all-reduce of the gradient in one call, every algorithm (busbw = algbw x 2(N-1)/N, N = %d)\n#\n",
              c.size());
  std::printf("# %12s %10s %6s  %-28s %7s %12s %12s %12s  %s\n", "size", "count", "type", "algorithm", "rounds",
              "time(us)", "algbw(GB/s)", "busbw(GB/s)", "note");
  for (const auto a : plan::every_all_reduce_algorithm) {
    const plan::all_reduce_cost r = plan::predict_all_reduce(c, a, count);
    std::string name = plan::name_of(a);
    if (a == plan::all_reduce_algorithm::auto_ || r.runs != a) name += std::string(" -> ") + plan::name_of(r.runs);
    if (!r.available) {
      std::printf("  %12zu %10zu %6s  %-28s %7s %12s %12s %12s  %s\n", bytes, count, "float", name.c_str(), "-", "-", "-",
                  "-", r.note.c_str());
      continue;
    }
    const double algbw = r.seconds > 0 ? double(bytes) / r.seconds / 1e9 : 0;
    const double busbw = algbw * 2 * (c.size() - 1) / c.size();
    std::printf("  %12zu %10zu %6s  %-28s %7lld %12.2f %12.3f %12.3f  %s\n", bytes, count, "float", name.c_str(), r.rounds,
                r.seconds * 1e6, algbw, busbw, r.note.c_str());
  }
  std::printf("#\n");
}

// [docs:predict]
// Every strategy the planner compares, priced by the cost model. One the cost model
// refuses (too many workers x servers to price) is listed as unavailable, with why.
std::vector<plan::strategy_cost> predict_strategies(const plan_options& o, const plan::strategy_costs& costs) {
  using plan::all_reduce_algorithm;
  std::vector<plan::strategy_cost> all;
  auto add = [&](const std::string& name, auto&& predict) {
    try {
      all.push_back(predict());
    } catch (const gradwire::error& e) {
      if (e.kind() != gradwire::errc::invalid_argument) throw;
      all.push_back({name, {}, true, false, 0, 0, 0, 0, e.details()});
    }
  };
  for (const auto a : {all_reduce_algorithm::auto_, all_reduce_algorithm::ring, all_reduce_algorithm::halving_doubling,
                       all_reduce_algorithm::hierarchical})
    add(std::string("all_reduce<") + plan::name_of(a) + ">", [&] { return costs.all_reduce(a); });
  add("all_reduce<auto_>, backup_workers",
      [&] { return costs.all_reduce_backup_workers(all_reduce_algorithm::auto_, o.backup_workers); });
  add("parameter_server<sync>", [&] { return costs.ps_sync(o.servers); });
  add("parameter_server<backup_workers>", [&] { return costs.ps_backup_workers(o.servers, o.backup_workers); });
  add("parameter_server<async>", [&] { return costs.ps_async(o.servers); });
  add("parameter_server<bounded_staleness>", [&] { return costs.ps_bounded_staleness(o.servers, o.staleness); });
  add("local_sgd", [&] { return costs.local_sgd(o.period); });
  add("central_storage", [&] { return costs.central_storage(); });
  add("sharded (ZeRO-1)", [&] { return costs.sharded(); });
  for (const auto& codec : o.codecs)
    add("compressed all_reduce (" + codec.name + ")", [&] { return costs.compressed_all_reduce(codec); });
  add("diloco", [&] { return costs.diloco(o.period); });
  add("diloco, streamed", [&] { return costs.diloco(o.period, o.fragments, o.delay); });
  return all;
}
// [/docs:predict]

void print_strategies(const std::vector<plan::strategy_cost>& all, const plan::strategy_costs& costs) {
  const double alone = costs.one_worker_samples_per_second();
  std::printf("# every strategy: per step, compute (the wait for the workers a step needs) + communication\n#\n");
  std::printf("# %-40s %12s %10s %10s %12s %8s %5s  %s\n", "strategy", "compute(ms)", "comm(ms)", "step(ms)", "samples/s",
              "speedup", "sync", "note");
  for (const auto& s : all) {
    if (!s.available) {
      std::printf("  %-40s %12s %10s %10s %12s %8s %5s  %s\n", s.name.c_str(), "-", "-", "-", "-", "-", "-",
                  s.note.c_str());
      continue;
    }
    std::printf("  %-40s %12.3f %10.3f %10.3f %12.0f %8.1f %5s  %s\n", s.name.c_str(), s.compute * 1e3,
                s.communication * 1e3, s.step * 1e3, s.samples_per_second, alone > 0 ? s.samples_per_second / alone : 0,
                s.synchronous ? "yes" : "no", s.note.c_str());
  }
  std::printf("# speedup: over one worker alone (%.0f samples/s); sync no: stale or averaged updates, more steps to an "
              "accuracy\n#\n",
              alone);
}

void print_recommendation(const std::vector<plan::strategy_cost>& all) {
  const plan::recommendation r = plan::recommend(all);
  std::printf("# recommendation: %s\n#   why: %s\n#   note: %s\n", all[r.best].name.c_str(), r.reason.c_str(),
              r.caveat.c_str());
}

// --simulate's table: one row per strategy as its run ends.
void print_simulated(const planner::simulated_strategy& st, const planner::run_result& r) {
  if (r.status != 0) {
    std::printf("  %-40s failed (exit status %d): %s\n", st.name.c_str(), r.status,
                r.last_line.empty() ? "no output" : r.last_line.c_str());
  } else {
    std::string flags;
    for (const auto& f : st.flags) flags += " " + f;
    std::printf("  %-40s %10s %8.2f%% %10.3f %8llu %9.2f %7.1f %s\n", st.name.c_str(),
                r.reached ? planner::detail::formatted(*r.reached, "%.3f").c_str() : "-", 100 * r.final_accuracy,
                r.virtual_seconds, static_cast<unsigned long long>(r.dropped), r.staleness_mean, r.wall_seconds,
                flags.c_str());
  }
  std::fflush(stdout);
}

// Which run reached the target first, and how the analytic model's choice fared.
void print_verdict(const plan_options& o, const std::vector<plan::strategy_cost>& all,
                   const std::vector<planner::simulated_strategy>& strategies, const std::vector<planner::run_result>& results) {
  const double target = 100 * o.run.target_accuracy;
  const std::size_t none = strategies.size();
  std::size_t first = none;
  for (std::size_t i = 0; i < results.size(); ++i)
    if (results[i].status == 0 && results[i].reached && (first == none || *results[i].reached < *results[first].reached))
      first = i;
  if (first < none)
    std::printf("#\n# first to %g%%: %s, at %.3f s of virtual time\n", target, strategies[first].name.c_str(),
                *results[first].reached);
  else
    std::printf("#\n# no strategy reached %g%% in %d epochs (--epochs, --target-accuracy)\n", target, o.run.epochs);
  const plan::strategy_cost& chosen = all[plan::recommend(all).best];
  std::size_t same = none;  // the run of the chosen strategy's kind (every all_reduce<A> runs as auto_)
  for (std::size_t i = 0; i < strategies.size(); ++i)
    if (strategies[i].kind == chosen.kind) same = i;
  std::printf("# the analytic model recommended %s (the most samples/s)", chosen.name.c_str());
  if (same == none)
    std::printf(", which --simulate does not run\n");
  else if (results[same].status != 0)
    std::printf(": its run failed\n");
  else if (results[same].reached)
    std::printf(": %s reached %g%% at %.3f s\n", strategies[same].name.c_str(), target, *results[same].reached);
  else
    std::printf(": %s did not reach %g%% in %d epochs\n", strategies[same].name.c_str(), target, o.run.epochs);
}

// --simulate: every strategy's Fashion-MNIST training in virtual time (simulate.hpp), one
// run after another; false if a run failed.
bool run_simulation(const plan_options& o, const std::filesystem::path& program,
                    const std::vector<plan::strategy_cost>& all) {
  const auto strategies = planner::simulated_strategies(o);
  const std::string target = planner::detail::formatted(100 * o.run.target_accuracy);
  std::printf("#\n# time to %s%% test accuracy: Fashion-MNIST trained with each strategy in virtual time (--simulate)\n#  ",
              target.c_str());
  for (const auto& word : planner::fashion_mnist_command(o, program, {}))
    std::printf(word.find(' ') == std::string::npos ? " %s" : " \"%s\"", word.c_str());
  std::printf(" [flags]\n");
  int servers = 0;
  for (const auto& st : strategies) servers = std::max(servers, st.servers);
  if (servers > 0)
    std::printf("#   parameter servers: --ps %d, on hosts %d.. (--cluster with hosts=%d)%s\n", servers, o.cluster.hosts,
                plan::with_servers(o.cluster, servers).hosts,
                servers == o.servers ? "" : ": the planner's servers, filled up to whole hosts");
  std::printf("#\n# %-40s %10s %9s %10s %8s %9s %7s  %s\n", "strategy", ("to " + target + "%(s)").c_str(), "final acc",
              "virtual(s)", "dropped", "staleness", "wall(s)", "flags");
  std::vector<planner::run_result> results;
  bool ok = true;
  for (const auto& st : strategies) {
    results.push_back(planner::run_strategy(planner::fashion_mnist_command(o, program, st)));
    ok = ok && results.back().status == 0;
    print_simulated(st, results.back());
  }
  print_verdict(o, all, strategies, results);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const plan_options o = planner::parse_plan_options(argc, argv);
    if (o.help) {
      std::fputs(planner::usage_text, stdout);
      return 0;
    }
    // --simulate's program is looked for first, so that a missing one fails at once.
    const auto program = o.simulate ? planner::fashion_mnist_program(o.run) : std::filesystem::path();
    plan::cost_options model;
    model.trials = o.trials;
    const plan::strategy_costs costs(o.cluster, o.work, model);
    print_inputs(o, costs);
    print_all_reduce(o);
    const auto all = predict_strategies(o, costs);
    print_strategies(all, costs);
    print_recommendation(all);
    std::printf("# all-reduce backup workers (K of N): %d apply the most gradients' samples per second under these "
                "stragglers (all_reduce_options::backup_workers; 0: plain all-reduce)\n",
                costs.best_all_reduce_backups());
    if (o.simulate && !run_simulation(o, program, all)) return 1;
    return 0;
  } catch (const gradwire::error& e) {
    std::fprintf(stderr, "plan: %s\n", e.details().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan: %s\n", e.what());
    return 1;
  }
}
