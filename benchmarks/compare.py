#!/usr/bin/env python3
"""Gradwire beside the peer baselines, over rounds of sweeps that alternated in one run.

    compare.py --rounds results/allreduce_rounds [--label gradwire] [--csv out.csv] [--plot out.png]
    compare.py --ours results/allreduce_inproc.csv --peers results/peers [...]   (one round)

--rounds is a directory with one subdirectory per round (r1, r2, ...), each holding the
CSVs gradwire's benchmarks wrote in that round (bench_table.hpp; one or more variants,
told apart by their transport and algorithm columns) and the peers' nccl-tests-style
tables of the same round (../shared/peers, one file per peer and rank count, named
PEER_N.txt), and optionally load.txt (the load average when the round began).
--ours and --peers give one round by hand.

For every gradwire variant, rank count and size measured by a peer too, prints
nccl-tests-style columns for gradwire (size, count, time, algbw, busbw: the median over
rounds) and for each peer its median time and busbw over rounds and x = peer time /
gradwire time, taken within each round (both ran minutes apart at most), as the median
over rounds and its range [min-max] (above 1: gradwire faster). A minute of noise moves
one round's ratio, not the median of several. --csv writes the same per row.
--plot draws median busbw against size, one panel per rank count (needs matplotlib).
"""
import argparse
import csv
import pathlib
import re
import statistics
import sys


def read_ours(path, into):
    """Adds {variant: {ranks: {bytes: time_us}}} from a gradwire benchmark CSV to `into`."""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            variant = f'{row["transport"]} {row["algorithm"]}'
            into.setdefault(variant, {}).setdefault(int(row["ranks"]), {})[int(row["size_bytes"])] = float(
                row["time_us"])


def read_peer(path):
    """(ranks, {bytes: time_us}) from a peer's table; None if it holds no rows."""
    ranks, rows = None, {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("#"):
            m = re.search(r"nranks\s+(\d+)", line)
            if m:
                ranks = int(m.group(1))
            continue
        fields = line.split()
        if len(fields) >= 6 and fields[0].isdigit():
            rows[int(fields[0])] = float(fields[2])
    return (ranks, rows) if ranks and rows else None


def read_round(csvs, peer_dir):
    """One round: ({variant: {ranks: {bytes: us}}}, {ranks: {peer: {bytes: us}}})."""
    ours, peers = {}, {}
    for c in csvs:
        read_ours(c, ours)
    if peer_dir is not None:
        for p in sorted(pathlib.Path(peer_dir).glob("*_[0-9]*.txt")):
            parsed = read_peer(p)
            if parsed is None:
                print(f"# {p}: no results (the peer failed or timed out; see the file)", file=sys.stderr)
                continue
            ranks, rows = parsed
            peers.setdefault(ranks, {})[p.stem.rsplit("_", 1)[0]] = rows
    return ours, peers


def bus_factor(n):
    return 2 * (n - 1) / n if n > 1 else 0.0


def gbps(nbytes, us):
    return nbytes / (us * 1e3) if us > 0 else 0.0


def fmt_x(x):
    """A ratio in at most 5 characters, with 3 significant digits where they fit."""
    return f"{x:.0f}" if x >= 99.5 else f"{x:.1f}" if x >= 9.995 else f"{x:.2f}" if x >= 0.0995 else f"{x:.3f}"


def summary(values):
    """(median, min, max) of a non-empty list."""
    return statistics.median(values), min(values), max(values)


def plot(path, ours_median, peers_median, label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# --plot: matplotlib is not installed (Debian: python3-matplotlib)", file=sys.stderr)
        return
    rank_counts = sorted({r for by_ranks in ours_median.values() for r in by_ranks})
    if not rank_counts:
        return
    fig, axes = plt.subplots(1, len(rank_counts), figsize=(6.5 * len(rank_counts), 4.5), squeeze=False)
    for ax, ranks in zip(axes[0], rank_counts):
        for variant, by_ranks in sorted(ours_median.items()):
            rows = by_ranks.get(ranks, {})
            sizes = [s for s in sorted(rows) if s > 0]
            ax.plot(sizes, [gbps(s, rows[s]) * bus_factor(ranks) for s in sizes], marker="o", linewidth=2,
                    label=f"{label} {variant}")
        for name, rows in sorted(peers_median.get(ranks, {}).items()):
            sizes = [s for s in sorted(rows) if s > 0]
            ax.plot(sizes, [gbps(s, rows[s]) * bus_factor(ranks) for s in sizes], marker=".", linestyle="--",
                    label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s), median over rounds")
        ax.set_title(f"all-reduce, float32 sum, {ranks} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", help="directory of rounds r1, r2, ... (see above)")
    ap.add_argument("--ours", action="append", default=[], help="a gradwire CSV (one round; may repeat)")
    ap.add_argument("--peers", help="the peers' tables of that round")
    ap.add_argument("--label", default="gradwire")
    ap.add_argument("--csv")
    ap.add_argument("--plot")
    a = ap.parse_args()

    rounds, loads = [], []  # rounds[i] = (ours, peers)
    if a.rounds:
        dirs = sorted((d for d in pathlib.Path(a.rounds).iterdir() if d.is_dir() and re.fullmatch(r"r\d+", d.name)),
                      key=lambda d: int(d.name[1:]))
        for d in dirs:
            rounds.append(read_round(sorted(d.glob("*.csv")), d))
            load = d / "load.txt"
            loads.append(load.read_text().strip() if load.exists() else "?")
    elif a.ours:
        rounds.append(read_round(a.ours, a.peers))
    else:
        ap.error("give --rounds DIR, or --ours CSV [--peers DIR]")
    if not rounds:
        print(f"compare.py: no rounds (r1, r2, ...) under {a.rounds}", file=sys.stderr)
        return 1
    if any(l != "?" for l in loads):
        print("# load average at the start of each round: " +
              "; ".join(f"r{i + 1}: {l}" for i, l in enumerate(loads)))

    variants = sorted({v for ours, _ in rounds for v in ours})
    peer_names = sorted({p for _, peers in rounds for by_peer in peers.values() for p in by_peer})

    def ours_times(v, n, s):
        return [ours[v][n][s] for ours, _ in rounds if s in ours.get(v, {}).get(n, {})]

    def peer_times(p, n, s):
        return [peers[n][p][s] for _, peers in rounds if s in peers.get(n, {}).get(p, {})]

    def ratios(v, p, n, s):  # within each round that measured both
        out = []
        for ours, peers in rounds:
            t, pt = ours.get(v, {}).get(n, {}).get(s), peers.get(n, {}).get(p, {}).get(s)
            if t and pt:
                out.append(pt / t)
        return out

    writer = None
    if a.csv:
        out = open(a.csv, "w", newline="")
        writer = csv.writer(out)
        writer.writerow(["ranks", "size_bytes", "count", "ours", "ours_time_us", "ours_algbw_gbps", "ours_busbw_gbps",
                         "ours_time_us_min", "ours_time_us_max", "ours_rounds", "peer", "peer_time_us",
                         "peer_busbw_gbps", "peer_rounds", "speedup_median", "speedup_min", "speedup_max",
                         "paired_rounds"])
    ours_median, peers_median = {}, {}
    for v in variants:
        label = v if v.split()[0] == a.label else f"{a.label} {v}"  # "inproc auto", not "inproc inproc auto"
        for n in sorted({n for ours, _ in rounds for n in ours.get(v, {})}):
            sizes = sorted({s for ours, _ in rounds for s in ours.get(v, {}).get(n, {})})
            named = [p for p in peer_names if any(p in peers.get(n, {}) for _, peers in rounds)]
            print(f"# {label} vs peers, {n} ranks, float32 sum all-reduce, {len(rounds)} round(s); time: median over "
                  f"rounds; x = peer time / {label} time in the same round: median [min-max] (above 1: "
                  f"{label} faster)")
            head1 = f"# {'':>10} {'':>10} {'':>10} {'':>7} {'':>7}"
            head2 = f"# {'size(B)':>10} {'count':>10} {'time(us)':>10} {'algbw':>7} {'busbw':>7}"
            for p in named:
                head1 += f" | {p[:38]:^38}"
                head2 += f" | {'time(us)':>10} {'busbw':>7} {'x':>5} {'[min-max]':>13}"
            print(head1)
            print(head2)
            for s in sizes:
                t_med, t_min, t_max = summary(ours_times(v, n, s))
                ours_median.setdefault(v, {}).setdefault(n, {})[s] = t_med
                alg = gbps(s, t_med)
                line = f"  {s:10d} {s // 4:10d} {t_med:10.2f} {alg:7.3f} {alg * bus_factor(n):7.3f}"
                for p in named:
                    pts, xs = peer_times(p, n, s), ratios(v, p, n, s)
                    if not pts:
                        line += f" | {'-':>10} {'-':>7} {'-':>5} {'':>13}"
                        continue
                    pt = statistics.median(pts)
                    peers_median.setdefault(n, {}).setdefault(p, {})[s] = pt
                    pbw = gbps(s, pt) * bus_factor(n)
                    if xs:
                        x_med, x_min, x_max = summary(xs)
                        line += f" | {pt:10.2f} {pbw:7.3f} {fmt_x(x_med):>5} {f'[{fmt_x(x_min)}-{fmt_x(x_max)}]':>13}"
                    else:
                        x_med = x_min = x_max = float("nan")
                        line += f" | {pt:10.2f} {pbw:7.3f} {'-':>5} {'':>13}"
                    if writer:
                        writer.writerow([n, s, s // 4, label, f"{t_med:.3f}", f"{alg:.4f}", f"{alg * bus_factor(n):.4f}",
                                         f"{t_min:.3f}", f"{t_max:.3f}", len(ours_times(v, n, s)), p, f"{pt:.3f}",
                                         f"{pbw:.4f}", len(pts), f"{x_med:.3f}", f"{x_min:.3f}", f"{x_max:.3f}",
                                         len(xs)])
                print(line)
            print("#")
    if a.plot:
        plot(a.plot, ours_median, peers_median, a.label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
