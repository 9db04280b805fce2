#!/usr/bin/env python3
"""Live recovery's state transfer on emulated hosts: how much of its link a replacement's state takes.

    benchmarks/state_transfer_hosts.py [--rates "1gbit 10gbit"] [--sizes "100M 1G"] [--rounds 2]
                                       [--binary PATH] [--run-timeout 600]

benchmarks/state_transfer.sh's job (benchmarks/state_transfer.cpp: a model whose parameters and
Adam moments come to --sizes, the last rank killed after step 1 and restarted by gradwire-run
--max-restarts 1, its replacement taking the state from the two members) with one rank on each
of 3 emulated hosts (scripts/cluster: network namespaces, root only), every host's link shaped
at each of --rates (tc tbf, both directions). The replacement takes chunk j from member j % 2,
so both senders share its one link: the rate to compare with is that link's. Rounds are
interleaved (round, then rate, then size). Prints per rate and size the median over rounds
of the transfer's rate, as GB/s and as a share of the link, beside the issue's target (>= 80%
of the link for 1 GB), and the median time to join; writes results/state_transfer_hosts/
summary.{txt,csv} and rows.csv (one row per run), every host's output beside them. Checks that
the three ranks' parameters hash the same after the replacement's first step; exits 1 if a run
failed or differed. Never fails on time.

The binary: --binary, else build-bench/benchmarks/state_transfer (benchmarks/state_transfer.sh
builds it), else the test build's build/benchmarks/state_transfer.

Environment: GRADWIRE_RESULTS_DIR (default results).
"""
import argparse
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from elastic_trials import base_env, gwcluster  # noqa: E402  (the hosts' jobs of elastic.sh)
import hosts_bench  # noqa: E402

HOSTS = 3
TARGET = 0.8  # of the link, for 1 GB
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMG]?)$")
TOOK = re.compile(r"rank (\d+): took ([\d.]+) MB of state in ([\d.]+) s: ([\d.]+) GB/s \(join ([\d.]+) s")
HASH = re.compile(r"rank (\d+): hash ([0-9a-f]{16})")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1gbit 10gbit", help='link rates, tc units (default "1gbit 10gbit")')
    p.add_argument("--sizes", default="100M 1G", help='parameters + Adam state, K/M/G (default "100M 1G")')
    p.add_argument("--rounds", type=int, default=2, help="rounds; medians over them (default 2)")
    p.add_argument("--binary", help="the state_transfer binary (default: build-bench's, else build's)")
    p.add_argument("--run-timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--port", type=int, default=29800, help="first master port, +1 per run (default 29800)")
    o = p.parse_args(argv)
    o.rates, o.sizes = o.rates.split(), o.sizes.split()
    if not o.rates or not o.sizes:
        p.error("--rates and --sizes each need at least one value")
    o.rate_bits = {}
    for r in o.rates:
        try:
            o.rate_bits[r] = gwcluster.parse_rate(r)
        except gwcluster.ClusterError as e:
            p.error(f"--rates: {e}")
        if not o.rate_bits[r]:
            p.error(f"--rates: {r!r} is no rate (a shaped link is needed to compare with)")
    for s in o.sizes:
        if not SIZE_RE.match(s):
            p.error(f"--sizes: {s!r} is not a size such as 100M or 1G")
    if o.rounds < 1 or o.run_timeout <= 0:
        p.error("--rounds >= 1 and --run-timeout > 0")
    o.binary = hosts_bench.find_binary(p, o.binary, "build-bench/benchmarks/state_transfer",
                                       "run benchmarks/state_transfer.sh once (it builds it)")
    hosts_bench.require_emulated_hosts(p)
    return o


def run_once(o, cluster, size, port, stem):
    """One job: {'seconds', 'gb_per_s', 'join_seconds', 'mb'} or (None, why)."""
    env = base_env()
    env["GRADWIRE_TIMEOUT"] = "300"  # 1 GB through 1 Gbit/s takes about 9 s; a step of the members as long
    out, codes = hosts_bench.run_job([o.binary, "--bytes", size], cluster, env, port, stem, o.run_timeout, HOSTS,
                                     launcher_args=("--max-restarts", "1"))
    if codes is None:
        return None, f"still running after {o.run_timeout + 15:g} s, killed"
    took = TOOK.search(out)
    hashes = dict(HASH.findall(out))
    if any(codes) or took is None:
        return None, f"launcher exit codes {codes}" + ("" if took else ", no transfer reported")
    if sorted(hashes) != [str(r) for r in range(HOSTS)] or len(set(hashes.values())) != 1:
        return None, f"the ranks' parameters differ after the join: {hashes}"
    mb, seconds = float(took.group(2)), float(took.group(3))
    # The rate from the bytes and seconds printed (its own GB/s is rounded to 2 places).
    return dict(mb=mb, seconds=seconds, gb_per_s=mb / 1e3 / seconds, join_seconds=float(took.group(5))), ""


def summarize(o, rows, results):
    header = ("rate", "size", "runs", "mb", "gb_per_s", "link_gb_per_s", "share_of_link", "target_met",
              "seconds", "join_seconds")
    table, text = [], []
    text.append(f"# state transfer to a replacement, {HOSTS} emulated hosts x 1 rank (the replacement's link at the "
                f"rate), {o.binary}; median over {o.rounds} round(s); target: >= {TARGET:.0%} of the link for 1 GB")
    text.append(f"{'rate':<8} {'size':>5} {'runs':>4} {'MB':>7} {'GB/s':>6} {'link':>6} {'share':>6} {'met':>4} "
                f"{'seconds':>8} {'join s':>7}")
    for rate in o.rates:
        link = o.rate_bits[rate] / 8 / 1e9
        for size in o.sizes:
            rs = [r for r in rows if r["rate"] == rate and r["size"] == size and r["ok"]]
            failed = sum(1 for r in rows if r["rate"] == rate and r["size"] == size and not r["ok"])
            if not rs:
                text.append(f"{rate:<8} {size:>5} FAILED ({failed} run(s); see the hosts' outputs)")
                continue
            rate_gb = statistics.median(r["gb_per_s"] for r in rs)
            share = rate_gb / link
            met = ("yes" if share >= TARGET else "no") if size == "1G" else "n/a"
            mb = statistics.median(r["mb"] for r in rs)
            secs = statistics.median(r["seconds"] for r in rs)
            join = statistics.median(r["join_seconds"] for r in rs)
            table.append((rate, size, len(rs), f"{mb:.1f}", f"{rate_gb:.3f}", f"{link:.3f}", f"{share:.3f}", met,
                          f"{secs:.3f}", f"{join:.2f}"))
            text.append(f"{rate:<8} {size:>5} {len(rs):>4} {mb:>7.1f} {rate_gb:>6.3f} {link:>6.3f} {share:>6.1%} "
                        f"{met:>4} {secs:>8.3f} {join:>7.2f}" + (f"  ({failed} failed)" if failed else ""))
    hosts_bench.write_csv(os.path.join(results, "summary.csv"), header, table)
    with open(os.path.join(results, "summary.txt"), "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


def main(argv):
    o = parse(argv)
    results = hosts_bench.results_dir("state_transfer_hosts")
    hosts_bench.begin("state_transfer_hosts", f"binary {o.binary}")
    rows, port = [], o.port

    def rounds(cluster):
        nonlocal port
        for rnd in range(1, o.rounds + 1):
            for rate in o.rates:
                for h in range(HOSTS):
                    cluster.shape(h, rate)
                for size in o.sizes:
                    stem = os.path.join(results, f"{rate}-{size}-round{rnd}")
                    started = time.monotonic()
                    got, why = run_once(o, cluster, size, port, stem)
                    port += 1
                    rows.append(dict(round=rnd, rate=rate, size=size, ok=got is not None, note=why,
                                     **(got or dict(mb=0, seconds=0, gb_per_s=0, join_seconds=0))))
                    said = (f"{got['mb']:.1f} MB in {got['seconds']:.3f} s, {got['gb_per_s']:.3f} GB/s, join "
                            f"{got['join_seconds']:.2f} s" if got else f"FAILED: {why}")
                    print(f"# round {rnd}, {rate}, {size}: {said} ({time.monotonic() - started:.0f} s; "
                          f"{stem}.*.out)", flush=True)

    status = hosts_bench.on_cluster("state_transfer_hosts.py", HOSTS, "xfer", rounds)
    if status is not None:
        return status
    hosts_bench.write_csv(os.path.join(results, "rows.csv"), list(rows[0]), [list(r.values()) for r in rows])
    summarize(o, rows, results)
    print(f"# results in {results}")
    return 0 if all(r["ok"] for r in rows) else 1

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
