#!/usr/bin/env python3
"""Communication-efficient training on slow links: Fashion-MNIST on 4 emulated hosts, all-reduce beside codecs, local SGD, DiLoCo, ZeRO-1 and PyTorch DDP.

    benchmarks/efficient_hosts.py [--rates "100mbit 1gbit"] [--epochs 6] [--rounds 1] [--configs LIST]
                                  [--binary PATH] [--run-timeout 900] [--reuse]

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
The peer, PyTorch DDP over gloo on the same hosts (benchmarks/torch_ddp_fmnist_hosts.py --recipe
gradwire: the example's model, initialisation, data order, Adam and cosine schedule, evaluations
and clock), each run right after the gradwire case it is compared with (default: all three):
    ddp             DDP's own all-reduce                        beside all_reduce
    ddp_fp16        DDP with default_hooks.fp16_compress_hook    beside fp16
    ddp_powersgd4   DDP with powerSGD_hook, rank 4, plain for    beside powersgd
                    its first 10 steps (as the example's codec)
Rounds are interleaved (every case once per round, per rate). Per rate and case, medians over
rounds of: bytes sent per step by rank 0 (payload, not headers: the strategy's own count; the
peer's, counted the same way, is described in torch_ddp_fmnist_hosts.py), the bytes host 0's
eth0 sent per step (its kernel counter over the whole job: headers, start-up and evaluations
included; the one count that is the same for gradwire and the peer), the seconds to 88% test
accuracy (the example's count: from the start of training, evaluations included), the bytes
sent until then, the final accuracy, the training seconds and those over the steps, with
ratios to all_reduce's at that rate, and for each peer case gradwire's figures over the
peer's. Writes results/efficient/summary.{txt,csv}, vs_torch.csv, rows.csv (one row per run),
curves.csv (rank 0's evaluations: accuracy against seconds and bytes) and accuracy_vs_time.png,
accuracy_vs_bytes.png (matplotlib; the peer dashed, in its gradwire case's colour), every
host's output beside them. --reuse keeps the runs rows.csv and curves.csv already hold and
runs only the (rate, case) pairs of --rates x --configs that they lack (none: it summarises
and plots). Exits 1 if a run failed. Never fails on time.

The binary: --binary, else build-fm/examples/fashion_mnist (benchmarks/fashion_mnist.sh's
Release build), else build/examples/fashion_mnist (the test build: -O1, read ratios).

The peer: ../shared/peers/torch_ddp_fmnist.py (GRADWIRE_PEERS_DIR names another folder), run
by /usr/bin/python3 (Debian's python3-torch).

Environment: GRADWIRE_RESULTS_DIR (default results), GRADWIRE_PEERS_DIR.
"""
import argparse
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from elastic_trials import ROOT, base_env, gwcluster  # noqa: E402  (the hosts' jobs of elastic.sh)
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
ON_REQUEST = ("powersgd16", "powersgd64", "diloco50_int8")
# PyTorch DDP on the same hosts: name: (its communication hook, the gradwire case beside it, label).
PEERS = {
    "ddp": ("none", "all_reduce", "torch DDP"),
    "ddp_fp16": ("fp16", "fp16", "torch DDP fp16 hook"),
    "ddp_powersgd4": ("powersgd:4", "powersgd", "torch DDP PowerSGD r4"),
}
TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch
PEER_RUNNER = os.path.join(HERE, "torch_ddp_fmnist_hosts.py")
# Every case but those on request, each peer right after its gradwire case.
DEFAULT = [name for c in CASES if c not in ON_REQUEST
           for name in (c, *(p for p, (_, beside, _) in PEERS.items() if beside == c))]
KNOWN = [*CASES, *PEERS]
# A run's measurements (rows.csv's columns after rate, round, case, ok, note).
FIELDS = ("final_accuracy", "train_seconds", "reached_epoch", "reached_seconds", "bytes_per_step", "bytes_to_88",
          "optimizer_state_bytes", "peak_bytes_per_step", "wire_bytes_per_step", "epochs")
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
    p.add_argument("--configs", default=",".join(DEFAULT),
                   help=f"cases, comma separated (default all but {', '.join(ON_REQUEST)})")
    p.add_argument("--binary", help="examples/fashion_mnist (default: build-fm's, else build's)")
    p.add_argument("--run-timeout", type=float, default=900, help="seconds per run (default 900)")
    p.add_argument("--port", type=int, default=30900, help="first master port, +1 per run (default 30900)")
    p.add_argument("--reuse", action="store_true",
                   help="keep the runs in the results folder's rows.csv and curves.csv and run only the (rate, case) "
                        "pairs they lack; then summarise and plot them all")
    o = p.parse_args(argv)
    o.configs = [c for c in o.configs.replace(" ", ",").split(",") if c]
    o.rates = o.rates.replace(",", " ").split()
    unknown = [c for c in o.configs if c not in KNOWN]
    if unknown or not o.configs:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(KNOWN)}")
    for rate in o.rates:
        try:
            gwcluster.parse_rate(rate)
        except gwcluster.ClusterError as e:
            p.error(f"--rates: {e}")
    if o.epochs < 1 or o.rounds < 1 or o.run_timeout <= 0 or not o.rates:
        p.error("--epochs and --rounds >= 1, --run-timeout > 0, at least one rate")
    return p, o


def require_runnable(p, o, cases):
    """What running `cases` needs: the example (gradwire's cases), the peer (DDP's), the data, root."""
    if any(c in CASES for c in cases):
        o.binary = hosts_bench.find_binary(p, o.binary, "build-fm/examples/fashion_mnist",
                                           "run benchmarks/fashion_mnist.sh once (it builds it)")
    if any(c in PEERS for c in cases):
        o.peer = os.path.join(os.environ.get("GRADWIRE_PEERS_DIR", os.path.join(ROOT, "..", "shared", "peers")),
                              "torch_ddp_fmnist.py")
        if not os.path.isfile(o.peer):
            p.error(f"no {o.peer} (the DDP cases run it; set GRADWIRE_PEERS_DIR)")
        if not os.access(TORCH_PYTHON, os.X_OK):
            p.error(f"no {TORCH_PYTHON} (the DDP cases run Debian's python3-torch with it)")
    if not os.path.isdir(DATA):
        p.error(f"no Fashion-MNIST at {DATA} (scripts/deps.sh installs dataset-fashion-mnist)")
    hosts_bench.require_emulated_hosts(p)


def command(o, case):
    """The argv every rank of `case` runs, and its environment."""
    env = base_env()
    env["GRADWIRE_TIMEOUT"] = "300"
    common = ["--epochs", str(o.epochs), "--evals-per-epoch", "4"]
    if case in PEERS:
        env["GLOO_SOCKET_IFNAME"] = "eth0"
        return [TORCH_PYTHON, PEER_RUNNER, "--peer", o.peer, "--recipe", "gradwire", "--hook", PEERS[case][0],
                *common], env
    return [o.binary, *CASES[case], "--transport", "tcp", *common, "--data", DATA], env


def run_once(o, cluster, case, port, stem):
    """One training job: (row dict, curve [(seconds, accuracy, bytes)]) or (None, why)."""
    argv, env = command(o, case)
    wire_before = hosts_bench.tx_bytes(cluster, 0)
    out, codes = hosts_bench.run_job(argv, cluster, env, port, stem, o.run_timeout, REPLICAS)
    wire = hosts_bench.tx_bytes(cluster, 0) - wire_before
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
               peak_bytes_per_step=max(peaks) if peaks else None,
               wire_bytes_per_step=wire / (o.epochs * STEPS_PER_EPOCH), epochs=o.epochs)
    curve = [(float(s), float(a), float(e) * STEPS_PER_EPOCH * (per_step or 0)) for e, s, a in CURVE.findall(out)]
    return row, curve


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def label(case):
    return PEERS[case][2] if case in PEERS else case


def summarize(o, rows, results):
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    mb = lambda v: None if v is None else v / 1e6  # noqa: E731
    ratio = lambda a, b: a / b if a is not None and b else None  # noqa: E731
    steps = o.epochs * STEPS_PER_EPOCH
    text = [f"# Fashion-MNIST, {REPLICAS} replicas on {REPLICAS} emulated hosts over TCP, {o.epochs} epochs, "
            f"median over {o.rounds} round(s); {o.binary}"]
    header = ("rate", "case", "runs", "bytes_per_step", "bytes_vs_all_reduce", "peak_bytes_per_step", "reached_seconds",
              "speedup_vs_all_reduce", "bytes_to_88", "bytes_to_88_vs_all_reduce", "reached_epoch",
              "final_accuracy", "train_seconds", "optimizer_state_bytes", "reached_in", "wire_bytes_per_step",
              "step_seconds")
    table, medians = [], {}
    for rate in o.rates:
        text += ["", f"## links {rate}",
                 f"{'case':<22} {'runs':>4} {'MB/step':>9} {'x bytes':>8} {'wire MB':>8} {'peak MB':>8} {'to 88% s':>9} "
                 f"{'speedup':>8} {'MB to 88%':>10} {'x fewer':>8} {'epoch':>6} {'final %':>8} {'train s':>8} "
                 f"{'step ms':>8} {'state MB':>9}"]
        ok = {c: [r for r in rows if r["rate"] == rate and r["case"] == c and r["ok"]] for c in o.configs}
        base = ok.get("all_reduce", [])
        base_secs = median_or_none(r["reached_seconds"] for r in base)
        base_bytes = median_or_none(r["bytes_per_step"] for r in base)
        base_to = median_or_none(r["bytes_to_88"] for r in base)
        for case in o.configs:
            rs = ok[case]
            if not rs:
                text.append(f"{label(case):<22} FAILED (see the hosts' outputs)")
                continue
            m = {k: median_or_none(r.get(k) for r in rs) for k in FIELDS}
            m["step_seconds"] = m["train_seconds"] / steps
            medians[rate, case] = m
            per_step, secs, to = m["bytes_per_step"], m["reached_seconds"], m["bytes_to_88"]
            reached_in = sum(1 for r in rs if r["reached_seconds"] is not None)
            x_bytes = ratio(per_step, base_bytes)
            speedup = ratio(base_secs, secs)
            fewer = ratio(base_to, to)
            table.append((rate, case, len(rs), fmt(per_step, ".0f"), fmt(x_bytes, ".4f"), fmt(m["peak_bytes_per_step"], ".0f"),
                          fmt(secs, ".2f"), fmt(speedup, ".2f"), fmt(to, ".0f"), fmt(fewer, ".1f"),
                          fmt(m["reached_epoch"], ".2f"), f"{m['final_accuracy']:.2f}", f"{m['train_seconds']:.2f}",
                          fmt(m["optimizer_state_bytes"], ".0f"), f"{reached_in}/{len(rs)}",
                          fmt(m["wire_bytes_per_step"], ".0f"), f"{m['step_seconds']:.5f}"))
            text.append(f"{label(case):<22} {len(rs):>4} {fmt(mb(per_step), '.4f'):>9} {fmt(x_bytes, '.3f'):>8} "
                        f"{fmt(mb(m['wire_bytes_per_step']), '.4f'):>8} {fmt(mb(m['peak_bytes_per_step']), '.3f'):>8} "
                        f"{fmt(secs, '.1f'):>9} {fmt(speedup, '.2f'):>8} {fmt(mb(to), '.1f'):>10} "
                        f"{fmt(fewer, '.1f'):>8} {fmt(m['reached_epoch'], '.2f'):>6} {m['final_accuracy']:>8.2f} "
                        f"{m['train_seconds']:>8.1f} {1e3 * m['step_seconds']:>8.1f} "
                        f"{fmt(mb(m['optimizer_state_bytes']), '.3f'):>9}"
                        + ("" if reached_in == len(rs) else f"  (88% in {reached_in} of {len(rs)} runs)"))
    text += ["", "# MB/step: sent by rank 0 per step (payload); x bytes: / all_reduce's; wire MB: host 0's eth0 per step "
             "(headers, start-up, evaluations); peak MB: the most rank 0 sent in one step; speedup: all_reduce's "
             "seconds to 88% / the case's; MB to 88%: sent by rank 0 until 88%; x fewer: all_reduce's / the case's; "
             "step ms: train s / steps (evaluations included); state MB: rank 0's optimizer state"]
    # gradwire beside the peer: each DDP case against the gradwire case it runs after.
    pairs = [(rate, PEERS[c][1], c) for rate in o.rates for c in o.configs
             if c in PEERS and (rate, c) in medians and (rate, PEERS[c][1]) in medians]
    vs = []
    if pairs:
        text += ["", "## gradwire against PyTorch DDP (x: gradwire / torch; final: gradwire - torch, points)",
                 f"{'rate':<7} {'gradwire':<10} {'torch':<22} {'MB/step':>15} {'x':>6} {'wire MB/step':>15} {'x':>6} "
                 f"{'step ms':>13} {'x':>6} {'to 88% s':>13} {'x':>6} {'final %':>13} {'diff':>6}"]
        for rate, ours, theirs in pairs:
            g, t = medians[rate, ours], medians[rate, theirs]
            row = [rate, ours, theirs]
            line = f"{rate:<7} {ours:<10} {label(theirs):<22}"
            for key, scale, spec, csv_spec in (("bytes_per_step", 1e-6, ".4f", ".0f"),
                                               ("wire_bytes_per_step", 1e-6, ".4f", ".0f"),
                                               ("step_seconds", 1e3, ".1f", ".5f"), ("reached_seconds", 1, ".1f", ".2f")):
                x = ratio(g[key], t[key])
                row += [fmt(g[key], csv_spec), fmt(t[key], csv_spec), fmt(x, ".3f")]
                scaled = [None if v is None else v * scale for v in (g[key], t[key])]
                pair = f"{fmt(scaled[0], spec)}/{fmt(scaled[1], spec)}"
                line += f" {pair:>{15 if key.endswith('per_step') else 13}} {fmt(x, '.2f'):>6}"
            diff = g["final_accuracy"] - t["final_accuracy"]
            row += [g["final_accuracy"], t["final_accuracy"], f"{diff:+.2f}"]
            line += f" {g['final_accuracy']:.2f}/{t['final_accuracy']:.2f} {diff:>+6.2f}"
            vs.append(row)
            text.append(line)
        hosts_bench.write_csv(os.path.join(results, "vs_torch.csv"),
                              ("rate", "gradwire_case", "torch_case",
                               *(f"{k}_{who}" for k in ("bytes_per_step", "wire_bytes_per_step", "step_seconds",
                                                        "reached_seconds") for who in ("gradwire", "torch", "ratio")),
                               "final_accuracy_gradwire", "final_accuracy_torch", "final_accuracy_diff"),
                              vs)
    hosts_bench.write_csv(os.path.join(results, "summary.csv"), header, table)
    with open(os.path.join(results, "summary.txt"), "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))


def plot(curves, results, rates, cases):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no matplotlib: the PNGs are not drawn (curves.csv has the numbers)")
        return
    palette = plt.get_cmap("tab20").colors  # a colour per case: the default cycle repeats after 10
    ours = [c for c in cases if c not in PEERS]
    colour = {c: palette[(2 * n) % 20 + (2 * n // 20) % 2] for n, c in enumerate(ours)}
    for what, index, xlabel, scale, log in (("time", 0, "training seconds (rank 0)", 1, False),
                                            ("bytes", 2, "MB sent by rank 0", 1e-6, True)):
        fig, axes = plt.subplots(1, len(rates), figsize=(7 * len(rates), 5), squeeze=False)
        for ax, rate in zip(axes[0], rates):
            for case in cases:
                pts = [p for p in curves.get(rate, {}).get(case, []) if p[index] > 0 or not log]
                if pts:
                    peer = case in PEERS  # dashed, in the colour of the gradwire case it is compared with
                    ax.plot([p[index] * scale for p in pts], [100 * p[1] for p in pts], marker=".", label=label(case),
                            color=colour.get(PEERS[case][1], "black") if peer else colour[case],
                            linestyle="--" if peer else "-")
            ax.axhline(88, color="grey", linestyle=":", linewidth=1)
            if log:
                ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("test accuracy (%)")
            ax.set_ylim(80, 90)
            ax.set_title(f"Fashion-MNIST, 4 emulated hosts, links {rate}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(results, f"accuracy_vs_{what}.png"), dpi=110)


def load_saved(p, o, results):
    """--reuse: the rows and curves of earlier runs, as main() would have made them."""
    import csv
    number = lambda v: None if v in ("", "None", None) else float(v)  # noqa: E731
    try:
        with open(os.path.join(results, "rows.csv")) as f:
            rows = [dict(rate=r["rate"], round=int(r["round"]), case=r["case"], ok=r["ok"] == "True",
                         note=r["note"], **{k: number(r.get(k)) for k in FIELDS})
                    for r in csv.DictReader(f)]
        curves = {}
        with open(os.path.join(results, "curves.csv")) as f:
            for r in csv.DictReader(f):
                curves.setdefault(r["rate"], {}).setdefault(r["case"], []).append(
                    (float(r["seconds"]), float(r["accuracy"]), float(r["bytes"])))
    except FileNotFoundError as e:
        p.error(f"--reuse: {e.filename}: no saved runs there (run once without --reuse)")
    # Older rows.csv files have no epochs column: their runs are taken to have trained --epochs.
    other = sorted({int(r["epochs"]) for r in rows if r["epochs"] is not None and r["epochs"] != o.epochs})
    if other:
        p.error(f"--reuse: the saved runs trained {other} epochs, not --epochs {o.epochs}")
    return rows, curves


def main(argv):
    p, o = parse(argv)
    results = hosts_bench.results_dir("efficient")
    rows, curves = load_saved(p, o, results) if o.reuse else ([], {})
    saved = {(r["rate"], r["case"]) for r in rows}
    todo = {(rate, case) for rate in o.rates for case in o.configs if (rate, case) not in saved}
    if todo:
        require_runnable(p, o, {case for _, case in todo})
    o.binary = o.binary or "gradwire: saved runs"
    if todo:
        hosts_bench.begin("efficient_hosts", f"binary {o.binary}" + (f", {len(saved)} (rate, case) pairs reused"
                                                                      if saved else ""))
    port = o.port

    def rounds(cluster):
        nonlocal port
        for rate in o.rates:
            if not any((rate, case) in todo for case in o.configs):
                continue
            for h in range(REPLICAS):
                cluster.shape(h, rate)
            for rnd in range(1, o.rounds + 1):
                for case in o.configs:
                    if (rate, case) not in todo:
                        continue
                    stem = os.path.join(results, f"{rate}-{case}-round{rnd}")
                    started = time.monotonic()
                    row, curve = run_once(o, cluster, case, port, stem)
                    port += 1
                    ok = row is not None
                    rows.append(dict(rate=rate, round=rnd, case=case, ok=ok, note="" if ok else curve,
                                     **(row or dict(dict.fromkeys(FIELDS), final_accuracy=0, train_seconds=0,
                                                    epochs=o.epochs))))
                    if ok and rnd == 1:
                        curves.setdefault(rate, {})[case] = curve
                    said = (f"88% at {row['reached_seconds']} s (epoch {row['reached_epoch']}), "
                            f"{row['bytes_per_step']} B/step ({row['wire_bytes_per_step']:.0f} on the wire), "
                            f"final {row['final_accuracy']}%, {row['train_seconds']} s" if ok else f"FAILED: {curve}")
                    print(f"# {rate}, round {rnd}, {case}: {said} ({time.monotonic() - started:.0f} s; {stem}.*.out)",
                          flush=True)

    if todo:
        status = hosts_bench.on_cluster("efficient_hosts.py", REPLICAS, "eff", rounds)
        if status is not None:
            return status
        columns = ("rate", "round", "case", "ok", "note", *FIELDS)
        hosts_bench.write_csv(os.path.join(results, "rows.csv"), columns, [[r.get(k) for k in columns] for r in rows])
        hosts_bench.write_csv(os.path.join(results, "curves.csv"), ("rate", "case", "seconds", "accuracy", "bytes"),
                              [(rate, case, s, a, b) for rate, cs in curves.items() for case, pts in cs.items()
                               for s, a, b in pts])
    summarize(o, rows, results)
    plot(curves, results, o.rates, o.configs)
    print(f"# results in {results}")
    return 0 if all(r["ok"] for r in rows if (r["rate"], r["case"]) in todo) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
