#!/usr/bin/env python3
"""Every training strategy on Fashion-MNIST across processes, with and without a straggler.

    strategies.py LAUNCHER FASHION_MNIST RESULTS_DIR [--workers 4] [--epochs 8] [--straggler 1:3] [--only NAME,...]

Runs examples/fashion_mnist under scripts/gradwire-run for each strategy (4 workers; the
parameter-server runs add 1 or 2 server processes), once as is and once with one worker
slowed down FACTOR times. Prints a table (wall time to the target accuracy, final accuracy,
samples/s, dropped gradients, staleness mean/p50/p99/max), writes strategies.csv, the per
epoch curves in strategies_curves.csv, and strategies.png (accuracy against wall time).
"""
import argparse
import csv
import os
import re
import subprocess
import sys
import time

STRATEGIES = [
    # name, fashion_mnist flags, servers
    ("all_reduce", ["--strategy", "multi_worker_mirrored"], 0),
    ("all_reduce backup_workers=1", ["--strategy", "multi_worker_mirrored", "--backup-workers", "1"], 0),
    ("central_storage", ["--strategy", "central_storage", "--transport", "tcp"], 0),
    ("local_sgd H=8", ["--strategy", "local_sgd", "--transport", "tcp", "--period", "8"], 0),
    ("ps sync", ["--strategy", "parameter_server", "--transport", "tcp", "--ps-mode", "sync"], 1),
    ("ps sync 2 servers", ["--strategy", "parameter_server", "--transport", "tcp", "--ps-mode", "sync"], 2),
    ("ps backup_workers<1>", ["--strategy", "parameter_server", "--transport", "tcp", "--ps-mode", "backup:1"], 1),
    ("ps async", ["--strategy", "parameter_server", "--transport", "tcp", "--ps-mode", "async"], 1),
    ("ps bounded_staleness<2>", ["--strategy", "parameter_server", "--transport", "tcp", "--ps-mode", "bounded:2"], 1),
]

EPOCH = re.compile(r"epoch\s+(\d+)/\d+\s+.*test_acc\s+([\d.]+)%\s+samples/s\s+(\d+)\s+elapsed\s+([\d.]+) s")
KOFN = re.compile(r"rank \d+: K of N: computed (\d+) of the job's (\d+) steps, (\d+) of them dropped")
PS = re.compile(r"ps rank \d+: mode \S+ version (\d+) updates (\d+) gradients (\d+) applied (\d+) dropped (\d+) "
                r"staleness mean ([\d.]+) p50 (\d+) p99 (\d+) max (\d+) update_lag mean ([\d.]+) p50 (\d+) p99 (\d+) "
                r"max (\d+) max_lead (\d+)")


def run(launcher, program, name, flags, servers, workers, epochs, straggler, extra):
    cmd = [launcher, "-n", str(workers), "--no-prefix"] + (["--ps", str(servers)] if servers else [])
    cmd += ["--", program, *flags, "--epochs", str(epochs), *extra]
    if straggler:
        cmd += ["--straggler", straggler]
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    wall = time.monotonic() - start
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        raise SystemExit(f"{name}: fashion_mnist failed with status {p.returncode}")
    curve = [(int(m[1]), float(m[2]), float(m[3]), float(m[4])) for m in EPOCH.finditer(p.stdout)]
    ps = [tuple(float(x) for x in m.groups()) for m in PS.finditer(p.stdout)]
    k_of_n = [(int(m[1]), int(m[2]), int(m[3])) for m in KOFN.finditer(p.stdout)]  # computed, job's steps, dropped
    return {"curve": curve, "ps": ps, "k_of_n": k_of_n, "wall": wall, "output": p.stdout}


def summarise(name, straggler, r, target):
    curve = r["curve"]
    reached = next((t for _, acc, _, t in curve if acc >= 100 * target), None)
    final = curve[-1][1] if curve else float("nan")
    train_s = curve[-1][3] if curve else float("nan")
    samples = sum(c[2] for c in curve) / len(curve) if curve else float("nan")
    row = {"strategy": name, "straggler": straggler or "none", "time_to_target_s": reached,
           "final_accuracy": final, "train_seconds": train_s, "samples_per_s": samples,
           "gradients": "", "dropped": "", "staleness_mean": "", "staleness_p50": "", "staleness_p99": "",
           "staleness_max": "", "update_lag_mean": "", "update_lag_p99": "", "update_lag_max": "", "max_lead": ""}
    if r["k_of_n"]:  # every replica says what it computed and what of it was dropped
        row.update({"gradients": sum(c for c, _, _ in r["k_of_n"]), "dropped": sum(d for _, _, d in r["k_of_n"])})
    if r["ps"]:
        s = r["ps"][0]  # every server sees every gradient; server 0 speaks for them
        row.update({"gradients": int(s[2]), "dropped": int(s[4]), "staleness_mean": s[5],
                    "staleness_p50": int(s[6]), "staleness_p99": int(s[7]), "staleness_max": int(s[8]),
                    "update_lag_mean": s[9], "update_lag_p99": int(s[11]), "update_lag_max": int(s[12]),
                    "max_lead": int(s[13])})
    return row


def fmt(v, spec):
    if v is None:
        return "never"
    if v == "":
        return "-"
    return format(v, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("launcher")
    ap.add_argument("program")
    ap.add_argument("results")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--lr", default="0.002")
    ap.add_argument("--target", type=float, default=0.88)
    ap.add_argument("--straggler", default="1:3")
    ap.add_argument("--only", default="", help="comma-separated strategy names")
    o = ap.parse_args()
    os.makedirs(o.results, exist_ok=True)
    chosen = [s for s in STRATEGIES if not o.only or s[0] in o.only.split(",")]
    extra = ["--lr", o.lr, "--target-accuracy", str(o.target)]
    rows, curves = [], []
    for straggler in ("", o.straggler):
        for name, flags, servers in chosen:
            label = f"{name} | straggler {straggler or 'none'}"
            print(f"# running {label}", flush=True)
            r = run(o.launcher, o.program, name, flags, servers, o.workers, o.epochs, straggler, extra)
            rows.append(summarise(name, straggler, r, o.target))
            for epoch, acc, sps, t in r["curve"]:
                curves.append({"strategy": name, "straggler": straggler or "none", "epoch": epoch,
                               "accuracy": acc, "elapsed_s": t})

    print(f"\nFashion-MNIST, {o.workers} workers over loopback TCP (gradwire-run), Adam lr {o.lr} cosine, "
          f"{o.epochs} epochs, batch 64 per worker; straggler {o.straggler} = worker RANK runs FACTOR x slower")
    head = (f"{'strategy':<26}{'straggler':>10}{'to ' + str(int(100 * o.target)) + '% (s)':>12}{'final %':>9}"
            f"{'train s':>9}{'samples/s':>11}{'grads':>8}{'dropped':>9}{'stale mean':>11}{'p50':>5}{'p99':>5}"
            f"{'max':>5}{'lag mean':>9}{'lag max':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['strategy']:<26}{r['straggler']:>10}{fmt(r['time_to_target_s'], '.1f'):>12}"
              f"{fmt(r['final_accuracy'], '.2f'):>9}{fmt(r['train_seconds'], '.1f'):>9}"
              f"{fmt(r['samples_per_s'], '.0f'):>11}{fmt(r['gradients'], 'd'):>8}{fmt(r['dropped'], 'd'):>9}"
              f"{fmt(r['staleness_mean'], '.2f'):>11}{fmt(r['staleness_p50'], 'd'):>5}"
              f"{fmt(r['staleness_p99'], 'd'):>5}{fmt(r['staleness_max'], 'd'):>5}"
              f"{fmt(r['update_lag_mean'], '.2f'):>9}{fmt(r['update_lag_max'], 'd'):>8}")

    with open(os.path.join(o.results, "strategies.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(o.results, "strategies_curves.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(curves[0].keys()))
        w.writeheader()
        w.writerows(curves)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no plot (Debian: python3-matplotlib)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, straggler in zip(axes, ("none", o.straggler)):
        for name, _, _ in chosen:
            pts = [(c["elapsed_s"], c["accuracy"]) for c in curves if c["strategy"] == name and c["straggler"] == straggler]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.axhline(100 * o.target, color="grey", linestyle=":")
        ax.set_title(f"straggler {straggler}")
        ax.set_xlabel("wall time (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(o.results, "strategies.png"), dpi=110)
    print(f"# wrote {o.results}/strategies.csv, strategies_curves.csv, strategies.png")


if __name__ == "__main__":
    main()
