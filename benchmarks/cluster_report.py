#!/usr/bin/env python3
"""Tables, CSV and plot of benchmarks/cluster.sh's runs across emulated hosts.

    cluster_report.py --runs results/cluster/runs.tsv --results results

runs.tsv has one line per run (rate, cluster HxP, label, kind, transport, algorithm, status,
seconds, output file): gradwire runs point at allreduce_tcp's CSV, the peers at their
nccl-tests-style tables, Fashion-MNIST runs at rank 0's log. Prints, per cluster and rate,
the small-message times and the busbw of every algorithm and peer, then the ratios
(gradwire's best / OpenMPI, / Gloo, hierarchical / flat ring), the size from which
hierarchical beats both flat algorithms (where auto should switch), the 64 MiB link use,
the issue's targets, and Fashion-MNIST. Writes cluster_allreduce.csv, cluster_ratios.csv,
cluster_fmnist.csv and cluster_allreduce.png into --results.
"""
import argparse
import csv
import pathlib
import re
import sys

MIB = 1 << 20


def rate_gbytes(rate):
    """GB/s of a tc rate such as 1gbit, 10gbit, 500mbit."""
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", rate.lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1e0, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8e9


def read_gradwire(path):
    """{bytes: (time_us, busbw, wrong)} from allreduce_tcp's CSV. A transport's name may hold
    commas ("per_peer(ucx,asio_tcp)"), so columns are counted from the right of the header's."""
    rows = {}
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                return rows
            for fields in reader:
                extra = len(fields) - len(header)
                if extra < 0:
                    continue
                r = dict(zip(header, fields[:2] + fields[2 + extra:]))
                rows[int(r["size_bytes"])] = (float(r["time_us"]), float(r["busbw_gbps"]), int(r["wrong"]))
    except FileNotFoundError:
        pass
    return rows


def read_peer(path):
    rows = {}
    try:
        text = pathlib.Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        f = line.split()
        if len(f) == 6 and all(re.fullmatch(r"[\d.]+", x) for x in f):
            rows[int(f[0])] = (float(f[2]), float(f[4]), int(f[5]))
    return rows


def short(label):
    return (label.replace("halving_doubling", "hd").replace("hierarchical", "hier").replace("openmpi", "mpi"))


def size_text(s):
    if s >= MIB:
        return f"{s // MIB}M"
    if s >= 1024:
        return f"{s // 1024}K"
    return str(s)


def plot(path, data, order):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# plot: matplotlib is not installed (Debian: python3-matplotlib)", file=sys.stderr)
        return
    rates = sorted({k[0] for k in data}, key=lambda r: rate_gbytes(r) or 0)
    clusters = list(dict.fromkeys(k[1] for k in order))
    fig, axes = plt.subplots(len(rates), len(clusters), figsize=(6 * len(clusters), 4.6 * len(rates)), squeeze=False)
    for i, rate in enumerate(rates):
        for j, shape in enumerate(clusters):
            ax = axes[i][j]
            runs = data.get((rate, shape), {})
            # Colour by algorithm (or peer), line style by transport.
            colours = {"ring": "tab:blue", "halving_doubling": "tab:green", "hierarchical": "tab:red", "auto": "tab:purple",
                       "mpi": "black", "gloo": "tab:brown"}
            styles = {"tcp": "-", "ucx": ":"}
            for label, run in runs.items():
                sizes = [s for s in sorted(run["rows"]) if s >= 1024]
                if not sizes:
                    continue
                peer = run["kind"] != "gradwire"
                transport, _, algorithm = label.rpartition("-")
                ax.plot(sizes, [run["rows"][s][1] for s in sizes], marker="s" if peer else ".",
                        color=colours.get(label if peer else algorithm), linewidth=2.2 if peer else 1.4,
                        linestyle="--" if peer else styles.get(transport, "-."), label=short(label))
            link = rate_gbytes(rate)
            if link:
                ax.axhline(link, color="grey", linewidth=0.8)
                ax.text(1024, link, f" link {rate}", va="bottom", fontsize=7, color="grey")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel("busbw (GB/s)")
            ax.set_title(f"{shape} (hosts x ranks), {rate} links")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"# plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--results", required=True)
    a = ap.parse_args()
    res = pathlib.Path(a.results)

    data, order, fm = {}, [], {}
    with open(a.runs, newline="") as f:
        for r in csv.DictReader(f, delimiter="\t"):
            if r["kind"] == "fmnist":
                fm[r["label"]] = r
                continue
            rows = read_gradwire(r["file"]) if r["kind"] == "gradwire" else read_peer(r["file"])
            key = (r["rate"], r["cluster"])
            if key not in data:
                order.append(key)
            data.setdefault(key, {})[r["label"]] = {**r, "rows": rows}

    out_rows, ratio_rows = [], []
    summary = {"hier_vs_ring": [], "vs_mpi": [], "vs_gloo": [], "link64": [], "crossover": []}
    for rate, shape in order:
        runs = data[(rate, shape)]
        hosts, per_host = (int(x) for x in shape.split("x"))
        n = hosts * per_host
        link = rate_gbytes(rate)
        labels = list(runs)
        sizes = sorted({s for run in runs.values() for s in run["rows"]})
        print(f"\n# ===== {shape} ({hosts} hosts x {per_host} ranks = {n} ranks), links {rate}"
              f" ({link:.3f} GB/s each way) =====" if link else f"\n# ===== {shape}, {rate} =====")
        failed = [f"{short(l)}: {run['status']}" for l, run in runs.items() if run["status"] != "ok"]
        if failed:
            print("# failed or timed out: " + ", ".join(failed))
        wrong = [short(l) for l, run in runs.items() if any(v[2] > 0 for v in run["rows"].values())]
        if wrong:
            print("# WRONG RESULTS in: " + ", ".join(wrong))
        head = "".join(f" {short(l)[:11]:>11}" for l in labels)

        def cell(label, s, what):
            run = runs[label]
            if s in run["rows"]:
                t, bw, _ = run["rows"][s]
                return f" {t:11.1f}" if what == "time" else f" {bw:11.4f}"
            return f" {'failed' if run['status'] != 'ok' else '-':>11}"

        small = [s for s in sizes if s < 64 * 1024]
        large = [s for s in sizes if s >= 64 * 1024]
        if small:
            print(f"# time (us), median; small messages\n# {'size':>8}{head}")
            for s in small:
                print(f"  {size_text(s):>8}" + "".join(cell(l, s, "time") for l in labels))
        if large:
            print(f"# busbw (GB/s) = size/time * 2(n-1)/n\n# {'size':>8}{head}")
            for s in large:
                print(f"  {size_text(s):>8}" + "".join(cell(l, s, "busbw") for l in labels))
        for l, run in runs.items():
            for s, (t, bw, w) in sorted(run["rows"].items()):
                out_rows.append([rate, shape, hosts, per_host, n, l, run["kind"], run["transport"], run["algorithm"],
                                 run["status"], s, f"{t:.3f}", f"{bw:.5f}", f"{link:.4f}" if link else "",
                                 f"{bw / link:.4f}" if link else "", w])

        # Ratios from 256 KiB on: best gradwire vs peers, hierarchical vs flat ring.
        ours = [l for l in labels if runs[l]["kind"] == "gradwire"]
        transports = list(dict.fromkeys(l.rsplit("-", 1)[0] for l in ours))

        def bw(label, s):
            run = runs.get(label)
            return run["rows"][s][1] if run and s in run["rows"] else None

        def tm(label, s):
            run = runs.get(label)
            return run["rows"][s][0] if run and s in run["rows"] else None

        cols = ["best gradwire", "busbw", "/ mpi", "/ gloo"] + [f"{t} hier/ring" for t in transports if per_host > 1]
        print(f"# ratios of busbw (above 1: the first is faster)\n# {'size':>8} {cols[0]:>24} {cols[1]:>7} {cols[2]:>6} {cols[3]:>6}"
              + "".join(f" {c:>18}" for c in cols[4:]))
        for s in [s for s in large if s >= 256 * 1024]:
            cand = [(bw(l, s), l) for l in ours if bw(l, s)]
            if not cand:
                continue
            best, best_label = max(cand)
            rm = best / bw("mpi", s) if bw("mpi", s) else None
            rg = best / bw("gloo", s) if bw("gloo", s) else None
            line = f"  {size_text(s):>8} {short(best_label):>24} {best:7.4f} " + (f"{rm:6.2f}" if rm else f"{'-':>6}") + " " + (
                f"{rg:6.2f}" if rg else f"{'-':>6}")
            row = [rate, shape, s, best_label, f"{best:.5f}", f"{rm:.3f}" if rm else "", f"{rg:.3f}" if rg else ""]
            hr = {}
            for t in transports:
                if per_host == 1:
                    continue
                h, r = bw(f"{t}-hierarchical", s), bw(f"{t}-ring", s)
                hr[t] = h / r if h and r else None
                line += f" {hr[t]:18.2f}" if hr[t] else f" {'-':>18}"
            print(line)
            ratio_rows.append(row + [";".join(f"{t}={v:.3f}" for t, v in hr.items() if v)])
            if s >= MIB:
                if rm:
                    summary["vs_mpi"].append((rm, shape, rate, s))
                if rg:
                    summary["vs_gloo"].append((rg, shape, rate, s))
                for t, v in hr.items():
                    if hosts > 1 and per_host > 1 and v:
                        summary["hier_vs_ring"].append((v, shape, rate, s, t))
                # hierarchical over its best transport against the flat ring over its best
                hb = max((v for l in ours if l.endswith("-hierarchical") and (v := bw(l, s))), default=None)
                rb = max((v for l in ours if l.endswith("-ring") and (v := bw(l, s))), default=None)
                if hosts > 1 and per_host > 1 and hb and rb:
                    summary["hier_vs_ring"].append((hb / rb, shape, rate, s, "best/best"))

        # Crossover: the smallest size from which hierarchical is faster than both flat
        # algorithms at every larger size measured (auto should switch there).
        if per_host > 1 and hosts > 1:
            for t in transports:
                hier, flat = f"{t}-hierarchical", [f"{t}-ring", f"{t}-halving_doubling"]
                # Against the flat algorithms measured at that size (halving_doubling stops early).
                common = [s for s in sizes if tm(hier, s) and tm(flat[0], s)]
                if not common:
                    continue
                wins = [tm(hier, s) < min(tm(f, s) for f in flat if tm(f, s)) for s in common]
                cross = None
                for i in range(len(common)):
                    if all(wins[i:]):
                        cross = common[i]
                        break
                auto = f"{t}-auto"
                text = size_text(cross) if cross is not None else "never (in this sweep)"
                print(f"# {t}: hierarchical beats ring and halving_doubling from {text} on"
                      + (f" (it also wins at {', '.join(size_text(s) for s, w in zip(common, wins) if w and s < cross)})"
                         if cross and any(w for s, w in zip(common, wins) if s < cross) else ""))
                summary["crossover"].append((shape, rate, t, cross))

        # Link use at the largest size: bytes through each host's link per direction / time.
        if link and hosts > 1 and large:
            s = large[-1]
            parts = []
            for l in labels:
                t = tm(l, s)
                if not t:
                    continue
                alg = runs[l]["algorithm"]
                if alg in ("ring",) or l == "gloo":
                    per_link = 2 * (n - 1) / n * s  # flat ring, ranks of a host contiguous: one edge out, one in
                elif alg == "hierarchical":
                    per_link = 2 * (hosts - 1) / hosts * s  # P inter-host rings over 1/P each
                else:
                    continue
                use = per_link / (t * 1e-6) / 1e9 / link
                parts.append(f"{short(l)} {use:.0%}")
                summary["link64"].append((use, shape, rate, l))
            print(f"# link use at {size_text(s)} (bytes each host link carries each way / time / link rate): " + ", ".join(parts))

    with open(res / "cluster_allreduce.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rate", "cluster", "hosts", "ranks_per_host", "ranks", "label", "kind", "transport", "algorithm",
                    "status", "size_bytes", "time_us", "busbw_gbps", "link_gbytes_per_s", "busbw_over_link", "wrong"])
        w.writerows(out_rows)
    with open(res / "cluster_ratios.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rate", "cluster", "size_bytes", "best_gradwire", "best_busbw_gbps", "best_over_mpi",
                    "best_over_gloo", "hierarchical_over_ring"])
        w.writerows(ratio_rows)

    print("\n# ===== targets (sizes >= 1 MiB) =====")

    def worst(items, what, goal, fmt=lambda x: f"{x[0]:.2f}x at {x[1]} {x[2]} {size_text(x[3])}"):
        if not items:
            print(f"# {what}: not measured")
            return
        lo, hi = min(items), max(items)
        met = sum(1 for x in items if x[0] >= goal)
        print(f"# {what} (goal >= {goal}): met at {met} of {len(items)} points; worst {fmt(lo)}; best {fmt(hi)}")

    for t in dict.fromkeys(x[4] for x in summary["hier_vs_ring"]):
        worst([x for x in summary["hier_vs_ring"] if x[2].startswith("1g") and x[4] == t],
              f"hierarchical / flat ring over {t}, 1 Gbit/s", 1.5,
              lambda x: f"{x[0]:.2f}x at {x[1]} {x[2]} {size_text(x[3])}")
    worst([x for x in summary["vs_mpi"] if not x[1].startswith("1x")], "gradwire best / OpenMPI", 1.2)
    worst([x for x in summary["vs_gloo"] if not x[1].startswith("1x")], "gradwire best / Gloo", 1.5)
    best_link = {}
    for use, shape, rate, label in summary["link64"]:
        if not label.startswith(("mpi", "gloo")) and use > best_link.get((shape, rate), (0, ""))[0]:
            best_link[(shape, rate)] = (use, label)
    for (shape, rate), (use, label) in best_link.items():
        print(f"# link use at the largest size, {shape} {rate}: {use:.0%} ({short(label)}; goal >= 80%)")
    for shape, rate, t, cross in summary["crossover"]:
        print(f"# crossover {shape} {rate} {t}: {size_text(cross) if cross is not None else 'none'}")

    if fm:
        print("\n# ===== Fashion-MNIST, 2 hosts x 1 rank (batch 64 per rank, SGD lr 0.05 momentum 0.9) =====")
        fm_rows = []
        for label, r in fm.items():
            try:
                text = pathlib.Path(r["file"]).read_text(errors="replace")
            except FileNotFoundError:
                text = ""
            if "gradwire" in label:
                rates_ = [float(m) for m in re.findall(r"^epoch\s+\d+/\d+ .*samples/s\s+([\d.]+)", text, re.M)]
                accs = [float(m) / 100 for m in re.findall(r"^epoch\s+\d+/\d+ .*test_acc\s+([\d.]+)%", text, re.M)]
            else:
                rates_ = [float(m) for m in re.findall(r"^epoch \d+ .*samples/s total (\d+)", text, re.M)]
                accs = [float(m) for m in re.findall(r"^epoch \d+ .*test_acc ([\d.]+)", text, re.M)]
            sps = len(rates_) / sum(1 / x for x in rates_) if rates_ else None
            acc = accs[-1] if accs else None
            fm_rows.append([label, r["status"], f"{sps:.0f}" if sps else "", f"{acc:.4f}" if acc else "", len(accs),
                            r["seconds"]])
            print(f"  {label:>16}  {r['status']:>8}  samples/s {sps:8.0f}  test_acc {acc:.2%}  epochs {len(accs)}  wall {r['seconds']} s"
                  if sps and acc else f"  {label:>16}  {r['status']}: no epochs reported")
        sp = {row[0]: float(row[2]) for row in fm_rows if row[2]}
        if "fmnist-gradwire" in sp and "fmnist-torch" in sp:
            print(f"# gradwire / torch samples/s: {sp['fmnist-gradwire'] / sp['fmnist-torch']:.2f}x")
        with open(res / "cluster_fmnist.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "status", "samples_per_s", "final_test_accuracy", "epochs", "wall_s"])
            w.writerows(fm_rows)

    if data:
        plot(res / "cluster_allreduce.png", data, order)
    return 0


if __name__ == "__main__":
    sys.exit(main())
