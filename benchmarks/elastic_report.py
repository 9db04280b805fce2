#!/usr/bin/env python3
"""Tables, summary CSV and plot of benchmarks/elastic.sh's trials (losses in elastic training).

    elastic_report.py --csv results/elastic_losses.csv --results results

elastic_losses.csv has one row per trial (elastic_trials.py). Prints one table per links
(loopback or an inter-host rate) with a row per kind of loss: trials, passed (survivors
bit-identical and matching the float64 reference, victim stopped, no hang), trials that
recovered within the target, median / p90 / max recovery seconds (over the trials whose every
survivor completed a step after the loss), what became of the victims, and beside each row the
issue's target. Lists the failed trials with what went wrong. Writes elastic_losses_summary.csv
and, where matplotlib is installed, elastic_losses.png into --results.
"""
import argparse
import collections
import csv
import pathlib
import sys

KINDS = ["kill0", "kill-mid", "kill-last", "partition", "sigstop"]
WHAT = {"kill0": "kill -9 rank 0", "kill-mid": "kill -9 rank 1", "kill-last": "kill -9 rank 3",
        "partition": "host 2 link down", "sigstop": "SIGSTOP rank 2 6 s"}
# The target, with the default heartbeat (1 s, lost after 5 silent intervals).
TARGET_S = 7.5
TARGET_TRIALS = 20
TARGET = (f"next step within heartbeat detection + 2 s (<= {TARGET_S:g} s with defaults), "
          f"{TARGET_TRIALS} of {TARGET_TRIALS} trials, bit-identical")
SUMMARY_FIELDS = ["links", "kind", "victim", "loss", "trials", "passed", "recovered", "within_target", "median_s",
                  "p90_s", "max_s", "min_s", "victim_outcomes", "target_met"]


def percentile(values, q):
    """The q-quantile (0..1) of `values`, linear between order statistics (numpy's default)."""
    v = sorted(values)
    if not v:
        return None
    x = q * (len(v) - 1)
    i = int(x)
    return v[i] if i + 1 >= len(v) else v[i] + (x - i) * (v[i + 1] - v[i])


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def summarise(rows):
    """[(links, kind, summary dict)] in run order of links, then KINDS order."""
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault(r["rate"], collections.defaultdict(list))[r["kind"]].append(r)
    out = []
    for links, by_kind in groups.items():
        for kind in [k for k in KINDS if k in by_kind] + sorted(k for k in by_kind if k not in KINDS):
            trials = by_kind[kind]
            rec = [float(t["recovery_s"]) for t in trials if t["recovery_s"]]
            passed = sum(t["status"] == "pass" for t in trials)
            within = sum(t["status"] == "pass" and t["recovery_s"] and float(t["recovery_s"]) <= TARGET_S
                         for t in trials)
            outcomes = collections.Counter(t["victim_outcome"] or "-" for t in trials)
            n = len(trials)
            if within == n and n >= TARGET_TRIALS:
                met = "met"
            elif within == n:
                met = f"met in {n} of {n} (fewer than {TARGET_TRIALS} trials)"
            else:
                why = []
                if passed < n:
                    why.append(f"{n - passed} failed")
                if within < passed:
                    why.append(f"{passed - within} over {TARGET_S:g} s")
                met = "NOT met: " + ", ".join(why)
            out.append((links, kind, {
                "links": links, "kind": kind, "victim": trials[0]["victim"], "loss": WHAT.get(kind, kind),
                "trials": n, "passed": passed, "recovered": len(rec), "within_target": within,
                "median_s": percentile(rec, 0.5), "p90_s": percentile(rec, 0.9), "max_s": max(rec, default=None),
                "min_s": min(rec, default=None),
                "victim_outcomes": ", ".join(f"{w} x{c}" for w, c in outcomes.most_common()), "target_met": met}))
    return out


def print_tables(summary, rows):
    print(f"# elastic_all_reduce, 4 ranks, one lost after its step 10; recovery = from the loss to the latest "
          f"survivor's first step completed in the new view")
    print(f"# target: {TARGET}")
    print("# passed: every survivor printed PASS in a view of the 3 survivors, hashes equal (bit-identical), "
          "the float64 reference without the victim from the loss on matches; the victim stopped; no hang")
    last = None
    for links, kind, s in summary:
        if links != last:
            last = links
            print("#")
            print(f"# ===== {links if links == 'loopback' else f'4 emulated hosts x 1 rank, links {links}'} =====")
            print(f"# {'kind':<10} {'loss':<19} {'trials':>6} {'passed':>6} {'<=' + format(TARGET_S, 'g') + 's':>6} "
                  f"{'median':>7} {'p90':>7} {'max':>7}  {'victim':<18} target")
            print(f"# {'':<10} {'':<19} {'':>6} {'':>6} {'':>6} {'(s)':>7} {'(s)':>7} {'(s)':>7}")
        rec = "" if s["recovered"] == s["trials"] else f"  (recovery of {s['recovered']} trials)"
        print(f"  {kind:<10} {s['loss']:<19} {s['trials']:>6} {s['passed']:>6} {s['within_target']:>6} "
              f"{fmt(s['median_s']):>7} {fmt(s['p90_s']):>7} {fmt(s['max_s']):>7}  {s['victim_outcomes']:<18} "
              f"<= {TARGET_S:g} s, {TARGET_TRIALS} of {TARGET_TRIALS}, bit-identical: {s['target_met']}{rec}")
    failed = [r for r in rows if r["status"] != "pass"]
    print("#")
    if failed:
        print(f"# failed trials ({len(failed)}):")
        for r in failed:
            print(f"#   {r['rate']} {r['kind']} trial {r['trial']}: recovery {r['recovery_s'] or '-'} s, survivors "
                  f"{r['survivors_passed']} bit-identical {r['bit_identical']} cut {r['cut'] or '-'}, victim "
                  f"{r['victim_outcome']}: {r['note'] or '(no note)'} [{r['log']}]")
    else:
        print(f"# every trial passed ({len(rows)})")


def plot(path, summary, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# plot: matplotlib is not installed for /usr/bin/python3 (Debian: python3-matplotlib); "
              "no elastic_losses.png", file=sys.stderr)
        return
    links = list(dict.fromkeys(s[0] for s in summary))
    fig, axes = plt.subplots(1, len(links), figsize=(4.2 * len(links) + 1, 4.2), sharey=True, squeeze=False)
    for ax, l in zip(axes[0], links):
        kinds = [k for (ll, k, _) in summary if ll == l]
        for i, k in enumerate(kinds):
            trials = [r for r in rows if r["rate"] == l and r["kind"] == k and r["recovery_s"]]
            ok = [float(r["recovery_s"]) for r in trials if r["status"] == "pass"]
            bad = [float(r["recovery_s"]) for r in trials if r["status"] != "pass"]
            jitter = lambda n: [i + 0.25 * ((j % 7) / 6 - 0.5) for j in range(n)]  # noqa: E731
            ax.scatter(jitter(len(ok)), ok, s=14, color="tab:blue", alpha=0.7, label="passed" if i == 0 else None)
            if bad:
                ax.scatter(jitter(len(bad)), bad, s=30, marker="x", color="tab:red", label="failed")
        ax.axhline(TARGET_S, color="tab:red", linestyle="--", linewidth=1, label=f"target {TARGET_S:g} s")
        ax.set_yscale("log")
        ax.set_xticks(range(len(kinds)))
        ax.set_xticklabels(kinds, rotation=30)
        ax.set_title(l if l == "loopback" else f"4 hosts, {l}")
        ax.grid(True, which="both", axis="y", alpha=0.3)
    axes[0][0].set_ylabel("loss -> every survivor's next step (s)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle("elastic_all_reduce: recovery from the loss of one of 4 ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# plot: {path}", file=sys.stderr)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", required=True, help="elastic_losses.csv (one row per trial)")
    p.add_argument("--results", required=True, help="where the summary CSV and the plot go")
    o = p.parse_args(argv)
    try:
        with open(o.csv, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        sys.exit(f"elastic_report.py: no {o.csv}: the trials wrote nothing (see their output above)")
    if not rows:
        sys.exit(f"elastic_report.py: {o.csv} has no trials")
    summary = summarise(rows)
    print_tables(summary, rows)
    res = pathlib.Path(o.results)
    with open(res / "elastic_losses_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS)
        w.writeheader()
        for _, _, s in summary:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in s.items()})
    plot(res / "elastic_losses.png", summary, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
