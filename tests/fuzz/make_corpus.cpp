// Writes the fuzz harnesses' seed corpora: small valid inputs of every format, made with
// gradwire's own encoders (wire::encode, store pack, save_checkpoint, describe), so that
// they follow the formats when those change.
//
//   make_corpus DIR          writes DIR/<harness>/<seed> (tests/fuzz/corpus in the repository)
//   make_corpus --check DIR  exits 1 if DIR differs from what it would write (a ctest)
#include <gradwire/ps/protocol.hpp>
#include <gradwire/rendezvous/store.hpp>
#include <gradwire/support/wire.hpp>
#include <gradwire/transport/simulated/cluster_model.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint_model.hpp"

namespace fs = std::filesystem;
namespace wire = gradwire::support::wire;
namespace rz = gradwire::rendezvous::detail;
namespace ps = gradwire::ps::detail;

namespace {

using bytes = std::vector<std::byte>;
std::map<std::string, bytes> corpus;  // "<harness>/<seed>" -> contents

struct builder {
  bytes out;
  builder& u8(std::uint8_t v) { return raw(&v, 1); }
  template <class T>
  builder& le(T v) { return raw(&v, sizeof v); }  // the hosts gradwire supports are little-endian
  builder& raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
    return *this;
  }
  builder& text(std::string_view s) { return raw(s.data(), s.size()); }
  builder& span(std::span<const std::byte> s) { return raw(s.data(), s.size()); }
};

void add(const std::string& name, const bytes& b) { corpus[name] = b; }
void add(const std::string& name, std::string_view text) { add(name, builder{}.text(text).out); }

const std::uint64_t job = wire::token_hash("fuzz-job");

// [mode][header][payload], as wire_header, store_request and store_reply read it.
bytes frame(std::uint8_t mode, wire::frame_header h, std::span<const std::byte> payload, std::uint64_t token = job) {
  h.token_hash = token;
  h.length = payload.size();
  if (h.flags & wire::payload_checksummed) h.payload_crc = wire::crc32c(payload);
  return builder{}.u8(mode).span(wire::encode(h)).span(payload).out;
}
std::span<const std::byte> as_bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

void wire_seeds() {
  using k = wire::frame_kind;
  add("wire_header/data", frame(0, {k::data, 1, 0, 0, 0, 42, 0, 3}, as_bytes("\x01\x02\x03\x04\x05\x06\x07\x08")));
  add("wire_header/data_checksummed",
      frame(0, {k::data, wire::raw_bytes, wire::payload_checksummed, 0, 0, 7, 0, 1}, as_bytes("payload with a CRC")));
  add("wire_header/hello", frame(0, {k::hello, wire::raw_bytes, 0, 0, 0, 0, 0, 2}, as_bytes("rank 2 hello")));
  add("wire_header/abort", frame(0, {k::abort, wire::raw_bytes, 0, 0, 0, 2, 0, 0}, as_bytes("rank 0 failed: why")));
  add("wire_header/goodbye", frame(0, {k::goodbye, wire::raw_bytes, 0, 0, 0, 0, 0, 5}, {}));
  add("wire_header/status", frame(3, {k::status, wire::raw_bytes, 0, 0, 0, 9, 0, 1}, as_bytes("waiting")));
  add("wire_header/other_job", frame(0, {k::welcome, wire::raw_bytes, 0, 0, 0, 0, 0, 0}, {}, wire::token_hash("other")));
}

void store_seeds() {
  using k = wire::frame_kind;
  auto request = [](rz::store_op op, std::string_view key, std::span<const std::byte> value, std::uint16_t flags) {
    const auto payload = rz::pack(std::string(key), value);
    return frame(0, {k::store_request, wire::raw_bytes, flags, 0, 0, static_cast<std::uint64_t>(op), 0, 0}, payload);
  };
  const std::int64_t delta = 1;
  add("store_request/set", request(rz::store_op::set, "gradwire/tcp/0", as_bytes("127.0.0.1:4000"), 0));
  add("store_request/get", request(rz::store_op::get, "gradwire/tcp/1", {}, 0));
  add("store_request/add", request(rz::store_op::add, "gradwire/barrier", std::as_bytes(std::span(&delta, 1)), 0));
  add("store_request/set_checksummed",
      request(rz::store_op::set, "host/3", as_bytes("boot-id"), wire::payload_checksummed));

  auto reply = [](rz::store_op op, k kind, std::span<const std::byte> body) {
    return frame(static_cast<std::uint8_t>(static_cast<int>(op) << 2), {kind, wire::raw_bytes, 0, 0, 0, 0, 0, 0}, body);
  };
  const std::int64_t sum = 4;
  add("store_reply/set", reply(rz::store_op::set, k::store_reply, {}));
  add("store_reply/get", reply(rz::store_op::get, k::store_reply, as_bytes("127.0.0.1:4000")));
  add("store_reply/get_v6", reply(rz::store_op::get, k::store_reply, as_bytes("[::1]:29500")));
  add("store_reply/add", reply(rz::store_op::add, k::store_reply, std::as_bytes(std::span(&sum, 1))));
  add("store_reply/refused", reply(rz::store_op::get, k::refuse, as_bytes("frame belongs to another job (job token)")));
}

void ps_seeds() {
  auto request = [](std::uint8_t mode, std::uint64_t version, std::uint64_t updates, const ps::request_header& h) {
    return builder{}.u8(mode).le(version).le(updates).span(ps::bytes_of(h)).out;
  };
  add("ps_protocol/push", request(0, 10, 30, {ps::request_kind::push, 0, 9, 11, 28}));
  add("ps_protocol/push_in_window", request(0, 10, 30, {ps::request_kind::push, ps::in_window, 10, 12, 30}));
  add("ps_protocol/pull_sync", request(0, 10, 30, {ps::request_kind::pull, 0, 11, 11, 0}));
  add("ps_protocol/done", request(0, 10, 30, {ps::request_kind::done, 0, 0, 12, 0}));
  const ps::reply_header r{12, 40, 45, 2, 1, 3};
  add("ps_protocol/reply", builder{}.u8(1).le(std::uint64_t{11}).le(std::uint16_t{4}).span(ps::bytes_of(r)).le(1.5).out);
  // Mode bit 1: build a legal request or reply from the bytes that follow the context.
  add("ps_protocol/legal_request", builder{}.u8(2).le(std::uint64_t{5}).le(std::uint64_t{9}).text("push pull done ..").out);
  add("ps_protocol/legal_reply", builder{}.u8(3).le(std::uint64_t{5}).le(std::uint16_t{3}).text("a reply, a reply.....").out);

  // Mode 4: a server's update header to its standby, after the standby's version, update and applied counts.
  auto update = [](std::uint64_t version, std::uint64_t updates, std::uint64_t applied, const ps::replica_header& h) {
    return builder{}.u8(4).le(version).le(updates).le(applied).span(ps::bytes_of(h)).out;
  };
  using rk = ps::replica_kind;
  // A sync step of 4 gradients (the version moves), an async update scaled by 1 / lag in float (applied moves).
  add("ps_protocol/replica_sync", update(20, 57, 80, {rk::update, 0, 0.25, 20, 57, 83, 21, 83}));
  add("ps_protocol/replica_async", update(9, 40, 40, {rk::update, 0, double{1.0f / 3.0f}, 10, 40, 40, 10, 41}));
  add("ps_protocol/replica_done", update(21, 58, 83, {rk::done}));
  // Mode 5: the standby's acknowledgement, after the updates acknowledged and sent and the
  // version the next update took the server to.
  const ps::replica_ack ack{21, 57};
  add("ps_protocol/replica_ack",
      builder{}.u8(5).le(std::uint64_t{56}).le(std::uint64_t{58}).le(std::uint64_t{21}).span(ps::bytes_of(ack)).out);
  add("ps_protocol/legal_replica_header",
      builder{}.u8(6).le(std::uint64_t{7}).le(std::uint64_t{12}).le(std::uint64_t{30}).text("an update, its counters").out);
  add("ps_protocol/legal_replica_ack",
      builder{}.u8(7).le(std::uint64_t{12}).le(std::uint64_t{14}).le(std::uint64_t{9}).out);
}

template <class V, class Optimizer>
void checkpoint_seed(std::uint8_t mode, const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("gradwire-make-corpus-" + std::to_string(::getpid()) + ".ckpt");
  gradwire::fuzz::checkpoint_model<V, Optimizer> model(Optimizer{}, 11);
  gradwire::save_checkpoint(p, model, 42);
  std::ifstream in(p, std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(p);
  add("checkpoint/" + name, builder{}.u8(mode).raw(file.data(), file.size()).out);
}

void checkpoint_seeds() {
  namespace optim = gradwire::optim;
  checkpoint_seed<float, optim::sgd>(0 << 1, "sgd_float");
  checkpoint_seed<float, optim::momentum>(1 << 1, "momentum_float");
  checkpoint_seed<float, optim::adam>(2 << 1, "adam_float");
  checkpoint_seed<double, optim::adamw>(3 << 1 | 8, "adamw_double");
}

void text_seeds() {
  add("tf_config/worker", R"({"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host1:2223"], "ps": ["host2:2222"]}, "task": {"type": "worker", "index": 1}})");
  add("tf_config/chief_only", R"({"cluster":{"chief":["127.0.0.1:5000"]},"task":{"type":"chief"}})");
  add("tf_config/ipv6_ps", R"({"cluster":{"worker":["[::1]:7000","[::1]:7001"],"ps":["[fe80::1]:7002"]},"task":{"type":"ps","index":0}})");

  add("slurm_lists/hosts", builder{}.le(std::int32_t{0}).text("node[01-04,07],gpu-3").out);
  add("slurm_lists/tasks", builder{}.le(std::int32_t{3}).text("2(x3),1").out);
  add("slurm_lists/ranges", builder{}.le(std::int32_t{1}).text("r[1-2]-n[5-6]").out);

  add("cluster_model/two_hosts", "hosts=2 ranks_per_host=4 bandwidth=10Gbit latency=20us");
  add("cluster_model/stragglers", "hosts=4,ranks_per_host=1\nslow=2:1.5 jitter=0.1 tail=0.05:1.5:10 # long tail\nseed=7");
  add("cluster_model/faults", "hosts=3 local_bandwidth=10GB local_latency=2us overhead=1us compute=modelled speed=0.5 die=1@2.5s");
  add("cluster_model/described", gradwire::simulation::describe(gradwire::simulation::cluster_model{}));
}

// launcher_env: [overrides][variable index][value]\0...; indices as in launcher_env.cpp.
void env_seeds() {
  enum : std::uint8_t {
    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, OMPI_RANK, OMPI_SIZE, OMPI_LOCAL_RANK, OMPI_LOCAL_SIZE,
    OMPI_JOBID, PMIX_NAMESPACE, OMPI_SECRET, SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NUM_TASKS, SLURM_NPROCS,
    SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE,
    SLURM_JOB_ID, SLURM_JOBID, SLURM_STEP_ID, SLURM_STEPID, SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST,
    TF_CONFIG, MASTER_ADDR, MASTER_PORT, JOB_TOKEN, NUM_PS, TIMEOUT, LISTEN_HOST, WIRE_CHECKSUM, HOST_ID,
    SOCKET_BUFFER, POLL_US, HEARTBEAT, STALL_WARN, STALL_TIMEOUT, STEP_TIMEOUT,
  };
  using var = std::pair<std::uint8_t, std::string_view>;
  auto env = [](std::uint8_t overrides, std::initializer_list<var> vars) {
    builder b;
    b.u8(overrides);
    for (const auto& [index, value] : vars) b.u8(index).text(value).u8(0);
    return b.out;
  };
  add("launcher_env/torchrun", env(0, {{RANK, "1"}, {WORLD_SIZE, "4"}, {LOCAL_RANK, "1"}, {LOCAL_WORLD_SIZE, "2"},
                                       {MASTER_ADDR, "10.0.0.1"}, {MASTER_PORT, "29500"}, {NUM_PS, "1"}}));
  add("launcher_env/openmpi", env(0, {{OMPI_RANK, "0"}, {OMPI_SIZE, "2"}, {OMPI_LOCAL_RANK, "0"}, {OMPI_LOCAL_SIZE, "2"},
                                      {OMPI_JOBID, "12345"}, {OMPI_SECRET, "abc-def"}}));
  add("launcher_env/slurm", env(0, {{SLURM_PROCID, "5"}, {SLURM_NTASKS, "8"}, {SLURM_LOCALID, "1"}, {SLURM_NODEID, "2"},
                                    {SLURM_TASKS_PER_NODE, "2(x3),2"}, {SLURM_JOB_ID, "777"}, {SLURM_STEP_ID, "0"},
                                    {SLURM_JOB_NODELIST, "node[01-04,07],gpu-3"}}));
  add("launcher_env/tf_config",
      env(0, {{TF_CONFIG, R"({"cluster":{"chief":["a:1"],"worker":["b:2","a:3"]},"task":{"type":"worker","index":1}})"}}));
  add("launcher_env/knobs", env(0, {{RANK, "0"}, {WORLD_SIZE, "2"}, {MASTER_PORT, "4000"}, {TIMEOUT, "30"},
                                    {LISTEN_HOST, "0.0.0.0"}, {WIRE_CHECKSUM, "1"}, {SOCKET_BUFFER, "4194304"},
                                    {POLL_US, "50"}, {HEARTBEAT, "2"}, {STALL_WARN, "0.5"}, {STALL_TIMEOUT, "120"},
                                    {STEP_TIMEOUT, "300"}, {JOB_TOKEN, "secret"}, {HOST_ID, "rack1-host2"}}));
  builder overrides;
  overrides.u8(1 | 2 | 8).le(std::int32_t{2}).le(std::int32_t{3}).le(std::int32_t{5000});
  add("launcher_env/overrides", overrides.out);
}

bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  const std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return builder{}.raw(c.data(), c.size()).out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::string(argv[1]) == "--check";
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: make_corpus [--check] DIR\n");
    return 2;
  }
  const fs::path dir = argv[argc - 1];
  wire_seeds();
  store_seeds();
  ps_seeds();
  checkpoint_seeds();
  text_seeds();
  env_seeds();
  int problems = 0;
  std::set<fs::path> made;
  for (const auto& [name, contents] : corpus) {
    const fs::path p = dir / name;
    made.insert(p);
    if (check) {
      if (!fs::exists(p) || read_file(p) != contents) {
        std::fprintf(stderr, "%s is missing or out of date\n", p.c_str());
        ++problems;
      }
      continue;
    }
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(contents.data()),
                                              static_cast<std::streamsize>(contents.size()));
  }
  if (check && fs::exists(dir))
    for (const auto& entry : fs::recursive_directory_iterator(dir))
      if (entry.is_regular_file() && !made.count(entry.path())) {
        std::fprintf(stderr, "%s is not a seed make_corpus writes (remove it, or add it to make_corpus.cpp)\n",
                     entry.path().c_str());
        ++problems;
      }
  if (problems) {
    std::fprintf(stderr, "%d seed(s) differ: run make_corpus %s (scripts/fuzz --corpus does)\n", problems, dir.c_str());
    return 1;
  }
  std::printf("%s %zu seeds in %s\n", check ? "checked" : "wrote", corpus.size(), dir.c_str());
  return 0;
}
