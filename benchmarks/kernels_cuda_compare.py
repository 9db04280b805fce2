#!/usr/bin/env python3
"""gradwire's CUDA kernels beside PyTorch's on the same GPU, from the two CSVs of one run.

    kernels_cuda_compare.py --ours results/kernels_cuda.csv --torch results/kernels_cuda_torch.csv [--csv out.csv]

Both CSVs have kernels_cuda's columns (device,elements,kernel,time_us,bytes,gbs,
fraction_of_copy,thrust_us,wrong). For every size both measured, pairs each of our kernels
with PyTorch's rows for the same operation: a torch kernel named OURS (...) (for instance
ours "sum k=8" with "sum k=8 (torch.stack(...).sum(0))" and "sum k=8 (add_ loop)", ours
"average+adam k=1" with both Adam rows), and our cudaMemcpy copy with torch's copy (the two
copies should agree: a check that both runs saw the same GPU). x = torch time / our time
(above 1: gradwire is faster); %copy is each side's GB/s over its own copy at that size.
Then the targets at the largest size. Never fails on time; without PyTorch figures, prints
one line, writes only the CSV's header and exits 0.
"""
import argparse
import csv
import sys

OUR_COPY, TORCH_COPY = "copy (cudaMemcpy d2d)", "copy"
KERNEL_WIDTH = 42
CSV_FIELDS = ["device", "elements", "gradwire_kernel", "gradwire_us", "gradwire_fraction_of_copy", "torch_kernel",
              "torch_us", "torch_fraction_of_copy", "torch_over_gradwire"]


def read(path):
    """(devices, {elements: {kernel: row}}) from a kernels_cuda CSV; (set(), {}) if missing or empty."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (FileNotFoundError, IsADirectoryError):
        return set(), {}
    table = {}
    for r in rows:
        table.setdefault(int(r["elements"]), {})[r["kernel"]] = r  # a repeated row: the last one counts
    return {r["device"] for r in rows}, table


def pairs(ours, torch):
    """[(our kernel, torch kernel)] for one size, in our table's order."""
    out = []
    for kernel in ours:
        if kernel == OUR_COPY:
            matches = [TORCH_COPY] if TORCH_COPY in torch else []
        else:
            matches = [t for t in torch if t.startswith(kernel + " (")]
        out.extend((kernel, t) for t in matches)
    return out


def compare(our_devices, our_table, torch_devices, torch_table, out_rows):
    """Prints the ratio table and the targets; appends the CSV rows to out_rows."""
    devices = sorted(our_devices | torch_devices)
    print(f"# gradwire CUDA kernels beside PyTorch on {', '.join(devices)}, float32, same run")
    if len(devices) > 1:
        print("# warning: the two CSVs name different devices: the ratios compare different GPUs")
    print("# x = torch time / gradwire time (above 1: gradwire is faster); %copy = GB/s over the same side's "
          "device-to-device copy at that size")
    print(f"# {'size':>12} {'gradwire kernel':<22} {'time(us)':>10} {'%copy':>7}  "
          f"{'torch kernel':<{KERNEL_WIDTH}} {'time(us)':>10} {'%copy':>7} {'x':>7}")
    sizes = sorted(set(our_table) & set(torch_table))
    for n in sizes:
        ours, torch = our_table[n], torch_table[n]
        for mine, theirs in pairs(ours, torch):
            a, b = ours[mine], torch[theirs]
            us_a, us_b = float(a["time_us"]), float(b["time_us"])
            fa, fb = float(a["fraction_of_copy"]), float(b["fraction_of_copy"])
            x = us_b / us_a if us_a > 0 else float("nan")
            print(f"  {n:12d} {mine:<22} {us_a:10.1f} {100 * fa:6.1f}%  {theirs:<{KERNEL_WIDTH}} {us_b:10.1f} "
                  f"{100 * fb:6.1f}% {x:7.2f}")
            out_rows.append({"device": a["device"], "elements": n, "gradwire_kernel": mine, "gradwire_us": a["time_us"],
                             "gradwire_fraction_of_copy": a["fraction_of_copy"], "torch_kernel": theirs,
                             "torch_us": b["time_us"], "torch_fraction_of_copy": b["fraction_of_copy"],
                             "torch_over_gradwire": f"{x:.4f}"})
    if not sizes:
        print("# the two CSVs have no size in common: no ratios")

    # The targets, at the largest size both measured (bandwidth-bound there); informational only.
    if sizes:
        n = sizes[-1]
        ours, torch = our_table[n], torch_table[n]
        notes = []

        def met(ok):
            return "met" if ok else "NOT met"

        adam = ours.get("average+adam k=1")
        if adam:
            f = float(adam["fraction_of_copy"])
            notes.append(f"average+adam k=1 at {100 * f:.1f}% of copy (target >= 90%): {met(f >= 0.9)}")
            fused = torch.get("average+adam k=1 (Adam fused=True)")
            if fused:
                x = float(fused["time_us"]) / float(adam["time_us"])
                notes.append(f"{x:.2f}x Adam(fused=True) (target >= 1.0x): {met(x >= 1.0)}")
        for kernel, row in ours.items():
            if kernel.startswith("sum k="):
                f = float(row["fraction_of_copy"])
                notes.append(f"{kernel} at {100 * f:.1f}% of copy (target >= 90%): {met(f >= 0.9)}")
        if notes:
            print(f"# targets at {n} elements: " + "; ".join(notes))

    wrong = sum(int(r.get("wrong") or 0) for rows in our_table.values() for r in rows.values())
    print(f"# #wrong (gradwire, all sizes): {wrong}")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", required=True, help="CSV written by kernels_cuda --csv")
    p.add_argument("--torch", required=True, help="CSV written by kernels_cuda_torch.py --csv")
    p.add_argument("--csv", help="also write the ratios as CSV")
    args = p.parse_args(argv)

    torch_devices, torch_table = read(args.torch)
    our_devices, our_table = read(args.ours)
    out_rows = []
    if not torch_table:
        print("# no PyTorch figures: ratios skipped")
    elif not our_table:
        print(f"# no gradwire figures in {args.ours}: ratios skipped")
    else:
        compare(our_devices, our_table, torch_devices, torch_table, out_rows)
    if args.csv:  # only the header when there is nothing to compare, so no stale rows survive
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
            w.writeheader()
            w.writerows(out_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
