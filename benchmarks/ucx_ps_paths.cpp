// Which UCX path should a parameter server's push + pull take? Two-sided tagged messages
// (what transport::ucx does) against one-sided RMA (ucp_put_nbx / ucp_get_nbx into the
// server's registered memory, with its rkey), measured in one run between two processes.
//
//   UCX_TLS=sm scripts/gradwire-run -n 2 -- ucx_ps_paths [--sizes 64K,1M,16M,64M] [--iters N]
//
// Rank 0 is the server, rank 1 the worker. One step, timed at the worker:
//   tag: send the gradient (tagged), receive the parameters (tagged); the server receives
//        the gradient into its buffer and sends its parameters back.
//   rma: put the gradient into the server's gradient region and flush, send an 8-byte
//        "pushed" note; the server answers with a "ready" note (it would apply the update
//        there); get the parameters from the server's region and flush.
// The server adds nothing (no optimizer): this measures the wire, the part the paths
// differ in. Prints the median step time and the push+pull bandwidth for each.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <gradwire/asio.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_table.hpp"

namespace gw = gradwire;
namespace bench = gradwire::bench;

namespace {

void check(ucs_status_t s, const char* what) {
  if (s != UCS_OK) throw gw::error(gw::errc::config, std::string(what) + ": " + ucs_status_string(s));
}

struct ucx_rank {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h peer = nullptr;

  ucx_rank() {
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
    check(ucp_init(&p, config, &context), "ucp_init");
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context, &wp, &worker), "ucp_worker_create");
  }
  ~ucx_rank() {
    if (peer) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      const ucs_status_ptr_t r = ucp_ep_close_nbx(peer, &p);  // its outcome does not matter any more
      if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker);
        ucp_request_free(r);
      }
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
  }

  std::vector<std::byte> address() {
    ucp_address_t* a = nullptr;
    std::size_t n = 0;
    check(ucp_worker_get_address(worker, &a, &n), "ucp_worker_get_address");
    std::vector<std::byte> out(reinterpret_cast<std::byte*>(a), reinterpret_cast<std::byte*>(a) + n);
    ucp_worker_release_address(worker, a);
    return out;
  }
  void connect(const std::vector<std::byte>& address) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    check(ucp_ep_create(worker, &p, &peer), "ucp_ep_create");
  }

  // Busy-waits: both paths are measured the same way, with a core each.
  void finish(ucs_status_ptr_t r) {
    if (r == nullptr) return;
    if (UCS_PTR_IS_ERR(r)) check(UCS_PTR_STATUS(r), "UCX operation");
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker);
    check(ucp_request_check_status(r), "UCX operation");
    ucp_request_free(r);
  }
  void send(const void* data, std::size_t n, ucp_tag_t tag) {
    ucp_request_param_t p{};
    finish(ucp_tag_send_nbx(peer, data, n, tag, &p));
  }
  void recv(void* data, std::size_t n, ucp_tag_t tag) {
    ucp_request_param_t p{};
    finish(ucp_tag_recv_nbx(worker, data, n, tag, ~ucp_tag_t{0}, &p));
  }
  void flush() {
    ucp_request_param_t p{};
    finish(ucp_ep_flush_nbx(peer, &p));
  }
};

// Server memory the worker writes gradients into and reads parameters from.
struct registered {
  ucp_mem_h memory = nullptr;
  std::vector<std::byte> rkey;
  registered(ucx_rank& u, void* data, std::size_t n) : context(u.context) {
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = data;
    p.length = std::max<std::size_t>(n, 1);
    check(ucp_mem_map(u.context, &p, &memory), "ucp_mem_map");
    void* packed = nullptr;
    std::size_t size = 0;
    check(ucp_rkey_pack(u.context, memory, &packed, &size), "ucp_rkey_pack");
    rkey.assign(static_cast<std::byte*>(packed), static_cast<std::byte*>(packed) + size);
    ucp_rkey_buffer_release(packed);
  }
  ~registered() { ucp_mem_unmap(context, memory); }
  ucp_context_h context;
};

enum : ucp_tag_t { grad_tag = 1, params_tag, pushed_tag, ready_tag, rkey_tag, rkey_size_tag, address_tag };

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes{std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20};
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--iters") iters = std::stoi(value);
    else if (flag != "--sizes" || !bench::detail::parse_size_list(value, sizes)) {
      std::fprintf(stderr, "usage: ucx_ps_paths [--sizes 64K,1M,...] [--iters N]  (2 ranks: gradwire-run -n 2)\n");
      return 2;
    }
  }
  try {
    const auto spec = gw::cluster::detect();
    if (spec.world_size != 2) throw gw::error(gw::errc::config, "ucx_ps_paths runs on exactly 2 ranks");
    const int me = spec.rank;
    std::optional<gw::rendezvous::store_server> server;
    if (me == 0) server.emplace(spec.master_addr, static_cast<std::uint16_t>(spec.master_port), spec.job_token);
    gw::rendezvous::store_client store(spec.master_addr, static_cast<std::uint16_t>(spec.master_port), spec.job_token);
    ucx_rank u;
    store.set("ucx_ps_paths/" + std::to_string(me), u.address());
    u.connect(store.get("ucx_ps_paths/" + std::to_string(1 - me)));

    const char* tls = std::getenv("UCX_TLS");
    if (me == 1)
      std::printf("# parameter-server step paths over UCX (UCX_TLS=%s), 1 worker + 1 server process; step = push S + pull S;\n"
                  "# median of the worker's step times; bw = 2 S / step\n#\n#  %10s %12s %10s %12s %10s %8s\n",
                  tls ? tls : "default", "size(B)", "tag(us)", "tag(MB/s)", "rma(us)", "rma(MB/s)", "rma/tag");
    for (const std::size_t bytes : sizes) {
      std::vector<std::byte> grad(bytes, std::byte{1}), params(bytes, std::byte{2});
      const int n = bench::iterations_for(bytes, iters), warmup = 2;
      std::uint64_t note = 0;
      // --- tagged ---
      std::vector<double> tag_times;
      for (int k = 0; k < warmup + n; ++k) {
        if (me == 1) {
          const double t0 = bench::seconds_now();
          u.send(grad.data(), bytes, grad_tag);
          u.recv(params.data(), bytes, params_tag);
          if (k >= warmup) tag_times.push_back(bench::seconds_now() - t0);
        } else {
          u.recv(grad.data(), bytes, grad_tag);
          u.send(params.data(), bytes, params_tag);
        }
      }
      // --- RMA: the server registers both regions and hands out their keys ---
      std::vector<double> rma_times;
      if (me == 0) {
        registered g(u, grad.data(), bytes), p(u, params.data(), bytes);
        std::uint64_t where[4] = {reinterpret_cast<std::uint64_t>(grad.data()), reinterpret_cast<std::uint64_t>(params.data()),
                                  g.rkey.size(), p.rkey.size()};
        u.send(where, sizeof where, rkey_size_tag);
        u.send(g.rkey.data(), g.rkey.size(), rkey_tag);
        u.send(p.rkey.data(), p.rkey.size(), rkey_tag);
        for (int k = 0; k < warmup + n; ++k) {
          u.recv(&note, sizeof note, pushed_tag);  // the gradient is in place: apply it here
          u.send(&note, sizeof note, ready_tag);
        }
        u.recv(&note, sizeof note, pushed_tag);  // the worker is done with the regions
      } else {
        std::uint64_t where[4];
        u.recv(where, sizeof where, rkey_size_tag);
        std::vector<std::byte> gk(where[2]), pk(where[3]);
        u.recv(gk.data(), gk.size(), rkey_tag);
        u.recv(pk.data(), pk.size(), rkey_tag);
        ucp_rkey_h grad_key = nullptr, params_key = nullptr;
        check(ucp_ep_rkey_unpack(u.peer, gk.data(), &grad_key), "ucp_ep_rkey_unpack");
        check(ucp_ep_rkey_unpack(u.peer, pk.data(), &params_key), "ucp_ep_rkey_unpack");
        for (int k = 0; k < warmup + n; ++k) {
          const double t0 = bench::seconds_now();
          ucp_request_param_t rp{};
          u.finish(ucp_put_nbx(u.peer, grad.data(), bytes, where[0], grad_key, &rp));
          u.flush();
          u.send(&note, sizeof note, pushed_tag);
          u.recv(&note, sizeof note, ready_tag);
          u.finish(ucp_get_nbx(u.peer, params.data(), bytes, where[1], params_key, &rp));
          u.flush();
          if (k >= warmup) rma_times.push_back(bench::seconds_now() - t0);
        }
        ucp_rkey_destroy(grad_key);
        ucp_rkey_destroy(params_key);
        u.send(&note, sizeof note, pushed_tag);
        const double tag = bench::median(tag_times), rma = bench::median(rma_times);
        std::printf("   %10zu %12.1f %10.1f %12.1f %10.1f %8.2f\n", bytes, tag * 1e6, 2.0 * bytes / tag / 1e6, rma * 1e6,
                    2.0 * bytes / rma / 1e6, rma / tag);
        std::fflush(stdout);
      }
    }
    u.flush();
    store.set("ucx_ps_paths/done/" + std::to_string(me), std::string("1"));
    store.get("ucx_ps_paths/done/" + std::to_string(1 - me));  // rank 0 serves the store until both are done
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ucx_ps_paths: %s\n", e.what());
    return 1;
  }
}
