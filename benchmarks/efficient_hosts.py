#!/usr/bin/env python3
"""Communication-efficient training on slow links: Fashion-MNIST on 4 emulated hosts, all-reduce beside codecs, local SGD, DiLoCo and ZeRO-1.

    benchmarks/efficient_hosts.py [--rates "100mbit 1gbit"] [--epochs 6] [--rounds 1] [--configs LIST]
                                  [--binary PATH] [--run-timeout 900]

examples/fashion_mnist (the MLP 784-256-128-10, 235,146 parameters, Adam, batch 64 per
replica, cosine schedule, 4 evaluations per epoch) with 4 replicas, one per emulated host
(scripts/cluster: network namespaces, root only, every host's link shaped at the rate), over
TCP. Cases (--configs, comma separated; default all, in this order):
    all_reduce      multi_worker_mirrored (the yardstick)
    fp16, bf16, int8, topk, powersgd
                    multi_worker_mirrored --compress fp16 | bf16 | int8 | topk:0.01 | powersgd:4
    local_sgd       local_sgd --period 10
    diloco10, diloco50, diloco100
                    diloco --period H (outer Nesterov, lr 0.7, momentum 0.9)
    diloco_stream   diloco --period 50 --fragments 4
    sharded         sharded (ZeRO-1)
and, only when named: powersgd16, powersgd64 (--compress powersgd:16 | 64), diloco50_int8
(diloco --period 50 --compress int8: the pseudo-gradients in int8).
Rounds are interleaved (every case once per round, per rate). Per rate and case, medians over
rounds of: bytes sent per step by rank 0 (the strategy's own count: payload, not headers),
the seconds to 88% test accuracy (the example's count: training time, evaluations excluded),
the bytes sent until then, the final accuracy and the training seconds, with ratios to
all_reduce's at that rate. Writes results/efficient/summary.{txt,csv}, rows.csv (one row per
run), curves.csv (rank 0's evaluations: accuracy against seconds and bytes) and
accuracy_vs_time.png, accuracy_vs_bytes.png (matplotlib), every host's output beside them.
Exits 1 if a run failed. Never fails on time.

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
BATCH = 64
STEPS_PER_EPOCH = 60000 // (BATCH * REPLICAS)
MWM = ["--strategy", "multi_worker_mirrored"]
CASES = {  # name: the example's strategy flags
    "all_reduce": MWM,
    "fp16": MWM + ["--compress", "fp16"],
    "bf16": MWM + ["--compress", "bf16"],
    "int8": MWM + ["--compress", "int8"],
    "topk": MWM + ["--compress", "topk:0.01"],
    "powersgd": MWM + ["--compress", "powersgd:4"],
    "local_sgd": ["--strategy", "local_sgd", "--period", "10"],
    "diloco10": ["--strategy", "diloco", "--period", "10"],
    "diloco50": ["--strategy", "diloco", "--period", "50"],
    "diloco100": ["--strategy", "diloco", "--period", "100"],
    "diloco_stream": ["--strategy", "diloco", "--period", "50", "--fragments", "4"],
    "sharded": ["--strategy", "sharded"],
    # Not run by default (--configs): PowerSGD at higher ranks, DiLoCo's pseudo-gradients in int8.
    "powersgd16": MWM + ["--compress", "powersgd:16"],
    "powersgd64": MWM + ["--compress", "powersgd:64"],
    "diloco50_int8": ["--strategy", "diloco", "--period", "50", "--compress", "int8"],
}
DEFAULT = [c for c in CASES if c not in ("powersgd16", "powersgd64", "diloco50_int8")]
REACHED = re.compile(r"reached 88% test accuracy at epoch ([\d.]+), ([\d.]+) s")
FINAL = re.compile(r"final test accuracy ([\d.]+)% after (\d+) epochs, ([\d.]+) s of training")
CURVE = re.compile(r"^\[0\] curve epochs=([\d.]+) seconds=([\d.]+) accuracy=([\d.]+)", re.MULTILINE)
# rank 0's step stats, once per epoch: "rank 0: 234 steps: sent 1.41 MB/step, received ..."
SENT = re.compile(r"rank 0: (\d+) steps: sent ([\d.e+-]+) MB/step")
STATE = re.compile(r"rank 0: optimizer state ([\d]+) bytes")
PEAK = re.compile(r"at most ([\d.e+-]+) MB sent in a step")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="100mbit 1gbit", help="inter-host link rates, tc units (default 100mbit 1gbit)")
    p.add_argument("--epochs", type=int, default=6, help="epochs per run (default 6)")
    p.add_argument("--rounds", type=int, default=1, help="rounds; medians over them (default 1)")
    p.add_argument("--configs", default=",".join(DEFAULT), help="cases, comma separated (default all but the last three)")
    p.add_argument("--binary", help="examples/fashion_mnist (default: build-fm's, else build's)")
    p.add_argument("--run-timeout", type=float, default=900, help="seconds per run (default 900)")
    p.add_argument("--port", type=int, default=30900, help="first master port, +1 per run (default 30900)")
    p.add_argument("--reuse", action="store_true",
                   help="run nothing: summarise and plot the rows.csv and curves.csv already in the results folder")
    o = p.parse_args(argv)
    o.configs = [c for c in o.configs.replace(" ", ",").split(",") if c]
    o.rates = o.rates.replace(",", " ").split()
    unknown = [c for c in o.configs if c not in CASES]
    if unknown or not o.configs:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(CASES)}")
    for rate in o.rates:
        try:
            gwcluster.parse_rate(rate)
        except gwcluster.ClusterError as e:
            p.error(f"--rates: {e}")
    if o.epochs < 1 or o.rounds < 1 or o.run_timeout <= 0 or not o.rates:
        p.error("--epochs and --rounds >= 1, --run-timeout > 0, at least one rate")
    if o.reuse:
        o.binary = o.binary or "(saved runs)"
        return o
    o.binary = hosts_bench.find_binary(p, o.binary, "build-fm/examples/fashion_mnist",
                                       "run benchmarks/fashion_mnist.sh once (it builds it)")
    if not os.path.isdir(DATA):
        p.error(f"no Fashion-MNIST at {DATA} (scripts/deps.sh installs dataset-fashion-mnist)")
    hosts_bench.require_emulated_hosts(p)
    return o


def run_once(o, cluster, case, port, stem):
    """One training job: (row dict, curve [(seconds, accuracy, bytes)]) or (None, why)."""
    argv = [o.binary, *CASES[case], "--transport", "tcp", "--epochs", str(o.epochs), "--evals-per-epoch", "4",
            "--data", DATA]
    env = base_env()
    env["GRADWIRE_TIMEOUT"] = "300"
    out, codes = hosts_bench.run_job(argv, cluster, env, port, stem, o.run_timeout, REPLICAS)
    if codes is None:
        return None, f"still running after {o.run_timeout + 15:g} s, killed"
    final = FINAL.search(out)
    if any(codes) or final is None:
        return None, f"launcher exit codes {codes}" + ("" if final else ", no final accuracy")
    sent = [(int(n), float(mb) * 1e6) for n, mb in SENT.findall(out)]
    steps = sum(n for n, _ in sent)
    per_step = sum(n * b for n, b in sent) / steps if steps else None
    reached = REACHED.search(out)
    state = STATE.search(out)
    peaks = [float(v) * 1e6 for v in PEAK.findall(out)]
    row = dict(final_accuracy=float(final.group(1)), train_seconds=float(final.group(3)),
               reached_epoch=float(reached.group(1)) if reached else None,
               reached_seconds=float(reached.group(2)) if reached else None,
               bytes_per_step=per_step,
               bytes_to_88=(per_step * float(reached.group(1)) * STEPS_PER_EPOCH
                            if reached and per_step is not None else None),
               optimizer_state_bytes=int(state.group(1)) if state else None,
               peak_bytes_per_step=max(peaks) if peaks else None)
    curve = [(float(s), float(a), float(e) * STEPS_PER_EPOCH * (per_step or 0)) for e, s, a in CURVE.findall(out)]
    return row, curve


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(o, rows, results):
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    text = [f"# Fashion-MNIST, {REPLICAS} replicas on {REPLICAS} emulated hosts over TCP, {o.epochs} epochs, "
            f"median over {o.rounds} round(s); {o.binary}"]
    header = ("rate", "case", "runs", "bytes_per_step", "bytes_vs_all_reduce", "peak_bytes_per_step", "reached_seconds",
              "speedup_vs_all_reduce", "bytes_to_88", "bytes_to_88_vs_all_reduce", "reached_epoch",
              "final_accuracy", "train_seconds", "optimizer_state_bytes", "reached_in")
    table = []
    for rate in o.rates:
        text += ["", f"## links {rate}",
                 f"{'case':<14} {'runs':>4} {'MB/step':>9} {'x bytes':>8} {'peak MB':>8} {'to 88% s':>9} {'speedup':>8} "
                 f"{'MB to 88%':>10} {'x fewer':>8} {'epoch':>6} {'final %':>8} {'train s':>8} {'state MB':>9}"]
        ok = {c: [r for r in rows if r["rate"] == rate and r["case"] == c and r["ok"]] for c in o.configs}
        base = ok.get("all_reduce", [])
        base_secs = median_or_none(r["reached_seconds"] for r in base)
        base_bytes = median_or_none(r["bytes_per_step"] for r in base)
        base_to = median_or_none(r["bytes_to_88"] for r in base)
        for case in o.configs:
            rs = ok[case]
            if not rs:
                text.append(f"{case:<14} FAILED (see the hosts' outputs)")
                continue
            per_step = median_or_none(r["bytes_per_step"] for r in rs)
            peak = median_or_none(r.get("peak_bytes_per_step") for r in rs)
            secs = median_or_none(r["reached_seconds"] for r in rs)
            to = median_or_none(r["bytes_to_88"] for r in rs)
            ep = median_or_none(r["reached_epoch"] for r in rs)
            state = median_or_none(r["optimizer_state_bytes"] for r in rs)
            acc = statistics.median(r["final_accuracy"] for r in rs)
            train = statistics.median(r["train_seconds"] for r in rs)
            reached_in = sum(1 for r in rs if r["reached_seconds"] is not None)
            x_bytes = per_step / base_bytes if per_step is not None and base_bytes else None
            speedup = base_secs / secs if secs and base_secs else None
            fewer = base_to / to if to and base_to else None
            table.append((rate, case, len(rs), fmt(per_step, ".0f"), fmt(x_bytes, ".4f"), fmt(peak, ".0f"), fmt(secs, ".2f"),
                          fmt(speedup, ".2f"), fmt(to, ".0f"), fmt(fewer, ".1f"), fmt(ep, ".2f"), f"{acc:.2f}",
                          f"{train:.2f}", fmt(state, ".0f"), f"{reached_in}/{len(rs)}"))
            mb = lambda v: None if v is None else v / 1e6  # noqa: E731
            text.append(f"{case:<14} {len(rs):>4} {fmt(mb(per_step), '.4f'):>9} {fmt(x_bytes, '.3f'):>8} "
                        f"{fmt(mb(peak), '.3f'):>8} "
                        f"{fmt(secs, '.1f'):>9} {fmt(speedup, '.2f'):>8} {fmt(mb(to), '.1f'):>10} "
                        f"{fmt(fewer, '.1f'):>8} {fmt(ep, '.2f'):>6} {acc:>8.2f} {train:>8.1f} "
                        f"{fmt(mb(state), '.3f'):>9}"
                        + ("" if reached_in == len(rs) else f"  (88% in {reached_in} of {len(rs)} runs)"))
    text += ["", "# MB/step: sent by rank 0 per step (payload); x bytes: / all_reduce's; peak MB: the most rank 0 sent "
             "in one step; speedup: all_reduce's "
             "seconds to 88% / the case's; MB to 88%: sent by rank 0 until 88%; x fewer: all_reduce's / the case's; "
             "state MB: rank 0's optimizer state"]
    hosts_bench.write_csv(os.path.join(results, "summary.csv"), header, table)
    with open(os.path.join(results, "summary.txt"), "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


def plot(curves, results, rates):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no matplotlib: the PNGs are not drawn (curves.csv has the numbers)")
        return
    for what, index, label, scale, log in (("time", 0, "training seconds (rank 0)", 1, False),
                                           ("bytes", 2, "MB sent by rank 0", 1e-6, True)):
        fig, axes = plt.subplots(1, len(rates), figsize=(7 * len(rates), 5), squeeze=False)
        colours = plt.get_cmap("tab20").colors  # a colour per case: the default cycle repeats after 10
        for ax, rate in zip(axes[0], rates):
            for n, (case, points) in enumerate(curves.get(rate, {}).items()):
                pts = [p for p in points if p[index] > 0 or not log]
                if pts:
                    ax.plot([p[index] * scale for p in pts], [100 * p[1] for p in pts], marker=".", label=case,
                            color=colours[(2 * n) % 20 + (2 * n // 20) % 2])
            ax.axhline(88, color="grey", linestyle=":", linewidth=1)
            if log:
                ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("test accuracy (%)")
            ax.set_ylim(80, 90)
            ax.set_title(f"Fashion-MNIST, 4 emulated hosts, links {rate}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(results, f"accuracy_vs_{what}.png"), dpi=110)


def load_saved(o, results):
    """--reuse: the rows and curves of earlier runs, as main() would have made them."""
    import csv
    number = lambda v: None if v in ("", "None") else float(v)  # noqa: E731
    with open(os.path.join(results, "rows.csv")) as f:
        rows = [dict(r, round=int(r["round"]), ok=r["ok"] == "True",
                     **{k: number(r[k]) for k in r if k not in ("rate", "round", "case", "ok", "note")})
                for r in csv.DictReader(f)]
    curves = {}
    with open(os.path.join(results, "curves.csv")) as f:
        for r in csv.DictReader(f):
            curves.setdefault(r["rate"], {}).setdefault(r["case"], []).append(
                (float(r["seconds"]), float(r["accuracy"]), float(r["bytes"])))
    o.rates = [r for r in o.rates if any(row["rate"] == r for row in rows)]
    o.configs = [c for c in o.configs if any(row["case"] == c for row in rows)]
    return rows, curves


def main(argv):
    o = parse(argv)
    results = hosts_bench.results_dir("efficient")
    if o.reuse:
        rows, curves = load_saved(o, results)
        summarize(o, rows, results)
        plot(curves, results, o.rates)
        return 0
    hosts_bench.begin("efficient_hosts", f"binary {o.binary}")
    rows, curves, port = [], {}, o.port

    def rounds(cluster):
        nonlocal port
        for rate in o.rates:
            for h in range(REPLICAS):
                cluster.shape(h, rate)
            for rnd in range(1, o.rounds + 1):
                for case in o.configs:
                    stem = os.path.join(results, f"{rate}-{case}-round{rnd}")
                    started = time.monotonic()
                    row, curve = run_once(o, cluster, case, port, stem)
                    port += 1
                    ok = row is not None
                    rows.append(dict(rate=rate, round=rnd, case=case, ok=ok, note="" if ok else curve,
                                     **(row or dict(final_accuracy=0, train_seconds=0, reached_epoch=None,
                                                    reached_seconds=None, bytes_per_step=None, bytes_to_88=None,
                                                    optimizer_state_bytes=None, peak_bytes_per_step=None))))
                    if ok and rnd == 1:
                        curves.setdefault(rate, {})[case] = curve
                    said = (f"88% at {row['reached_seconds']} s (epoch {row['reached_epoch']}), "
                            f"{row['bytes_per_step']} B/step, final {row['final_accuracy']}%, "
                            f"{row['train_seconds']} s" if ok else f"FAILED: {curve}")
                    print(f"# {rate}, round {rnd}, {case}: {said} ({time.monotonic() - started:.0f} s; {stem}.*.out)",
                          flush=True)

    status = hosts_bench.on_cluster("efficient_hosts.py", REPLICAS, "eff", rounds)
    if status is not None:
        return status
    hosts_bench.write_csv(os.path.join(results, "rows.csv"), list(rows[0]), [list(r.values()) for r in rows])
    hosts_bench.write_csv(os.path.join(results, "curves.csv"), ("rate", "case", "seconds", "accuracy", "bytes"),
                          [(rate, case, s, a, b) for rate, cs in curves.items() for case, pts in cs.items()
                           for s, a, b in pts])
    summarize(o, rows, results)
    plot(curves, results, o.rates)
    print(f"# results in {results}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
