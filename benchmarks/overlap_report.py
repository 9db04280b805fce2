#!/usr/bin/env python3
"""Tables, CSV and plot of benchmarks/overlap.sh: communication overlapped with backward, beside DDP.

    overlap_report.py --runs results/overlap/runs.tsv --results results [--loss-tolerance 1e-3]

runs.tsv has one line per run (rate, cluster HxP, repeat, label, status, seconds, CSV of rank 0's
row from benchmarks/overlap or overlap_ddp.py, load average and compiler processes at its start:
runs that shared the cores with a compiler are listed as noisy). Labels: a (gradwire compute only), b (gradwire,
communication after backward), c (gradwire, overlapped), d (PyTorch DDP), a_torch (PyTorch
compute only). Per cluster and rate it prints the median step time of each (the median over
repeats of each run's median), the share of communication hidden (b - c) / (b - a), samples/s
of b, c, d (all ranks together), (c)/(d), and the check that every run started from the same
parameters (init checksum) and that (c) and (d) end at the same test loss (relative difference
within --loss-tolerance, in every repeat). Writes overlap.csv and overlap.png into --results.
Exits 1 if the checks fail, 0 otherwise (also when runs are missing: overlap.sh reports those).
"""
import argparse
import csv
import statistics
import sys

LABELS = ["a", "a_torch", "b", "c", "d"]
NAMES = {"a": "(a) compute only, gradwire", "a_torch": "(a') compute only, PyTorch",
         "b": "(b) gradwire, all-reduce after backward", "c": "(c) gradwire, overlapped",
         "d": "(d) PyTorch DDP (gloo)"}


def read_runs(path):
    """{(rate, cluster): {label: [row per repeat]}}, in the order of the runs; and the failures."""
    data, failures, busy = {}, [], []
    with open(path, newline="") as f:
        for run in csv.DictReader(f, delimiter="\t"):
            key = (run["rate"], run["cluster"])
            if int(run.get("compilers") or 0) > 0:
                busy.append(f"{run['cluster']} {run['rate']} repeat {run['repeat']} {run['label']}: "
                            f"{run['compilers']} compiler process(es), load {run.get('load')}")
            data.setdefault(key, {})
            if run["status"] != "ok":
                failures.append(f"{run['cluster']} {run['rate']} repeat {run['repeat']} {run['label']}: {run['status']}")
                continue
            try:
                with open(run["csv"], newline="") as g:
                    rows = list(csv.DictReader(g))
            except FileNotFoundError:
                rows = []
            if not rows:
                failures.append(f"{run['cluster']} {run['rate']} repeat {run['repeat']} {run['label']}: no result row")
                continue
            row = rows[-1]
            row["repeat"] = run["repeat"]
            data[key].setdefault(run["label"], []).append(row)
    return data, failures, busy


def median_of(rows, field):
    values = [float(r[field]) for r in rows if r.get(field)]
    return statistics.median(values) if values else None


def fmt(v, spec, width):
    return f"{v:{width}{spec}}" if v is not None else f"{'-':>{width}}"


def summarise(key, runs, tolerance):
    rate, cluster = key
    hosts, per_host = (int(x) for x in cluster.split("x"))
    ms = {label: median_of(runs.get(label, []), "step_ms_median") for label in LABELS}
    some = next((rows[0] for rows in runs.values() if rows), {})
    world = hosts * per_host
    batch = int(some.get("batch", 0) or 0)
    s = {"cluster": cluster, "hosts": hosts, "per_host": per_host, "rate": rate, "world": world,
         "params": some.get("params", ""), "batch": batch, "steps": some.get("steps", ""),
         "repeats": max((len(v) for v in runs.values()), default=0)}
    for label in LABELS:
        s[f"{label}_ms"] = ms[label]
        s[f"{label}_p10_ms"] = median_of(runs.get(label, []), "step_ms_p10")
        s[f"{label}_p90_ms"] = median_of(runs.get(label, []), "step_ms_p90")
        s[f"{label}_after_backward_ms"] = median_of(runs.get(label, []), "after_backward_ms_median")
    a, b, c, d = ms["a"], ms["b"], ms["c"], ms["d"]
    s["hidden_share"] = (b - c) / (b - a) if None not in (a, b, c) and b - a > 0 else None
    for label in ("b", "c", "d"):
        s[f"{label}_samples_per_s"] = 1e3 * world * batch / ms[label] if ms[label] else None
    s["c_over_d"] = d / c if c and d else None  # samples/s of (c) over those of (d)
    # Same start: every run's init checksum equal.
    inits = {r["init_checksum"] for rows in runs.values() for r in rows}
    s["init_same"] = len(inits) == 1 if inits else None
    # Same end: (c) and (d) of the same repeat at the same test loss.
    diffs = []
    by_repeat = {lab: {r["repeat"]: r for r in runs.get(lab, [])} for lab in ("b", "c", "d")}
    for rep, rc in by_repeat["c"].items():
        rd = by_repeat["d"].get(rep)
        if rd:
            lc, ld = float(rc["eval_loss"]), float(rd["eval_loss"])
            diffs.append(abs(lc - ld) / max(abs(ld), 1e-12))
    s["loss_rel_diff_c_d"] = max(diffs) if diffs else None
    s["loss_ok"] = (max(diffs) <= tolerance) if diffs else None
    for lab in ("b", "c", "d"):
        s[f"loss_{lab}"] = median_of(runs.get(lab, []), "eval_loss")
        s[f"acc_{lab}"] = median_of(runs.get(lab, []), "eval_acc")
    return s


def plot(path, summaries):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# plot: matplotlib is not installed (Debian: python3-matplotlib)", file=sys.stderr)
        return
    rates = list(dict.fromkeys(s["rate"] for s in summaries))
    fig, axes = plt.subplots(1, len(rates), figsize=(6.5 * len(rates), 4.6), squeeze=False)
    colours = {"a": "tab:grey", "a_torch": "silver", "b": "tab:blue", "c": "tab:green", "d": "tab:brown"}
    for ax, rate in zip(axes[0], rates):
        rows = [s for s in summaries if s["rate"] == rate]
        width = 0.16
        for j, label in enumerate(LABELS):
            xs = [i + (j - 2) * width for i in range(len(rows))]
            ys = [s[f"{label}_ms"] or 0 for s in rows]
            ax.bar(xs, ys, width, color=colours[label], label=NAMES[label])
        for i, s in enumerate(rows):
            if s["hidden_share"] is not None:
                top = max(s[f"{lab}_ms"] or 0 for lab in LABELS)
                ax.text(i, top * 1.02, f"hidden {100 * s['hidden_share']:.0f}%", ha="center", fontsize=8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"{s['cluster']} (hosts x ranks)" for s in rows])
        ax.set_ylabel("median step time (ms)")
        ax.set_title(f"{rows[0]['params']} parameters, batch {rows[0]['batch']}/rank, links {rate}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"# plot: {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--loss-tolerance", type=float, default=1e-3)
    a = p.parse_args()
    data, failures, busy = read_runs(a.runs)
    summaries = [summarise(k, v, a.loss_tolerance) for k, v in data.items()]

    print("#")
    print("# Step time (median over timed steps; over repeats, the median of the medians), ms per step of one rank")
    print("# hidden = (b - c) / (b - a): the share of (b)'s communication time that (c) hides behind backward")
    print("#")
    print("#  cluster     rate     params  batch |      a     a'      b      c      d | hidden | "
          "   b smp/s    c smp/s    d smp/s |  c/d")
    for s in summaries:
        print(f"   {s['cluster']:>7} {s['rate']:>8} {s['params']:>10} {s['batch']:>6} |"
              + "".join(fmt(s[f'{lab}_ms'], '.0f', 7) for lab in LABELS) + " |"
              + (f"{100 * s['hidden_share']:6.1f}%" if s["hidden_share"] is not None else f"{'-':>7}") + " |"
              + "".join(fmt(s[f'{lab}_samples_per_s'], '.1f', 11) for lab in ("b", "c", "d")) + " |"
              + fmt(s["c_over_d"], ".2f", 6))
    print("#")
    print("# After backward returned (ms): what is left of the communication, and the optimizer; DDP waits for its")
    print("# buckets inside backward, so (d)'s is its optimizer only")
    print("#")
    print("#  cluster     rate |      a     a'      b      c      d")
    for s in summaries:
        print(f"   {s['cluster']:>7} {s['rate']:>8} |"
              + "".join(fmt(s[f'{lab}_after_backward_ms'], '.0f', 7) for lab in LABELS))
    print("#")
    print("# At equal accuracy: test loss / accuracy after the last step (first --eval test samples), same start")
    print("#")
    print("#  cluster     rate |   loss b    loss c    loss d  |c-d|/d   ok |  acc c   acc d | init same")
    bad = False
    for s in summaries:
        ok = {True: "yes", False: "NO", None: "-"}[s["loss_ok"]]
        init = {True: "yes", False: "NO", None: "-"}[s["init_same"]]
        bad |= s["loss_ok"] is False or s["init_same"] is False
        print(f"   {s['cluster']:>7} {s['rate']:>8} |" + "".join(fmt(s[f'loss_{lab}'], '.5f', 9) for lab in "bcd")
              + fmt(s["loss_rel_diff_c_d"], ".1e", 9) + f" {ok:>4} |" + fmt(s["acc_c"], ".4f", 7)
              + fmt(s["acc_d"], ".4f", 8) + f" | {init:>9}")
    print(f"# tolerance: |loss c - loss d| / loss d <= {a.loss_tolerance:g} in every repeat")
    for f in failures:
        print(f"# missing: {f}")
    for b in busy:
        print(f"# noisy: started while compilers ran: {b}")

    fields = list(summaries[0].keys()) if summaries else []
    with open(f"{a.results}/overlap.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for s in summaries:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in s.items()})
    print(f"# csv: {a.results}/overlap.csv")
    if summaries:
        plot(f"{a.results}/overlap.png", summaries)
    if bad:
        print("# CHECK FAILED: runs did not start from the same parameters or (c) and (d) ended at different losses",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
