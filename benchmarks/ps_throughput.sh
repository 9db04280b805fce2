#!/usr/bin/env bash
# Parameter-server step throughput beside the loopback TCP bound, in one run:
# gradwire parameter_server<ps::sync> over transport::asio_tcp and over transport::ucx
# (UCX_TLS=tcp and UCX_TLS=sm; over shared memory both paths: one-sided put/get, the
# default there, and tagged messages) under scripts/gradwire-run, for 4 workers with 1 and 2
# servers and 2 workers with 1 server, 64 KiB .. 64 MiB, and a
# single-stream loopback socket test (Python, one sender thread, one receiver thread,
# 1 GiB in 4 MiB sendall chunks, median of 3) as the bound. Prints each run's table and the
# combined table; writes results/ps_throughput.{txt,csv}. Each run goes twice: without and
# with standbys (ps::options::standby: every server replicates each update to a standby rank
# before a step's pulls are answered), and a last table gives what the replica costs
# (step time with / without, same transport, counts and size).
# Usage: benchmarks/ps_throughput.sh [ps_throughput flags...]   e.g. --iters 20 --sizes 1M,16M
#   (this script passes --iters 40: 200 steps at 64 KiB, 40 at 1 MiB, 20 at 16 MiB, 10 at 64 MiB)
#   GRADWIRE_PS_CONFIGS (default "4:1 4:2 2:1", WORKERS:SERVERS),
#   GRADWIRE_PS_TRANSPORTS (default "asio ucx:tcp ucx:sm ucx:sm:off"; ucx:TLS[:auto|on|off]
#   sets UCX_TLS and GRADWIRE_UCX_ONE_SIDED), GRADWIRE_PS_STANDBY (default "off on"),
#   GRADWIRE_RESULTS_DIR,
#   GRADWIRE_BENCH_BUILD_DIR
# Exits non-zero if any run failed or any result was wrong; never on time.
set -euo pipefail
gradwire_root=$(cd "$(dirname "$0")/.." && pwd)
source "$gradwire_root/scripts/deps.sh"

gradwire_require_packages "${gradwire_build_packages[@]}"
configs=${GRADWIRE_PS_CONFIGS:-4:1 4:2 2:1}
transports=${GRADWIRE_PS_TRANSPORTS:-asio ucx:tcp ucx:sm ucx:sm:off}
standbys=${GRADWIRE_PS_STANDBY:-off on}
gradwire_configure_benchmarks -DGRADWIRE_ASIO=ON -DGRADWIRE_UCX=ON
cmake --build "$build_dir" --target ps_throughput -j"$(nproc)"

txt=$results/ps_throughput.txt
csv=$results/ps_throughput.csv
runs=$(mktemp "${TMPDIR:-/tmp}/ps_throughput.XXXXXX.csv")
trap 'rm -f "$runs"' EXIT
rm -f "$runs" "$csv"
: >"$txt"

# --- the bound: one TCP stream over loopback, in this run, before the PS runs --------
bound=$(/usr/bin/python3 - <<'EOF'
import socket, statistics, threading, time

TOTAL, CHUNK, RUNS = 1 << 30, 4 << 20, 3

def once():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received = [0]

    def receive():
        conn, _ = server.accept()
        view = memoryview(bytearray(CHUNK))
        while received[0] < TOTAL:
            n = conn.recv_into(view)
            if n == 0:
                break
            received[0] += n
        conn.close()

    receiver = threading.Thread(target=receive)
    receiver.start()
    sender = socket.create_connection(server.getsockname())
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = bytes(CHUNK)
    t0 = time.perf_counter()
    for _ in range(TOTAL // CHUNK):
        sender.sendall(payload)
    receiver.join()  # the clock stops when the last byte has been read
    seconds = time.perf_counter() - t0
    sender.close()
    server.close()
    if received[0] != TOTAL:
        raise SystemExit(f"loopback bound: received {received[0]} of {TOTAL} bytes")
    return TOTAL / seconds

rates = [once() for _ in range(RUNS)]
print("# loopback TCP bound: one stream, Python sender and receiver threads, 1 GiB in 4 MiB sendall chunks; "
      "runs: " + ", ".join(f"{r / 1e9:.2f}" for r in rates) + f" GB/s; median {statistics.median(rates) / 1e9:.2f} GB/s")
print(f"{statistics.median(rates) / 1e6:.1f}")
EOF
)
bound_mbps=$(tail -n 1 <<<"$bound")
printf '%s\n#\n' "$(head -n 1 <<<"$bound")" | tee -a "$txt"

# --- the parameter-server runs ---------------------------------------------------------
status=0
for transport in $transports; do
  for config in $configs; do
   for standby in $standbys; do
    workers=${config%%:*} servers=${config##*:}
    ps_ranks=$servers
    [ "$standby" = on ] && ps_ranks=$((2 * servers))
    # asio, or ucx:TLS[:ONE_SIDED]. Flags given to this script come last, so they override these defaults.
    ucx_env=(UCX_WARN_UNUSED_ENV_VARS=n)
    if [[ $transport == ucx:* ]]; then
      IFS=: read -r _ tls one_sided <<<"$transport"
      ucx_env+=("UCX_TLS=$tls" "GRADWIRE_UCX_ONE_SIDED=${one_sided:-auto}")
    fi
    if ! env "${ucx_env[@]}" \
      "$gradwire_root/scripts/gradwire-run" -n "$workers" --ps "$ps_ranks" --no-prefix --timeout 300 -- \
      "$build_dir/benchmarks/ps_throughput" --transport "${transport%%:*}" --standby "$standby" --iters 40 \
      --csv "$runs" "$@" 2>&1 | tee -a "$txt"; then
      echo "# ps_throughput over $transport with $workers worker(s), $servers server(s), standby $standby failed" |
        tee -a "$txt"
      status=1
    fi
   done
  done
done

# --- the combined table and CSV --------------------------------------------------------
/usr/bin/python3 - "$runs" "$csv" "$bound_mbps" <<'EOF' | tee -a "$txt"
import csv, sys

runs, out, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])

def human(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"

with open(runs, newline="") as f:
    rows = list(csv.DictReader(f))
print(f"# parameter_server<ps::sync> beside the loopback bound ({bound:.0f} MB/s, one stream, one direction);")
print("# aggregate = workers * 2 * size / step time, the servers' traffic in both directions; ratio = aggregate / bound")
print("#")
head = ("transport", "mode", "workers", "servers", "size", "step (ms)", "per-worker MB/s", "aggregate MB/s",
        "bound MB/s", "ratio")
print("  %-16s %-12s %7s %7s %9s %10s %15s %14s %10s %6s" % head)
for r in rows:
    aggregate = float(r["aggregate_mbps"])
    r["bound_mbps"] = f"{bound:.1f}"
    r["aggregate_over_bound"] = f"{aggregate / bound:.3f}"
    print("  %-16s %-12s %7s %7s %9s %10.3f %15.1f %14.1f %10.1f %6.3f" % (
        r["transport"], r["mode"], r["workers"], r["servers"], human(int(r["size_bytes"])), float(r["time_us"]) / 1e3,
        float(r["per_worker_mbps"]), aggregate, bound, aggregate / bound))
# What a standby costs: the same run with and without one.
plain = {(r["transport"], r["workers"], r["servers"], r["size_bytes"]): r for r in rows if r["mode"] == "sync"}
paired = [(plain[k], r) for r in rows if r["mode"] == "sync+standby"
          for k in [(r["transport"], r["workers"], r["servers"], r["size_bytes"])] if k in plain]
if paired:
    print("#")
    print("# failover's cost: step time with a standby per server / without (1.00: free)")
    print("  %-16s %7s %7s %9s %12s %12s %8s" % ("transport", "workers", "servers", "size", "plain (ms)",
                                                "standby (ms)", "ratio"))
    for a, b in paired:
        print("  %-16s %7s %7s %9s %12.3f %12.3f %8.2f" % (
            a["transport"], a["workers"], a["servers"], human(int(a["size_bytes"])), float(a["time_us"]) / 1e3,
            float(b["time_us"]) / 1e3, float(b["time_us"]) / float(a["time_us"])))
wrong = sum(int(r["wrong"]) for r in rows)
print(f"# #wrong (rank 0's parameters off the closed form, all runs): {wrong}")
with open(out, "w", newline="") as f:
    fields = list(rows[0].keys()) if rows else []
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
EOF
echo "# results in $results"
exit $status
