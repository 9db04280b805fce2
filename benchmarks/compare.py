#!/usr/bin/env python3
"""Side-by-side table of a gradwire benchmark and the peer baselines measured in the same run.

    compare.py --ours results/allreduce_inproc.csv --peers results/peers [--csv out.csv] [--plot out.png]

--ours is the CSV a gradwire benchmark writes (bench_table.hpp); --peers is a directory of
nccl-tests-style tables printed by ../shared/peers (one file per peer and rank count,
named PEER_N.txt). For every rank count and size both measured, prints our time and
busbw, each peer's busbw, and the ratio peer time / our time (above 1: gradwire is faster).
A CSV holding several algorithms (ring, halving_doubling, auto) gets one block each.
--plot draws busbw against size, one panel per rank count (needs matplotlib).
"""
import argparse
import csv
import pathlib
import re
import sys


def read_ours(path):
    """{"transport algorithm": {ranks: {bytes: (time_us, busbw)}}} from a gradwire benchmark CSV."""
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(f'{row["transport"]} {row["algorithm"]}', {}).setdefault(int(row["ranks"]), {})[int(row["size_bytes"])] = (
                float(row["time_us"]), float(row["busbw_gbps"]))
    return out


def plot(path, ours, peers, label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# --plot: matplotlib is not installed (Debian: python3-matplotlib)", file=sys.stderr)
        return
    rank_counts = sorted({r for by_ranks in ours.values() for r in by_ranks})
    fig, axes = plt.subplots(1, len(rank_counts), figsize=(6.5 * len(rank_counts), 4.5), squeeze=False)
    for ax, ranks in zip(axes[0], rank_counts):
        for algorithm, by_ranks in sorted(ours.items()):
            rows = by_ranks.get(ranks, {})
            sizes = [s for s in sorted(rows) if s > 0]
            ax.plot(sizes, [rows[s][1] for s in sizes], marker="o", linewidth=2,
                    label=f"{label} {algorithm}" if len(ours) > 1 else label)
        for name, rows in peers.get(ranks, []):
            sizes = [s for s in sorted(rows) if s > 0]
            ax.plot(sizes, [rows[s][1] for s in sizes], marker=".", linestyle="--", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"all-reduce, float32 sum, {ranks} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"# plot: {path}")


def read_peer(path):
    """(ranks, {bytes: (time_us, busbw)}) from a peer's table; None if it holds no rows."""
    ranks, rows = None, {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("#"):
            m = re.search(r"nranks\s+(\d+)", line)
            if m:
                ranks = int(m.group(1))
            continue
        fields = line.split()
        if len(fields) >= 6 and fields[0].isdigit():
            rows[int(fields[0])] = (float(fields[2]), float(fields[4]))
    return (ranks, rows) if ranks and rows else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--label", default="gradwire")
    ap.add_argument("--peers", required=True)
    ap.add_argument("--csv")
    ap.add_argument("--plot")
    a = ap.parse_args()

    ours = read_ours(a.ours)
    peers = {}  # ranks -> [(name, rows)]
    for p in sorted(pathlib.Path(a.peers).glob("*_[0-9]*.txt")):
        parsed = read_peer(p)
        if parsed is None:
            print(f"# {p.name}: no results (the peer failed or timed out; see the file)", file=sys.stderr)
            continue
        ranks, rows = parsed
        peers.setdefault(ranks, []).append((p.stem.rsplit("_", 1)[0], rows))

    writer = None
    if a.csv:
        out = open(a.csv, "w", newline="")
        writer = csv.writer(out)
        writer.writerow(["ranks", "size_bytes", "ours", "ours_time_us", "ours_busbw_gbps", "peer", "peer_time_us",
                         "peer_busbw_gbps", "speedup"])
    for algorithm, by_ranks in sorted(ours.items()):
        label = f"{a.label} {algorithm}" if len(ours) > 1 else a.label
        for ranks in sorted(by_ranks):
            named = peers.get(ranks, [])
            if not named:
                print(f"# {ranks} ranks: no peer results to compare with")
                continue
            mine = by_ranks[ranks]
            sizes = sorted(s for s in mine if any(s in rows for _, rows in named))
            print(f"# {label} vs peers, {ranks} ranks, float32 sum all-reduce; busbw in GB/s; "
                  f"x = peer time / {label} time (above 1: {label} faster)")
            head = f"# {'size(B)':>10} {'time(us)':>10} {'busbw':>7}"
            for name, _ in named:
                head += f" | {name[:16]:>16} {'x':>6}"
            print(head)
            for s in sizes:
                t, bw = mine[s]
                line = f"  {s:10d} {t:10.2f} {bw:7.3f}"
                for name, rows in named:
                    if s in rows:
                        pt, pbw = rows[s]
                        speedup = pt / t if t > 0 else float("nan")
                        line += f" | {pbw:16.3f} {speedup:6.2f}"
                        if writer:
                            writer.writerow([ranks, s, label, f"{t:.3f}", f"{bw:.4f}", name, f"{pt:.3f}",
                                             f"{pbw:.4f}", f"{speedup:.3f}"])
                    else:
                        line += f" | {'-':>16} {'-':>6}"
                print(line)
            print("#")
    if a.plot:
        plot(a.plot, ours, peers, a.label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
