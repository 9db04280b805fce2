#!/usr/bin/env python3
"""Before/after table of benchmarks/regression.sh: per job and size, medians over rounds and their ratio.

    regression_report.py --runs results/regression/runs.tsv --csv results/regression.csv

runs.tsv: job, side (before/after), round, status, file (a benchmark's CSV or a Fashion-MNIST log).
Times (all-reduce, PS step) are in microseconds, lower is better; Fashion-MNIST is samples/s,
higher is better. `after/before` is always a time ratio (for samples/s: before / after), so
above 1 means the current tree is slower; `paired` is the median of the per-round ratios (the
two sides of a round ran next to each other), the better estimate on a noisy machine.
"""
import argparse
import csv
import re
import statistics
import sys


def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def metrics(job, path):
    """{metric name: (value, unit)} of one run."""
    out = {}
    if path.endswith(".csv"):
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        except FileNotFoundError:
            return out
        for r in rows:
            size = int(r["size_bytes"])
            if job == "ps":
                name = f"{r['workers']}w+{r['servers']}s {human(size)}"
            else:
                name = f"n={r['ranks']} {human(size)}"
            out[name] = (float(r["time_us"]), "us")
        try:  # the simulator's own speed: the run's wall time (regression.sh writes it to the log)
            wall = re.findall(r"^wall_s\s+([\d.]+)", open(path + ".log", errors="replace").read(), re.M)
            if wall:
                out["wall"] = (float(wall[-1]) * 1e6, "us")
        except FileNotFoundError:
            pass
    else:
        try:
            text = open(path, errors="replace").read()
        except FileNotFoundError:
            return out
        rates = [float(m) for m in re.findall(r"^epoch .*samples/s\s+([\d.]+)", text, re.M)]
        if rates:
            out["samples/s"] = (statistics.median(rates), "samples/s")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True)
    p.add_argument("--csv", required=True)
    a = p.parse_args()
    # (job, metric) -> {side: {round: value}}
    data, units, failed = {}, {}, []
    with open(a.runs, newline="") as f:
        for run in csv.DictReader(f, delimiter="\t"):
            if run["status"] != "ok":
                failed.append(f"{run['job']} {run['side']} round {run['round']}: {run['status']}")
                continue
            for name, (value, unit) in metrics(run["job"], run["file"]).items():
                key = (run["job"], name)
                data.setdefault(key, {"before": {}, "after": {}})[run["side"]][run["round"]] = value
                units[key] = unit
    print("#")
    print("# after/before: time ratio of the medians over rounds (above 1: this tree is slower); paired: median of "
          "the per-round ratios")
    print("#")
    print(f"#  {'job':<16} {'metric':<14} {'unit':>9} {'before':>12} {'after':>12} {'after/before':>13} "
          f"{'paired':>7} {'rounds':>6}")
    rows = []
    for (job, name), sides in data.items():
        unit = units[(job, name)]
        bv, av = sides["before"], sides["after"]
        if not bv or not av:
            continue
        mb, ma = statistics.median(bv.values()), statistics.median(av.values())
        higher_better = unit == "samples/s"
        ratio = (mb / ma if higher_better else ma / mb) if ma and mb else float("nan")
        paired = [(bv[r] / av[r] if higher_better else av[r] / bv[r]) for r in bv if r in av and av[r] and bv[r]]
        pr = statistics.median(paired) if paired else float("nan")
        rows.append({"job": job, "metric": name, "unit": unit, "before": mb, "after": ma, "after_over_before": ratio,
                     "paired": pr, "rounds": len(paired)})
        print(f"   {job:<16} {name:<14} {unit:>9} {mb:12.1f} {ma:12.1f} {ratio:13.3f} {pr:7.3f} {len(paired):6d}")
    for f in failed:
        print(f"# failed: {f}")
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["job", "metric", "unit", "before", "after", "after_over_before", "paired",
                                          "rounds"])
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"# csv: {a.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
