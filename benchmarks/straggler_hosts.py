#!/usr/bin/env python3
"""Fashion-MNIST to 88% with one slow replica on emulated hosts: all-reduce, K of N, elastic, PS sync, PS backups.

    benchmarks/straggler_hosts.py [--rate 1gbit] [--epochs 10] [--rounds 2] [--straggler 1:3]
                                  [--configs LIST] [--binary PATH] [--run-timeout 600]

examples/fashion_mnist (the MLP, Adam, batch 64 per replica, cosine schedule, 4 evaluations
per epoch but elastic's 1) with 4 replicas, one per emulated host (scripts/cluster: network namespaces, root
only, every link shaped at --rate), replica --straggler's RANK taking FACTOR times as long
for each forward/backward. The parameter-server cases add a fifth host for the server
(GRADWIRE_NUM_PS=1), so that each case has 4 replicas computing. Cases (--configs, comma
separated; default all, in this order):
    all_reduce_even   multi_worker_mirrored, nobody slow (the yardstick)
    all_reduce        multi_worker_mirrored
    k_of_n            multi_worker_mirrored --backup-workers 1
    elastic           multi_worker_mirrored --min-replicas 2 (nobody lost: its price)
    ps_sync           parameter_server --ps-mode sync
    ps_backup         parameter_server --ps-mode backup:1
Rounds are interleaved (every case once per round). Prints per case the median over rounds of
the seconds to 88% test accuracy (the example's own count: training time, evaluations
excluded), the epoch it happened at, the final accuracy and the training seconds, with the
ratio of each time to all_reduce's (the same straggler); writes results/straggler_hosts/
summary.{txt,csv}, rows.csv (one row per run), curves.csv (accuracy against seconds, rank
0's evaluations) and curves.png (with matplotlib), every host's output beside them. Exits 1
if a run failed. Never fails on time.

The binary: --binary, else build-fm/examples/fashion_mnist (benchmarks/fashion_mnist.sh's
Release build), else build/examples/fashion_mnist (the test build: -O1, read ratios).

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

REPLICAS = 4
DATA = "/usr/share/datasets/fashion-mnist"
CASES = {  # name: (strategy flags, servers, with the straggler, evaluations per epoch)
    "all_reduce_even": (["--strategy", "multi_worker_mirrored"], 0, False, 4),
    "all_reduce": (["--strategy", "multi_worker_mirrored"], 0, True, 4),
    "k_of_n": (["--strategy", "multi_worker_mirrored", "--backup-workers", "1"], 0, True, 4),
    # The elastic example evaluates once per epoch (it takes no --evals-per-epoch yet).
    "elastic": (["--strategy", "multi_worker_mirrored", "--min-replicas", "2"], 0, True, 1),
    "ps_sync": (["--strategy", "parameter_server", "--ps-mode", "sync"], 1, True, 4),
    "ps_backup": (["--strategy", "parameter_server", "--ps-mode", "backup:1"], 1, True, 4),
}
REACHED = re.compile(r"reached 88% test accuracy at epoch ([\d.]+), ([\d.]+) s")
FINAL = re.compile(r"final test accuracy ([\d.]+)% after (\d+) epochs, ([\d.]+) s of training")
CURVE = re.compile(r"^\[0\] curve epochs=([\d.]+) seconds=([\d.]+) accuracy=([\d.]+)", re.MULTILINE)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="1gbit", help="every host's link, tc units (default 1gbit)")
    p.add_argument("--epochs", type=int, default=10, help="epochs per run (default 10)")
    p.add_argument("--rounds", type=int, default=2, help="rounds; medians over them (default 2)")
    p.add_argument("--straggler", default="1:3", help="RANK:FACTOR of the slow replica (default 1:3)")
    p.add_argument("--configs", default=",".join(CASES), help="cases, comma separated (default all)")
    p.add_argument("--binary", help="examples/fashion_mnist (default: build-fm's, else build's)")
    p.add_argument("--run-timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--port", type=int, default=29900, help="first master port, +1 per run (default 29900)")
    o = p.parse_args(argv)
    o.configs = [c for c in o.configs.replace(" ", ",").split(",") if c]
    unknown = [c for c in o.configs if c not in CASES]
    if unknown or not o.configs:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(CASES)}")
    try:
        gwcluster.parse_rate(o.rate)
    except gwcluster.ClusterError as e:
        p.error(f"--rate: {e}")
    if o.epochs < 1 or o.rounds < 1 or o.run_timeout <= 0:
        p.error("--epochs and --rounds >= 1, --run-timeout > 0")
    if not re.match(r"^[0-3]:\d+(\.\d+)?$", o.straggler):
        p.error(f"--straggler takes RANK:FACTOR with RANK 0..3, got {o.straggler!r}")
    o.binary = hosts_bench.find_binary(p, o.binary, "build-fm/examples/fashion_mnist",
                                       "run benchmarks/fashion_mnist.sh once (it builds it)")
    if not os.path.isdir(DATA):
        p.error(f"no Fashion-MNIST at {DATA} (scripts/deps.sh installs dataset-fashion-mnist)")
    hosts_bench.require_emulated_hosts(p)
    return o


def run_once(o, cluster, case, port, stem):
    """One training job: (row dict, curve [(seconds, accuracy)]) or (None, why)."""
    flags, servers, slow, evals = CASES[case]
    argv = [o.binary, *flags, "--transport", "tcp", "--epochs", str(o.epochs), "--evals-per-epoch", str(evals),
            "--data", DATA, *(["--straggler", o.straggler] if slow else [])]
    env = base_env()
    env["GRADWIRE_TIMEOUT"] = "120"
    if servers:
        env["GRADWIRE_NUM_PS"] = str(servers)
    out, codes = hosts_bench.run_job(argv, cluster, env, port, stem, o.run_timeout, REPLICAS + servers)
    if codes is None:
        return None, f"still running after {o.run_timeout + 15:g} s, killed"
    final = FINAL.search(out)
    if any(codes) or final is None:
        return None, f"launcher exit codes {codes}" + ("" if final else ", no final accuracy")
    reached = REACHED.search(out)
    row = dict(final_accuracy=float(final.group(1)), train_seconds=float(final.group(3)),
               reached_epoch=float(reached.group(1)) if reached else None,
               reached_seconds=float(reached.group(2)) if reached else None)
    curve = [(float(s), float(a)) for _, s, a in CURVE.findall(out)]
    return row, curve


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(o, rows, results):
    text = [f"# Fashion-MNIST, {REPLICAS} replicas on {REPLICAS} emulated hosts (+1 for a server), links {o.rate}, "
            f"straggler {o.straggler} (but all_reduce_even), {o.epochs} epochs, median over {o.rounds} round(s); "
            f"{o.binary}",
            f"{'case':<16} {'runs':>4} {'to 88% (s)':>10} {'/all_reduce':>11} {'at epoch':>8} {'final %':>8} "
            f"{'train s':>8}"]
    header = ("case", "runs", "reached_seconds", "vs_all_reduce", "reached_epoch", "final_accuracy", "train_seconds",
              "reached_in")
    table = []
    ok = {c: [r for r in rows if r["case"] == c and r["ok"]] for c in o.configs}
    base = median_or_none(r["reached_seconds"] for r in ok.get("all_reduce", []))
    for case in o.configs:
        rs = ok[case]
        if not rs:
            text.append(f"{case:<16} FAILED (see the hosts' outputs)")
            continue
        secs = median_or_none(r["reached_seconds"] for r in rs)
        ep = median_or_none(r["reached_epoch"] for r in rs)
        acc = statistics.median(r["final_accuracy"] for r in rs)
        train = statistics.median(r["train_seconds"] for r in rs)
        reached_in = sum(1 for r in rs if r["reached_seconds"] is not None)
        ratio = secs / base if secs is not None and base else None
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        table.append((case, len(rs), fmt(secs, ".2f"), fmt(ratio, ".3f"), fmt(ep, ".2f"), f"{acc:.2f}",
                      f"{train:.2f}", f"{reached_in}/{len(rs)}"))
        text.append(f"{case:<16} {len(rs):>4} {fmt(secs, '.2f'):>10} {fmt(ratio, '.3f'):>11} {fmt(ep, '.2f'):>8} "
                    f"{acc:>8.2f} {train:>8.2f}" + ("" if reached_in == len(rs) else f"  (88% in {reached_in} of "
                                                                                        f"{len(rs)} runs)"))
    hosts_bench.write_csv(os.path.join(results, "summary.csv"), header, table)
    with open(os.path.join(results, "summary.txt"), "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


def plot(curves, results, straggler):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no matplotlib: curves.png not drawn (curves.csv has the numbers)")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for case, points in curves.items():
        if points:
            ax.plot([s for s, _ in points], [100 * a for _, a in points], marker=".", label=case)
    ax.axhline(88, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training seconds (rank 0)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(80, 90)
    rank, factor = straggler.split(":")
    ax.set_title(f"Fashion-MNIST, 4 replicas on emulated hosts, replica {rank} {factor}x slow (round 1)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(results, "curves.png"), dpi=120)


def main(argv):
    o = parse(argv)
    results = hosts_bench.results_dir("straggler_hosts")
    hosts_bench.begin("straggler_hosts", f"binary {o.binary}")
    rows, curves, port = [], {}, o.port

    def rounds(cluster):
        nonlocal port
        for h in range(REPLICAS + 1):
            cluster.shape(h, o.rate)
        for rnd in range(1, o.rounds + 1):
            for case in o.configs:
                stem = os.path.join(results, f"{case}-round{rnd}")
                started = time.monotonic()
                row, curve = run_once(o, cluster, case, port, stem)
                port += 1
                ok = row is not None
                rows.append(dict(round=rnd, case=case, ok=ok, note="" if ok else curve,
                                 **(row or dict(final_accuracy=0, train_seconds=0, reached_epoch=None,
                                                reached_seconds=None))))
                if ok and rnd == 1:
                    curves[case] = curve
                said = (f"88% at {row['reached_seconds']} s (epoch {row['reached_epoch']}), final "
                        f"{row['final_accuracy']}%, {row['train_seconds']} s" if ok else f"FAILED: {curve}")
                print(f"# round {rnd}, {case}: {said} ({time.monotonic() - started:.0f} s; {stem}.*.out)", flush=True)

    status = hosts_bench.on_cluster("straggler_hosts.py", REPLICAS + 1, "strag", rounds)
    if status is not None:
        return status
    hosts_bench.write_csv(os.path.join(results, "rows.csv"), list(rows[0]), [list(r.values()) for r in rows])
    hosts_bench.write_csv(os.path.join(results, "curves.csv"), ("case", "seconds", "accuracy"),
                          [(case, sec, acc) for case, points in curves.items() for sec, acc in points])
    summarize(o, rows, results)
    plot(curves, results, o.straggler)
    print(f"# results in {results}")
    return 0 if all(r["ok"] for r in rows) else 1

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
