#!/usr/bin/env python3
"""PyTorch's kernels for the operations of benchmarks/kernels_cuda.cu, on the same GPU.

    kernels_cuda_torch.py [--min 1M] [--max 256M] [--factor 4] [--iters 20] [--warmup 3] [-k 8] [--csv FILE]

float32 tensors of n elements, n from --min to --max (K/M/G binary suffixes), times --factor.
Every operation is timed with CUDA events, one pair per launch, after --warmup untimed
launches; the time is the median of --iters launches (the upper one of the middle two for an
even count, as kernels_cuda does). bytes is what the operation must read and write at least,
the same count as kernels_cuda's, so GB/s and %copy (GB/s over torch's own device-to-device
copy at that size) compare across the two tables. The flags -b -e -f -n -w are kernels_cuda's
names for the same settings; flags this script does not know are ignored with a note, so
benchmarks/kernels_cuda.sh can pass one set of flags to both.

Without PyTorch, or without a CUDA device, prints one line and exits 0 (with --csv, the file
holds only the header). Never fails on time; there is no check of results here (#wrong = 0).
"""
import argparse
import csv
import sys

SKIPPED = "# PyTorch with CUDA not available here: skipped"
CSV_HEADER = ["device", "elements", "kernel", "time_us", "bytes", "gbs", "fraction_of_copy", "thrust_us", "wrong"]
DEVICE = "cuda"
KERNEL_WIDTH = 42


def count(text):
    """An element count with an optional K, M or G (binary) suffix."""
    shifts = {"k": 10, "m": 20, "g": 30}
    t = text.strip()
    shift = shifts.get(t[-1:].lower(), 0)
    digits = t[:-1] if shift else t
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"not a count: {text}")
    return int(digits) << shift


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min", "-b", type=count, default=1 << 20, help="smallest size, elements (default 1M)")
    p.add_argument("--max", "-e", type=count, default=1 << 28, help="largest size, elements (default 256M)")
    p.add_argument("--factor", "-f", type=count, default=4, help="size multiplier (default 4)")
    p.add_argument("--iters", "-n", type=count, default=20, help="timed launches per kernel (default 20)")
    p.add_argument("--warmup", "-w", type=count, default=3, help="untimed launches first (default 3)")
    p.add_argument("-k", type=count, default=8, help="buffers summed (default 8)")
    p.add_argument("--csv", help="also write CSV (kernels_cuda's columns)")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"# kernels_cuda_torch.py: ignoring flags {' '.join(unknown)}", file=sys.stderr)
    if args.min < 1 or args.factor < 2 or args.iters < 1 or args.k < 1:
        p.error("need --min > 0, --factor >= 2, --iters >= 1 and -k >= 1")
    return args


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(CSV_HEADER)
        w.writerows(rows)


def main(argv):
    args = parse(argv)
    try:
        import torch
        available = torch.cuda.is_available()
    except Exception:  # ImportError, or a broken installation
        available = False
    if not available:
        print(SKIPPED, flush=True)
        if args.csv:
            write_csv(args.csv, [])
        return 0

    # torch >= 1.13 raises torch.cuda.OutOfMemoryError; older ones a RuntimeError saying so.
    oom_type = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)

    def is_oom(e):
        return isinstance(e, oom_type) and (oom_type is not RuntimeError or "out of memory" in str(e))

    def median_us(fn):
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e3)  # ms -> us
        times.sort()
        return times[len(times) // 2]

    def adam_us(**kind):
        """opt.step() of Adam over one parameter of n elements whose .grad is set."""
        p = torch.zeros(n, device=DEVICE, requires_grad=True)
        p.grad = torch.empty(n, device=DEVICE).uniform_(-1, 1)
        opt = torch.optim.Adam([p], lr=1e-3, **kind)
        # torch does not fuse the average into the step: gradwire's average+adam k=1 scales
        # the gradient by 1/N inside its step, here the (unneeded) scaling is left out, which
        # favours torch by one read and one write of the gradient.
        us = median_us(opt.step)
        del opt, p
        return us

    device_name = torch.cuda.get_device_name()
    k = args.k
    csv_rows = []
    print(f"# kernels_cuda_torch: {device_name}, torch {torch.__version__}, float32, {k} buffers summed, "
          f"median of {args.iters} launches", flush=True)
    print(f"# {'size':>12} {'kernel':<{KERNEL_WIDTH}} {'time(us)':>10} {'bytes':>12} {'GB/s':>8} {'%copy':>7}",
          flush=True)
    torch.manual_seed(12345)

    n = args.min
    while n <= args.max:
        size = n * 4
        copy_gbs = None
        grads = dst = out = x = y = None

        def emit(kernel, us, nbytes):
            nonlocal copy_gbs
            gbs = nbytes / (us * 1e3)
            if copy_gbs is None:
                copy_gbs = gbs  # the first row of a size is the copy
            print(f"  {n:12d} {kernel:<{KERNEL_WIDTH}} {us:10.1f} {nbytes:12.0f} {gbs:8.1f} {100 * gbs / copy_gbs:6.1f}%",
                  flush=True)
            csv_rows.append([device_name, n, kernel, f"{us:.3f}", f"{nbytes:.0f}", f"{gbs:.3f}",
                             f"{gbs / copy_gbs:.4f}", "0.000", 0])

        kernel = "copy"
        try:
            grads = [torch.empty(n, device=DEVICE).uniform_(-1, 1) for _ in range(k)]
            dst = torch.empty(n, device=DEVICE)
            emit(kernel, median_us(lambda: dst.copy_(grads[0])), 2.0 * size)
            del dst

            # The stack writes and reads k * n more than an ideal k-way sum moves: that is the point.
            kernel = f"sum k={k} (torch.stack(...).sum(0))"
            emit(kernel, median_us(lambda: torch.stack(grads).sum(0)), (k + 1.0) * size)

            out = torch.empty(n, device=DEVICE)

            def add_loop():
                out.zero_()
                for g in grads:
                    out.add_(g)

            kernel = f"sum k={k} (add_ loop)"
            emit(kernel, median_us(add_loop), (k + 1.0) * size)
            del out

            x, y = grads[0], grads[1 % k]
            kernel = "scale (_foreach_mul_)"
            emit(kernel, median_us(lambda: torch._foreach_mul_([x], 0.999)), 2.0 * size)
            kernel = "axpy (_foreach_add_ alpha)"
            emit(kernel, median_us(lambda: torch._foreach_add_([y], [x], alpha=1e-3)), 3.0 * size)
            del x, y, grads

            kernel = "average+adam k=1 (Adam fused=True)"
            try:
                us = adam_us(fused=True)
            except Exception as e:  # a torch without fused Adam; out of memory is not that
                if is_oom(e):
                    raise
                print(f"# Adam(fused=True) failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                      f"foreach=True instead", flush=True)
                kernel = "average+adam k=1 (Adam foreach, fused n/a)"
                us = adam_us(foreach=True)
            emit(kernel, us, 7.0 * size)
            kernel = "average+adam k=1 (Adam foreach=True)"
            emit(kernel, adam_us(foreach=True), 7.0 * size)
        except Exception as e:
            if not is_oom(e):
                raise
            print(f"# {n} elements: CUDA out of memory at {kernel}: the rest of this size skipped", flush=True)
        grads = dst = out = x = y = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        n *= args.factor

    if args.csv:
        write_csv(args.csv, csv_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
