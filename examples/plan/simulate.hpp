// plan --simulate: each strategy's real Fashion-MNIST training in virtual time (one fashion_mnist process each), and its time to accuracy.
//
// The analytic models count samples per second; how many samples a strategy needs to
// reach an accuracy (stale gradients, drifting replicas, dropped gradients) only training
// shows. So each strategy the planner compares trains the Fashion-MNIST MLP for real with
// examples/fashion_mnist --transport simulated on the planner's cluster (compute=modelled:
// each step costs the planner's step compute, stretched by its straggler model, and runs
// are exactly reproducible), and the chief's accuracy curve in virtual time is read back.
// The learning rates are benchmarks/simulate_strategies.py's (plan_options.hpp).
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <gradwire/error.hpp>
#include <gradwire/plan/cost_model.hpp>

#include "plan_options.hpp"

extern char** environ;  // posix_spawn hands it on

namespace planner {

// One strategy as fashion_mnist runs it.
struct simulated_strategy {
  std::string name;  // as the planner's table names it
  gradwire::plan::strategy_kind kind{};
  std::vector<std::string> flags;  // fashion_mnist's strategy and learning-rate flags
  int servers = 0;                 // parameter servers after the workers (0: none)
};

// What one run printed (fashion_mnist's chief and servers), and how it went.
struct run_result {
  std::optional<double> reached;  // virtual seconds to the target accuracy
  double final_accuracy = -1;     // the last curve point's; < 0: none printed
  double virtual_seconds = 0;     // the whole run
  std::uint64_t dropped = 0;      // gradients the servers dropped (backup workers)
  double staleness_mean = 0;      // of the gradients the servers applied
  double wall_seconds = 0;
  int status = 0;                 // the process's exit status
  std::string last_line;          // for a failed run
};

// Reads fashion_mnist's `curve`, `reached`, `simulated ... of virtual time` and `ps rank`
// lines. Every server sees every worker's gradient for its shard, so the first server
// with gradients speaks for the job.
inline run_result parse_run_output(std::string_view text) {
  run_result r;
  bool server_seen = false;
  while (!text.empty()) {
    const auto end = text.find('\n');
    const std::string line(text.substr(0, end));
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (line.empty()) continue;
    r.last_line = line;
    double epochs = 0, seconds = 0, accuracy = 0, staleness = 0;
    unsigned long long gradients = 0, dropped = 0;
    if (std::sscanf(line.c_str(), "curve epochs=%lf seconds=%lf accuracy=%lf", &epochs, &seconds, &accuracy) == 3)
      r.final_accuracy = accuracy;
    else if (std::sscanf(line.c_str(), "reached %*f%% test accuracy at epoch %*f, %lf s", &seconds) == 1)
      r.reached = seconds;
    else if (std::sscanf(line.c_str(), "simulated %lf s of virtual time", &seconds) == 1)
      r.virtual_seconds = seconds;
    else if (!server_seen &&
             std::sscanf(line.c_str(), "ps rank %*d: mode %*s version %*u updates %*u gradients %llu applied %*u "
                                       "dropped %llu staleness mean %lf", &gradients, &dropped, &staleness) == 3 &&
             gradients > 0) {
      server_seen = true;
      r.dropped = dropped;
      r.staleness_mean = staleness;
    }
  }
  return r;
}

namespace detail {

// A pipe's two ends, closed when done with.
struct pipe_ends {
  int read = -1, write = -1;
  pipe_ends() {
    int fd[2];
    if (::pipe(fd) != 0) throw std::system_error(errno, std::generic_category(), "plan --simulate: pipe");
    read = fd[0], write = fd[1];
  }
  pipe_ends(const pipe_ends&) = delete;
  pipe_ends& operator=(const pipe_ends&) = delete;
  ~pipe_ends() {
    close_write();
    if (read >= 0) ::close(read);
  }
  void close_write() {
    if (write >= 0) ::close(write), write = -1;
  }
};

// Runs the program args[0] with args, its stdout and stderr into one pipe; returns what
// it printed and its exit status (128 + the signal that ended it).
inline std::pair<std::string, int> run_program(const std::vector<std::string>& args) {
  pipe_ends out;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, out.read);
  posix_spawn_file_actions_adddup2(&actions, out.write, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out.write, STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, out.write);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int failed = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (failed) throw std::system_error(failed, std::generic_category(), "plan --simulate: cannot start " + args[0]);
  out.close_write();  // so that the read below ends when the child exits
  std::string text;
  char buffer[1 << 14];
  for (;;) {
    const ssize_t n = ::read(out.read, buffer, sizeof buffer);
    if (n > 0) text.append(buffer, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {std::move(text), WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

inline std::string formatted(double v, const char* format = "%g") {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

// The largest of `supported` (in descending order) that is at most `wanted`, else the smallest.
inline int supported_value(int wanted, std::initializer_list<int> supported) {
  for (int v : supported)
    if (v <= wanted) return v;
  return *(supported.end() - 1);
}

}  // namespace detail

// fashion_mnist: --fashion-mnist, or the build tree's, beside this plan binary (both are
// built into <build>/examples/).
inline std::filesystem::path fashion_mnist_program(const simulate_options& s) {
  std::filesystem::path program = s.fashion_mnist;
  if (program.empty()) {
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    program = (ec ? std::filesystem::path(".") : self.parent_path()) / "fashion_mnist";
  }
  if (::access(program.c_str(), X_OK) != 0)
    throw gradwire::error(gradwire::errc::config,
                          "--simulate runs the Fashion-MNIST example, and " + program.string() +
                              " is not an executable file: build it (cmake --build build --target fashion_mnist) "
                              "or give its path with --fashion-mnist PATH");
  return program;
}

// The strategies the planner compares, as fashion_mnist runs them: all-reduce (auto_),
// parameter servers sync, backup workers, async and bounded staleness, local SGD and DiLoCo
// with the planner's period, ZeRO-1, and all-reduce through each codec of --compress. fashion_mnist has backup:1|2|4|8 and bounded:1|2|4: the
// planner's --backup-workers and --staleness are rounded down to those.
inline std::vector<simulated_strategy> simulated_strategies(const plan_options& o) {
  namespace plan = gradwire::plan;
  const simulate_options& s = o.run;
  // The simulator's hosts are all alike: servers fill the hosts after the workers' (the
  // same host links as the planner's S, each server a smaller shard).
  const int servers = plan::with_servers(o.cluster, o.servers).size() - o.cluster.size();
  const int backups = detail::supported_value(o.backup_workers, {8, 4, 2, 1});
  const int staleness = detail::supported_value(o.staleness, {4, 2, 1});
  const std::string sync_lr = detail::formatted(s.lr), async_lr = detail::formatted(s.async_lr);
  auto ps = [](const std::string& mode, const std::string& lr) {
    return std::vector<std::string>{"--strategy", "parameter_server", "--ps-mode", mode, "--lr", lr};
  };
  using kind = plan::strategy_kind;
  std::vector<simulated_strategy> all{
      {"all_reduce<auto_>", kind::all_reduce, {"--strategy", "multi_worker_mirrored", "--lr", sync_lr}, 0},
      {"parameter_server<sync>", kind::ps_sync, ps("sync", sync_lr), servers},
      {"parameter_server<backup_workers<" + std::to_string(backups) + ">>", kind::ps_backup_workers,
       ps("backup:" + std::to_string(backups), sync_lr), servers},
      {"parameter_server<async>", kind::ps_async, ps("async", async_lr), servers},
      {"parameter_server<bounded_staleness<" + std::to_string(staleness) + ">>", kind::ps_bounded_staleness,
       ps("bounded:" + std::to_string(staleness), async_lr), servers},
      {"local_sgd (averaging<" + std::to_string(o.period) + ">)", kind::local_sgd,
       {"--strategy", "local_sgd", "--period", std::to_string(o.period), "--lr", detail::formatted(s.local_lr)}, 0},
      {"sharded (ZeRO-1)", kind::sharded, {"--strategy", "sharded", "--lr", sync_lr}, 0},
      {"diloco (H " + std::to_string(o.period) + ")", kind::diloco,
       {"--strategy", "diloco", "--period", std::to_string(o.period), "--lr", detail::formatted(s.local_lr)}, 0},
  };
  // Each codec the planner prices (--compress), as fashion_mnist's --compress spells it.
  for (const auto& codec : o.codecs)
    all.push_back({"compressed all_reduce (" + codec.name + ")", kind::compressed_all_reduce,
                   {"--strategy", "multi_worker_mirrored", "--compress", codec.name, "--lr", sync_lr}, 0});
  return all;
}

// fashion_mnist's command line for one strategy: the planner's cluster (with the servers'
// hosts) at compute=modelled, its step compute, W replicas of its batch.
inline std::vector<std::string> fashion_mnist_command(const plan_options& o, const std::filesystem::path& program,
                                                      const simulated_strategy& st) {
  namespace plan = gradwire::plan;
  plan::cluster_model cluster = st.servers ? plan::with_servers(o.cluster, st.servers) : o.cluster;
  cluster.compute = plan::compute_model::modelled;
  std::vector<std::string> args{program.string(), "--transport", "simulated", "--cluster", plan::describe(cluster),
                                "--step-compute", detail::formatted(o.work.step_seconds, "%.9g"),
                                "--replicas", std::to_string(o.cluster.size())};
  if (st.servers) args.insert(args.end(), {"--ps", std::to_string(st.servers)});
  args.insert(args.end(), {"--batch", std::to_string(o.work.batch), "--epochs", std::to_string(o.run.epochs),
                           "--evals-per-epoch", "4", "--standardise", "--target-accuracy",
                           detail::formatted(o.run.target_accuracy)});
  args.insert(args.end(), st.flags.begin(), st.flags.end());
  return args;
}

// Runs one strategy's training and reads its output.
inline run_result run_strategy(const std::vector<std::string>& command) {
  const auto start = std::chrono::steady_clock::now();
  auto [text, status] = detail::run_program(command);
  run_result r = parse_run_output(text);
  r.status = status;
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace planner
