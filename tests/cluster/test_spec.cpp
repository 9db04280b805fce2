// Cluster detection: every launcher's variables, the precedence between them, and every config error.
#include <gradwire/cluster/spec.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <string>

namespace gc = gradwire::cluster;
using Catch::Matchers::Contains;

namespace {

using vars = std::map<std::string, std::string>;

// A fake environment: the process's own is never touched.
gc::env_lookup env_of(vars values) {
  return [values = std::move(values)](const char* name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

gc::cluster_spec detect(vars values, const gc::overrides& given = {}) { return gc::detect(given, env_of(std::move(values))); }

// The message of the errc::config error detect throws.
std::string config_error(vars values, const gc::overrides& given = {}) {
  try {
    detect(std::move(values), given);
  } catch (const gradwire::error& e) {
    CHECK(e.kind() == gradwire::errc::config);
    return e.what();
  }
  FAIL("detect did not throw");
  return {};
}

const vars torchrun_2{{"RANK", "1"},          {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                      {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29500"}};

const vars openmpi_2{{"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"OMPI_MCA_ess_base_jobid", "710803457"},
                     {"OMPI_MCA_orte_precondition_transports", "0c867643c58ae973-437e48f7c84f6ba7"}};

const vars slurm_4{{"SLURM_PROCID", "3"},       {"SLURM_NTASKS", "4"},
                   {"SLURM_LOCALID", "1"},      {"SLURM_NODEID", "1"},
                   {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_ID", "4242"},
                   {"SLURM_STEP_ID", "0"},      {"SLURM_JOB_NODELIST", "gpu[07-08]"}};

const char* tf_config_3 = R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host1:2223"], "ps": ["host2:2222"]},
                            "task": {"type": "worker", "index": 1}})";

vars with(vars base, const vars& extra) {
  for (const auto& [k, v] : extra) base[k] = v;
  return base;
}

}  // namespace

TEST_CASE("nothing set: a one-process job") {
  auto spec = detect({});
  CHECK(spec.rank == 0);
  CHECK(spec.world_size == 1);
  CHECK(spec.local_rank == 0);
  CHECK(spec.local_world_size == 1);
  CHECK(spec.master_addr == "127.0.0.1");
  CHECK(spec.master_port == 0);
  CHECK(spec.job_token.empty());
  CHECK(spec.source == "default");
  CHECK(spec.roles == std::vector{gc::task_type::chief});
  CHECK(spec.type() == gc::task_type::chief);
  CHECK(spec.task_addresses.empty());
}

TEST_CASE("a spec written by hand without roles: rank 0 is the chief, every other rank a worker") {
  // A user may fill cluster_spec itself (tests, a launcher of its own) and leave roles empty;
  // type() then follows the rule detect() writes into roles.
  for (int world : {1, 2, 5}) {
    for (int r = 0; r < world; ++r) {
      gc::cluster_spec spec;
      spec.rank = r;
      spec.world_size = world;
      REQUIRE(spec.roles.empty());
      CHECK(spec.type() == (r == 0 ? gc::task_type::chief : gc::task_type::worker));
      auto detected = detect({{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)}, {"MASTER_ADDR", "h"},
                              {"MASTER_PORT", "1"}});
      CHECK(detected.type() == spec.type());
    }
  }
}

TEST_CASE("torchrun variables") {
  auto spec = detect(with(torchrun_2, {{"GRADWIRE_JOB_TOKEN", "s3cret"}}));
  CHECK(spec.source == "torchrun");
  CHECK(spec.rank == 1);
  CHECK(spec.world_size == 2);
  CHECK(spec.local_rank == 1);
  CHECK(spec.local_world_size == 2);
  CHECK(spec.master_addr == "10.0.0.5");
  CHECK(spec.master_port == 29500);
  CHECK(spec.job_token == "s3cret");
  CHECK(spec.type() == gc::task_type::worker);
  CHECK(spec.count(gc::task_type::chief) == 1);
  CHECK(spec.count(gc::task_type::worker) == 1);
  CHECK(spec.count(gc::task_type::ps) == 0);
  CHECK(std::string(gc::name_of(gc::task_type::ps)) == "ps");
}

TEST_CASE("torchrun without LOCAL_*: one machine is assumed") {
  auto spec = detect({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", "1234"}});
  CHECK(spec.local_rank == 2);
  CHECK(spec.local_world_size == 3);
  CHECK(spec.master_addr == "127.0.0.1");
  CHECK(spec.job_token.empty());
}

TEST_CASE("explicit arguments beat the environment, field by field") {
  gc::overrides given;
  given.rank = 0;
  given.master_port = 4000;
  given.job_token = "arg-token";
  auto spec = detect(with(torchrun_2, {{"GRADWIRE_JOB_TOKEN", "env-token"}}), given);
  CHECK(spec.source == "explicit");
  CHECK(spec.rank == 0);
  CHECK(spec.world_size == 2);
  CHECK(spec.master_port == 4000);
  CHECK(spec.master_addr == "10.0.0.5");
  CHECK(spec.job_token == "arg-token");

  gc::overrides all;
  all.rank = 2;
  all.world_size = 3;
  all.local_rank = 0;
  all.master_addr = "example.org";
  all.master_port = 5000;
  // Explicit rank and size: the environment's broken RANK is never read.
  spec = detect({{"RANK", "junk"}, {"WORLD_SIZE", "junk"}}, all);
  CHECK(spec.rank == 2);
  CHECK(spec.world_size == 3);
  CHECK(spec.local_rank == 0);
  CHECK(spec.master_addr == "example.org");
  CHECK(spec.master_port == 5000);

  gc::overrides port_zero;  // 0 means "not given"
  port_zero.master_port = 0;
  CHECK(detect(torchrun_2, port_zero).master_port == 29500);
}

TEST_CASE("mpirun: OMPI_COMM_WORLD_* with a port and token from the job id") {
  auto spec = detect(openmpi_2);
  CHECK(spec.source == "openmpi");
  CHECK(spec.rank == 1);
  CHECK(spec.world_size == 4);
  CHECK(spec.local_rank == 1);
  CHECK(spec.local_world_size == 2);
  CHECK(spec.master_addr == "127.0.0.1");
  CHECK(spec.master_port >= gc::derived_port_first);
  CHECK(spec.master_port < gc::derived_port_first + gc::derived_port_count);
  CHECK_THAT(spec.job_token, Contains("710803457") && Contains("0c867643c58ae973"));

  // Every rank of one job agrees; another job gets another port.
  auto rank0 = detect(with(openmpi_2, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}));
  CHECK(rank0.master_port == spec.master_port);
  CHECK(rank0.job_token == spec.job_token);
  auto other_job = detect(with(openmpi_2, {{"OMPI_MCA_ess_base_jobid", "99"}}));
  CHECK(other_job.master_port != spec.master_port);
  CHECK(other_job.job_token != spec.job_token);

  // OpenMPI 5 names the job in PMIX_NAMESPACE.
  vars v5 = openmpi_2;
  v5.erase("OMPI_MCA_ess_base_jobid");
  v5["PMIX_NAMESPACE"] = "prterun-vm-1234@1";
  CHECK(detect(v5).master_port >= gc::derived_port_first);

  // MASTER_* and GRADWIRE_JOB_TOKEN still win under mpirun.
  auto set = detect(with(openmpi_2, {{"MASTER_ADDR", "head"}, {"MASTER_PORT", "29400"}, {"GRADWIRE_JOB_TOKEN", "t"}}));
  CHECK(set.master_addr == "head");
  CHECK(set.master_port == 29400);
  CHECK(set.job_token == "t");
}

TEST_CASE("mpirun with no job id needs MASTER_PORT") {
  vars v = openmpi_2;
  v.erase("OMPI_MCA_ess_base_jobid");
  CHECK_THAT(config_error(v), Contains("MASTER_PORT") && Contains("mpirun"));
}

TEST_CASE("torchrun RANK and mpirun's rank must agree") {
  auto agree = detect(with(openmpi_2, {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29500"}}));
  CHECK(agree.source == "torchrun");
  CHECK(agree.rank == 1);
  auto msg = config_error(with(openmpi_2, {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29500"}}));
  CHECK_THAT(msg, Contains("RANK=0") && Contains("OMPI_COMM_WORLD_RANK=1") && Contains("disagree"));
  msg = config_error(with(openmpi_2, {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}));
  CHECK_THAT(msg, Contains("WORLD_SIZE=2") && Contains("OMPI_COMM_WORLD_SIZE=4"));
}

TEST_CASE("srun: SLURM_* with the first host of the node list") {
  auto spec = detect(slurm_4);
  CHECK(spec.source == "slurm");
  CHECK(spec.rank == 3);
  CHECK(spec.world_size == 4);
  CHECK(spec.local_rank == 1);
  CHECK(spec.local_world_size == 2);
  CHECK(spec.master_addr == "gpu07");
  CHECK(spec.master_port >= gc::derived_port_first);
  CHECK(spec.master_port < gc::derived_port_first + gc::derived_port_count);
  CHECK_THAT(spec.job_token, Contains("4242"));
  CHECK(detect(with(slurm_4, {{"SLURM_PROCID", "0"}})).master_port == spec.master_port);
  CHECK(detect(with(slurm_4, {{"SLURM_STEP_ID", "1"}})).master_port != spec.master_port);

  // The step's node list first; then the job's; none: loopback.
  CHECK(detect(with(slurm_4, {{"SLURM_STEP_NODELIST", "rack[2-3]-n[05-06,9],login"}})).master_addr == "rack2-n05");
  vars no_list = slurm_4;
  no_list.erase("SLURM_JOB_NODELIST");
  CHECK(detect(no_list).master_addr == "127.0.0.1");
  CHECK_THAT(config_error(with(slurm_4, {{"SLURM_JOB_NODELIST", "gpu[07-08"}})), Contains("SLURM_JOB_NODELIST=gpu[07-08"));
  // srun's step task count beats the allocation's.
  CHECK(detect(with(slurm_4, {{"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "4"}})).world_size == 4);
  // Uneven nodes: "3,1" -> node 1 runs one task.
  auto uneven = detect(with(slurm_4, {{"SLURM_TASKS_PER_NODE", "3,1"}, {"SLURM_LOCALID", "0"}}));
  CHECK(uneven.local_world_size == 1);
  CHECK(detect(with(slurm_4, {{"SLURM_MASTER", "x"}, {"MASTER_ADDR", "head"}})).master_addr == "head");
}

TEST_CASE("a Slurm batch script that runs the program without srun: a config error at once, naming SLURM_NTASKS and srun") {
  // What `sbatch -n 4` gives the batch script itself (Slurm 22.05, read from a real one):
  // task 0 of the allocation, and no step (srun adds SLURM_STEP_ID, SLURM_STEP_NUM_TASKS).
  const vars batch{{"SLURM_PROCID", "0"},         {"SLURM_NTASKS", "4"},  {"SLURM_NPROCS", "4"},
                   {"SLURM_LOCALID", "0"},        {"SLURM_NODEID", "0"},  {"SLURM_TASKS_PER_NODE", "4"},
                   {"SLURM_JOB_ID", "1"},         {"SLURM_JOBID", "1"},   {"SLURM_JOB_NODELIST", "vm"},
                   {"SLURM_GTIDS", "0"},          {"SLURM_CPUS_ON_NODE", "4"}};
  CHECK(config_error(batch) ==
        "SLURM_NTASKS=4 is the allocation's task count, but this process was not started by srun (SLURM_PROCID is "
        "set, SLURM_STEP_ID is not: a batch script that runs the program itself), so no other task starts and it "
        "would wait GRADWIRE_TIMEOUT for 3 ranks that never come: start the program with srun in the batch script "
        "(srun ./program ...), which starts all 4 tasks: configuration error");
  // The variable that gave the size is the one named.
  vars nprocs = batch;
  nprocs.erase("SLURM_NTASKS");
  CHECK_THAT(config_error(nprocs), Contains("SLURM_NPROCS=4 is the allocation's task count"));
  // Started by srun (a step of 4 tasks, either spelling of the step id): task 0 of the job.
  for (const char* step : {"SLURM_STEP_ID", "SLURM_STEPID"}) {
    const auto spec = detect(with(batch, {{step, "0"}}));
    CHECK(spec.world_size == 4);
    CHECK(spec.rank == 0);
  }
  // Not refused: an allocation of one task (nothing to wait for); a size the program gives
  // itself (it starts its other ranks some other way).
  CHECK(detect(with(batch, {{"SLURM_NTASKS", "1"}, {"SLURM_TASKS_PER_NODE", "1"}})).world_size == 1);
  gc::overrides given;
  given.world_size = 4;
  CHECK(detect(batch, given).world_size == 4);
}

TEST_CASE("slurm host lists and task lists") {
  using gradwire::cluster::detail::first_slurm_host;
  using gradwire::cluster::detail::slurm_tasks_on_node;
  CHECK(first_slurm_host("node[01-04,07]") == "node01");
  CHECK(first_slurm_host("node[7,01-04]") == "node7");
  CHECK(first_slurm_host("a1,b2") == "a1");
  CHECK(first_slurm_host("single") == "single");
  CHECK(first_slurm_host("broken[01") == "");
  // Malformed lists are refused whole, never half read into a host name (found by fuzzing).
  CHECK(first_slurm_host("r[1[2]") == "");
  CHECK(first_slurm_host("node]") == "");
  CHECK(first_slurm_host("node[a-b]") == "");
  CHECK(first_slurm_host("node[]") == "");
  CHECK(slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(slurm_tasks_on_node("2(x3),1", 3) == 1);
  CHECK(slurm_tasks_on_node("2(x3),1", 4) == std::nullopt);
  CHECK(slurm_tasks_on_node("x", 0) == std::nullopt);
  CHECK(slurm_tasks_on_node("-2,1", 0) == std::nullopt);
  CHECK(slurm_tasks_on_node("1(x0),1", 0) == std::nullopt);
  CHECK(slurm_tasks_on_node("1(x2147483647),1(x2147483647),3", 2147483647) == 1);  // no overflow
  CHECK(slurm_tasks_on_node("2(x3)", -1) == std::nullopt);
}

TEST_CASE("precedence: torchrun over mpirun over srun over TF_CONFIG") {
  vars all = with(with(with(torchrun_2, slurm_4), {{"TF_CONFIG", tf_config_3}}), {});
  CHECK(detect(all).source == "torchrun");
  vars below = with(with(openmpi_2, slurm_4), {{"TF_CONFIG", tf_config_3}});
  CHECK(detect(below).source == "openmpi");
  CHECK(detect(with(slurm_4, {{"TF_CONFIG", tf_config_3}})).source == "slurm");
  // A broken TF_CONFIG is not read when a launcher's variables are there.
  CHECK(detect(with(slurm_4, {{"TF_CONFIG", "{"}})).source == "slurm");
}

TEST_CASE("TF_CONFIG: roles, addresses, rank order chief, workers, ps") {
  auto spec = detect({{"TF_CONFIG", tf_config_3}, {"GRADWIRE_JOB_TOKEN", "tf"}});
  CHECK(spec.source == "tf_config");
  CHECK(spec.world_size == 4);
  CHECK(spec.rank == 2);
  CHECK(spec.type() == gc::task_type::worker);
  CHECK(spec.roles ==
        std::vector{gc::task_type::chief, gc::task_type::worker, gc::task_type::worker, gc::task_type::ps});
  CHECK(spec.task_addresses == std::vector<std::string>{"host0:2222", "host1:2222", "host1:2223", "host2:2222"});
  CHECK(spec.count(gc::task_type::worker) == 2);
  CHECK(spec.count(gc::task_type::ps) == 1);
  CHECK(spec.master_addr == "host0");
  CHECK(spec.master_port == 2222);
  CHECK(spec.local_rank == 1);  // second task on host1
  CHECK(spec.local_world_size == 2);
  CHECK(spec.job_token == "tf");

  auto ps = detect({{"TF_CONFIG", R"({"cluster": {"worker": ["[::1]:7000", "[::1]:7001"], "ps": ["[::1]:7002"]},
                                      "task": {"type": "ps", "index": 0}})"}});
  CHECK(ps.rank == 2);
  CHECK(ps.type() == gc::task_type::ps);
  CHECK(ps.master_addr == "::1");  // no chief: worker 0
  CHECK(ps.master_port == 7000);
  CHECK(ps.roles[0] == gc::task_type::worker);
  CHECK(ps.local_world_size == 3);

  // MASTER_* beat the chief's address.
  auto moved = detect({{"TF_CONFIG", tf_config_3}, {"MASTER_ADDR", "elsewhere"}, {"MASTER_PORT", "3000"}});
  CHECK(moved.master_addr == "elsewhere");
  CHECK(moved.master_port == 3000);
}

TEST_CASE("TF_CONFIG errors name TF_CONFIG and the problem") {
  auto bad = [](const std::string& json) { return config_error({{"TF_CONFIG", json}}); };
  CHECK_THAT(bad("{not json"), Contains("TF_CONFIG") && Contains("not valid JSON"));
  // nlohmann's out_of_range for a number too large is a config error too (found by fuzzing).
  CHECK_THAT(bad(R"({"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":1E400}})"), Contains("not valid JSON"));
  CHECK_THAT(bad("[1]"), Contains("TF_CONFIG") && Contains("not a JSON object"));
  CHECK_THAT(bad(R"({"task": {"type": "worker"}})"), Contains("TF_CONFIG") && Contains("\"cluster\""));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:1"]}})"), Contains("TF_CONFIG") && Contains("\"task\""));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}})"),
             Contains("TF_CONFIG") && Contains("unknown task.type \"evaluator\""));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:1"], "evaluator": ["b:1"]}, "task": {"type": "worker", "index": 0}})"),
             Contains("TF_CONFIG") && Contains("unknown task type \"evaluator\""));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}})"),
             Contains("TF_CONFIG") && Contains("task.index 2 is out of range") && Contains("2 entries"));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})"),
             Contains("out of range"));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}})"),
             Contains("TF_CONFIG") && Contains("out of range"));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}})"),
             Contains("cluster.worker[0]") && Contains("host:port"));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}})"),
             Contains("cluster.worker[0]"));
  CHECK_THAT(bad(R"({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})"),
             Contains("cluster.worker is not a list"));
  CHECK_THAT(bad(R"({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}})"),
             Contains("at most one chief"));
  CHECK_THAT(bad(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"), Contains("no chief and no worker"));
  CHECK_THAT(bad(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}})"),
             Contains("task.index is not an integer"));

  gc::overrides given;
  given.world_size = 3;
  CHECK_THAT(config_error({{"TF_CONFIG", tf_config_3}}, given), Contains("contradicts TF_CONFIG"));
}

TEST_CASE("missing or contradictory settings name the variable to set") {
  CHECK_THAT(config_error({{"RANK", "3"}}),
             Contains("RANK=3 is set but WORLD_SIZE is not: set WORLD_SIZE (the number of processes)"));
  CHECK_THAT(config_error({{"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}),
             Contains("WORLD_SIZE=4 is set but RANK is not: set RANK") && Contains("0..3"));
  CHECK(detect({{"WORLD_SIZE", "1"}}).rank == 0);  // a one-process world needs no rank
  CHECK_THAT(config_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}),
             Contains("RANK=4 is out of range for WORLD_SIZE=4") && Contains("0..3"));
  CHECK_THAT(config_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}), Contains("RANK=-1"));
  CHECK_THAT(config_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
             Contains("WORLD_SIZE=0 is not a valid world size: set WORLD_SIZE"));
  // A world too large to be real is refused before a role is allocated per rank (found by fuzzing).
  CHECK_THAT(config_error({{"RANK", "0"}, {"WORLD_SIZE", "2000000000"}, {"MASTER_PORT", "29500"}}),
             Contains("WORLD_SIZE=2000000000 is more processes than gradwire supports"));
  CHECK_THAT(config_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), Contains("RANK=one is not a number: set RANK"));
  CHECK_THAT(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2x"}}), Contains("WORLD_SIZE=2x is not a number"));
  CHECK_THAT(config_error({{"RANK", "1"}, {"WORLD_SIZE", "99999999999"}}), Contains("is not a number"));
  CHECK_THAT(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), Contains("set MASTER_PORT"));
  CHECK_THAT(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}),
             Contains("MASTER_PORT=0 is not a port") && Contains("1..65535"));
  CHECK_THAT(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}), Contains("MASTER_PORT=70000"));
  CHECK_THAT(config_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}),
             Contains("MASTER_PORT=http is not a number"));
  CHECK_THAT(config_error(with(torchrun_2, {{"LOCAL_RANK", "2"}})), Contains("LOCAL_RANK=2 is out of range for LOCAL_WORLD_SIZE=2"));
  CHECK_THAT(config_error(with(torchrun_2, {{"LOCAL_WORLD_SIZE", "3"}})), Contains("LOCAL_WORLD_SIZE=3 is not in 1..2"));
  vars no_local_rank = torchrun_2;
  no_local_rank.erase("LOCAL_RANK");
  CHECK_THAT(config_error(no_local_rank), Contains("LOCAL_WORLD_SIZE=2 is set but LOCAL_RANK is not: set LOCAL_RANK"));
  CHECK_THAT(config_error({{"OMPI_COMM_WORLD_RANK", "1"}}),
             Contains("OMPI_COMM_WORLD_RANK=1 is set but OMPI_COMM_WORLD_SIZE is not"));
  CHECK_THAT(config_error({{"SLURM_PROCID", "1"}}), Contains("SLURM_PROCID=1 is set but SLURM_NTASKS is not"));
  CHECK_THAT(config_error(with(slurm_4, {{"SLURM_NTASKS", "2"}})), Contains("SLURM_PROCID=3 is out of range for SLURM_NTASKS=2"));
  // Empty variables count as unset.
  CHECK(detect({{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}}).source == "default");
}

TEST_CASE("bad explicit arguments name the argument") {
  gc::overrides rank_only;
  rank_only.rank = 1;
  CHECK_THAT(config_error({}, rank_only), Contains("overrides.rank=1 is set but WORLD_SIZE is not") &&
                                              Contains("overrides.world_size"));
  gc::overrides out_of_range;
  out_of_range.rank = 5;
  out_of_range.world_size = 2;
  out_of_range.master_port = 10;
  CHECK_THAT(config_error({}, out_of_range), Contains("overrides.rank=5 is out of range for overrides.world_size=2"));
  gc::overrides port;
  port.master_port = 65536;
  CHECK_THAT(config_error({}, port), Contains("overrides.master_port=65536") && Contains("1..65535"));
  gc::overrides addr;
  addr.master_addr = "";
  CHECK_THAT(config_error({}, addr), Contains("overrides.master_addr is empty"));
  gc::overrides local;
  local.local_rank = 1;
  CHECK_THAT(config_error({}, local), Contains("overrides.local_rank=1 is out of range"));
}

TEST_CASE("process_env reads the real environment") {
  CHECK(gc::process_env("PATH").has_value());
  CHECK_FALSE(gc::process_env("GRADWIRE_SURELY_NOT_SET_ANYWHERE").has_value());
}
