#!/usr/bin/env python3
"""Every strategy on Fashion-MNIST at 25, 50 and 100 simulated workers: the backup-workers question in virtual time.

    simulate_strategies.py FASHION_MNIST RESULTS_DIR [--workers "25 50 100"] [--epochs 8] [--global-batch 800]
                           [--sample-ms 0.5] [--cluster "bandwidth=10Gbit latency=20us jitter=0.1 tail=0.03:1.5:10"]
                           [--only NAME,...] [--target 0.88] [--name simulate_strategies] [--reuse]

Runs examples/fashion_mnist with --transport simulated for each strategy and worker count:
the MLP trains for real (real gradients, real accuracy) while time is modelled: every
rank is a host of its own on the --cluster network, a worker's forward/backward takes
sample-ms x its batch of virtual time (compute=modelled, so runs are exactly reproducible),
stretched per step by the straggler model (a log-normal body and a Pareto tail). The
global batch is fixed (per-worker batch = global / workers) so that the synchronous
strategies follow the same trajectory at every worker count and differ only in time;
async and bounded staleness apply each worker's gradient on its own (their learning rate
is tuned separately, --async-lr), local SGD averages every --period steps. Parameter
servers: ceil(workers / 10) of them. Prints the table (virtual time to the target,
final accuracy, dropped gradients, staleness), writes simulate_strategies.csv, the curves
in simulate_strategies_curves.csv and simulate_strategies.png (accuracy against virtual
time, one panel per worker count), and every run's output under simulate_strategies/.
--reuse reports from the runs' saved outputs there instead of running anything (virtual
times do not depend on the machine; a run's wall time reads from the line it saved, if any);
a strategy with no saved output is left out, and said so.
"""
import argparse
import csv
import math
import os
import re
import subprocess
import sys
import time

CURVE = re.compile(r"curve epochs=([\d.]+) seconds=([\d.]+) accuracy=([\d.]+)")
PS = re.compile(r"ps rank \d+: mode \S+ version (\d+) updates (\d+) gradients (\d+) applied (\d+) dropped (\d+) "
                r"staleness mean ([\d.]+) p50 (\d+) p99 (\d+) max (\d+) update_lag mean ([\d.]+) p50 (\d+) p99 (\d+) "
                r"max (\d+) max_lead (\d+)")
VIRTUAL = re.compile(r"simulated ([\d.]+) s of virtual time")
WALL = re.compile(r"^wall seconds ([\d.]+)$", re.MULTILINE)
KOFN = re.compile(r"rank \d+: K of N: computed (\d+) of the job's (\d+) steps, (\d+) of them dropped")


def strategies(args):
    ps = ["--strategy", "parameter_server"]
    sync_lr = ["--lr", str(args.lr)]
    async_lr = ["--lr", str(args.async_lr)]
    out = [
        ("all_reduce", ["--strategy", "multi_worker_mirrored"] + sync_lr, False),
        ("ps sync", ps + ["--ps-mode", "sync"] + sync_lr, True),
    ]
    for b in (1, 2, 4, 8):
        out.append((f"ps backup b={b}", ps + ["--ps-mode", f"backup:{b}"] + sync_lr, True))
    # K of N: the all-reduce with backups (no server; the late replicas' gradients dropped).
    for b in (1, 2, 4, 8):
        out.append((f"all_reduce b={b}", ["--strategy", "multi_worker_mirrored", "--backup-workers", str(b)] + sync_lr,
                    False))
    out += [
        ("ps async", ps + ["--ps-mode", "async"] + async_lr, True),
        ("ps bounded s=4", ps + ["--ps-mode", "bounded:4"] + async_lr, True),
        (f"local_sgd H={args.period}", ["--strategy", "local_sgd", "--period", str(args.period), "--lr",
                                        str(args.local_lr)], False),
    ]
    return out


def saved_output(results, name, workers, args):
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return os.path.join(results, args.name, f"w{workers}_{slug}.txt")


def run(program, results, name, flags, servers, workers, args):
    batch = max(1, args.global_batch // workers)
    cmd = [program, "--transport", "simulated", *flags, "--replicas", str(workers), "--batch", str(batch),
           "--epochs", str(args.epochs), "--standardise", "--evals-per-epoch", str(args.evals_per_epoch),
           "--target-accuracy", str(args.target), "--step-compute", str(args.sample_ms * 1e-3 * batch),
           "--cluster", f"compute=modelled {args.cluster}"]
    if servers:
        cmd += ["--ps", str(servers)]
    saved = saved_output(results, name, workers, args)
    if args.reuse:
        with open(saved) as f:
            text = f.read()
        stdout = text.split("\n", 1)[1] if "\n" in text else ""
        took = WALL.search(text)
        wall = float(took[1]) if took else float("nan")
    else:
        start = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
        wall = time.monotonic() - start
        stdout = p.stdout
        with open(saved, "w") as f:
            f.write(" ".join(cmd) + "\n" + stdout + f"wall seconds {wall:.1f}\n")
        if p.returncode != 0:
            sys.stdout.write(stdout[-4000:])
            raise SystemExit(f"{name} on {workers} workers: fashion_mnist failed with status {p.returncode}")
    p = argparse.Namespace(stdout=stdout)
    curve = [(float(m[1]), float(m[2]), float(m[3])) for m in CURVE.finditer(p.stdout)]
    ps = [tuple(float(x) for x in m.groups()) for m in PS.finditer(p.stdout)]
    virtual = VIRTUAL.search(p.stdout)
    k_of_n = [tuple(int(x) for x in m.groups()) for m in KOFN.finditer(p.stdout)]
    return {"curve": curve, "ps": ps, "k_of_n": k_of_n, "wall": wall,
            "virtual": float(virtual[1]) if virtual else float("nan"), "batch": batch}


def summarise(name, workers, servers, r, target):
    curve = r["curve"]
    reached = next((t for _, t, acc in curve if acc >= target), None)
    ps = r["ps"]
    # Every server sees every gradient of its shard: the first server's counts are the job's.
    dropped = int(ps[0][4]) if ps else 0
    gradients = int(ps[0][2]) if ps else 0
    if r["k_of_n"]:  # K of N: each rank's gradients left out: those dropped and the steps it skipped
        dropped = sum(job - computed + d for computed, job, d in r["k_of_n"])
        gradients = sum(job for _, job, _ in r["k_of_n"])
    return {"workers": workers, "strategy": name, "servers": servers, "batch_per_worker": r["batch"],
            "time_to_target_s": reached, "final_accuracy": curve[-1][2] if curve else float("nan"),
            "best_accuracy": max((a for _, _, a in curve), default=float("nan")),
            "virtual_s": r["virtual"], "dropped": dropped, "gradients": gradients,
            "dropped_pct": 100.0 * dropped / gradients if gradients else 0.0,
            "staleness_mean": ps[0][5] if ps else 0.0, "staleness_p99": int(ps[0][7]) if ps else 0,
            "staleness_max": int(ps[0][8]) if ps else 0, "wall_s": r["wall"]}


def fmt(v, spec):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("program")
    p.add_argument("results")
    p.add_argument("--workers", default="25 50 100")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=800)
    p.add_argument("--sample-ms", type=float, default=0.5, help="virtual compute per sample, ms (default 0.5)")
    p.add_argument("--cluster", default="bandwidth=10Gbit latency=20us jitter=0.1 tail=0.03:1.5:10")
    p.add_argument("--lr", type=float, default=0.002, help="Adam, synchronous strategies (global batch)")
    p.add_argument("--async-lr", type=float, default=1e-4, help="Adam, async and bounded staleness (one worker's batch)")
    p.add_argument("--local-lr", type=float, default=2e-3, help="Adam, local SGD (one worker's batch)")
    p.add_argument("--period", type=int, default=4)
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--target", type=float, default=0.88)
    p.add_argument("--only", default="", help="comma-separated strategy names")
    p.add_argument("--reuse", action="store_true", help="report a run's saved output instead of running it again")
    p.add_argument("--name", default="simulate_strategies",
                   help="results are NAME.csv, NAME_curves.csv, NAME.png and NAME/ (default simulate_strategies)")
    args = p.parse_args()
    os.makedirs(os.path.join(args.results, args.name), exist_ok=True)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    print(f"simulated cluster: compute=modelled {args.cluster}; global batch {args.global_batch}, "
          f"{args.sample_ms} ms of compute per sample, {args.epochs} epochs, target {100 * args.target:g}%")
    rows, curves = [], []
    header = (f"{'workers':>7} {'strategy':<18} {'batch':>5} {'to ' + format(100 * args.target, 'g') + '% (s)':>11} "
              f"{'final acc':>9} {'best acc':>8} {'virtual s':>9} {'dropped':>13} {'stale mean':>10} "
              f"{'p99':>4} {'wall s':>7}")
    print(header)
    for workers in (int(w) for w in args.workers.split()):
        servers = math.ceil(workers / 10)
        for name, flags, is_ps in strategies(args):
            if only and name not in only:
                continue
            if args.reuse and not os.path.exists(saved_output(args.results, name, workers, args)):
                print(f"{workers:>7} {name:<18} (no saved output: left out)", flush=True)
                continue
            r = run(args.program, args.results, name, flags, servers if is_ps else 0, workers, args)
            row = summarise(name, workers, servers if is_ps else 0, r, args.target)
            rows.append(row)
            curves += [{"workers": workers, "strategy": name, "epochs": e, "virtual_s": t, "accuracy": a}
                       for e, t, a in r["curve"]]
            print(f"{workers:>7} {name:<18} {row['batch_per_worker']:>5} {fmt(row['time_to_target_s'], '.3f'):>11} "
                  f"{100 * row['final_accuracy']:>8.2f}% {100 * row['best_accuracy']:>7.2f}% "
                  f"{row['virtual_s']:>9.3f} {row['dropped']:>6} ({row['dropped_pct']:4.1f}%) "
                  f"{row['staleness_mean']:>10.2f} {row['staleness_p99']:>4} {row['wall_s']:>7.1f}", flush=True)
    with open(os.path.join(args.results, f"{args.name}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(args.results, f"{args.name}_curves.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["workers", "strategy", "epochs", "virtual_s", "accuracy"])
        w.writeheader()
        w.writerows(curves)
    plot(args, rows, curves)


def plot(args, rows, curves):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no PNG (Debian: python3-matplotlib)")
        return
    worker_counts = sorted({r["workers"] for r in rows})
    fig, axes = plt.subplots(1, len(worker_counts), figsize=(6 * len(worker_counts), 4.5), squeeze=False)
    for ax, workers in zip(axes[0], worker_counts):
        for name in dict.fromkeys(r["strategy"] for r in rows if r["workers"] == workers):
            pts = [(c["virtual_s"], c["accuracy"]) for c in curves if c["workers"] == workers and c["strategy"] == name]
            style = "--" if "async" in name or "bounded" in name or "local" in name else "-"
            style = ":" if name.startswith("all_reduce b=") else style
            ax.plot([t for t, _ in pts], [100 * a for _, a in pts], style, marker=".", label=name)
        ax.axhline(100 * args.target, color="grey", linewidth=0.8)
        ax.set_title(f"{workers} simulated workers")
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_ylim(75, 90)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Fashion-MNIST MLP, global batch {args.global_batch}; {args.cluster}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(args.results, f"{args.name}.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
