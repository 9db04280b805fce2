"""PyTorch DDP (gloo) beside benchmarks/overlap (the same model, initialisation, data, batches and settings).

One process per rank with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
GLOO_SOCKET_IFNAME names the interface across hosts); benchmarks/overlap.sh starts the ranks
in the emulated hosts' namespaces. Run with Debian's torch: /usr/bin/python3.

    --mode ddp       (d) DistributedDataParallel (bucket_cap_mb 25 by default): its autograd hooks
                         all-reduce full buckets during backward, optimizer.step() after
    --mode compute   every rank alone (no DDP): forward, backward, optimizer; the ranks meet
                     only before and after the timed steps, so that they compute at the same time

Everything that must match overlap.cpp is defined the same way there: an MLP 784 -> width x
depth -> 10 with ReLU; after torch.manual_seed(seed) each Linear's weight, then bias, drawn
uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) in order; pixels standardised through one 256-entry
table built in float64 from the training set's byte histogram (mean, unbiased std); step k of
rank r trains on samples (k * world + r) * batch onwards (wrapping); SGD with momentum, the
gradient averaged over ranks; gradients zeroed in place (1.13's zero_grad default). A step's
time runs from zero_grad to the end of optimizer.step() (DDP waits for its last bucket inside
backward, so the part after backward is the optimizer's); the batch is filled before. Rank 0
prints the median step time, the loss and accuracy on the first --eval test samples and the
parameters' checksums, and appends one CSV row (the columns overlap.cpp writes).
"""
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

FEATURES, CLASSES = 784, 10
HEADER = ("impl,mode,world,params,batch,warmup,steps,threads,step_ms_median,step_ms_p10,step_ms_p90,"
          "samples_per_s,eval_loss,eval_acc,init_checksum,final_checksum,after_backward_ms_median")


def idx(path):
    with gzip.open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = [struct.unpack(">I", f.read(4))[0] for _ in range(magic & 0xFF)]
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


class Data:
    def __init__(self, folder):
        self.train = idx(os.path.join(folder, "train-images-idx3-ubyte.gz")).reshape(-1, FEATURES)
        self.train_labels = idx(os.path.join(folder, "train-labels-idx1-ubyte.gz")).astype(np.int64)
        self.test = idx(os.path.join(folder, "t10k-images-idx3-ubyte.gz")).reshape(-1, FEATURES)
        self.test_labels = idx(os.path.join(folder, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
        # Mean and unbiased std from the byte histogram, summed in the order overlap.cpp sums them.
        count = np.bincount(self.train.ravel(), minlength=256).astype(np.float64)
        n = float(self.train.size)
        mean = 0.0
        for v in range(256):
            mean += count[v] * (v / 255.0)
        mean /= n
        var = 0.0
        for v in range(256):
            var += count[v] * (v / 255.0 - mean) * (v / 255.0 - mean)
        sd = (var / (n - 1)) ** 0.5
        self.table = np.array([(v / 255.0 - mean) / sd for v in range(256)], dtype=np.float64).astype(np.float32)

    def fill(self, images, labels, first, x, y):
        """Samples first, first + 1, ... (wrapping) into the tensors x and y."""
        rows = np.arange(first, first + x.shape[0]) % labels.shape[0]
        x.copy_(torch.from_numpy(self.table[images[rows]]))
        y.copy_(torch.from_numpy(labels[rows]))


def make_model(width, depth, seed):
    torch.manual_seed(seed)
    layers, fan_in = [], FEATURES
    for _ in range(depth):
        layers += [nn.Linear(fan_in, width), nn.ReLU()]
        fan_in = width
    layers.append(nn.Linear(fan_in, CLASSES))
    model = nn.Sequential(*layers)
    # Re-drawn explicitly in parameter order, as overlap.cpp does.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                bound = 1.0 / m.in_features ** 0.5
                m.weight.uniform_(-bound, bound)
                m.bias.uniform_(-bound, bound)
    return model


def checksum(model):
    with torch.no_grad():
        return sum(float(p.to(torch.float64).sum()) for p in model.parameters())


def percentile(v, q):
    v = sorted(v)
    if not v:
        return 0.0
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["ddp", "compute"], default="ddp")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval", type=int, default=2000)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (its default: 25)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--csv", default="")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        init = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)

    data = Data(a.data)
    model = make_model(a.width, a.depth, a.seed)
    init_sum = checksum(model)
    elements = sum(p.numel() for p in model.parameters())
    net = model
    if a.mode == "ddp" and world > 1:
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    # Gradients exist (and are pre-faulted) before the first step, as in overlap.cpp.
    for q in model.parameters():
        q.grad = torch.zeros_like(q)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    lossf = nn.CrossEntropyLoss()
    x = torch.empty(a.batch, FEATURES)
    y = torch.empty(a.batch, dtype=torch.int64)

    if a.mode == "compute" and world > 1:
        dist.barrier()
    ms, after = [], []
    for k in range(a.warmup + a.steps):
        data.fill(data.train, data.train_labels, (k * world + rank) * a.batch, x, y)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        lossf(net(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if k >= a.warmup:
            ms.append((t2 - t0) * 1e3)
            after.append((t2 - t1) * 1e3)
    if a.mode == "compute" and world > 1:
        dist.barrier()

    if rank == 0:
        n = min(a.eval, data.test_labels.shape[0])
        xe = torch.empty(n, FEATURES)
        ye = torch.empty(n, dtype=torch.int64)
        data.fill(data.test, data.test_labels, 0, xe, ye)
        with torch.no_grad():
            out = model(xe)
            loss = float(lossf(out, ye))
            acc = float((out.argmax(1) == ye).to(torch.float64).mean())
        final_sum = checksum(model)
        median, p10, p90 = percentile(ms, 0.5), percentile(ms, 0.1), percentile(ms, 0.9)
        after_median = percentile(after, 0.5)
        samples = 1e3 * world * a.batch / median if median > 0 else 0.0
        impl = "torch_ddp" if a.mode == "ddp" else "torch"
        print(f"# overlap {impl} {a.mode}: {world} rank(s), {elements} parameters ({4e-6 * elements:.1f} MB of "
              f"gradients), batch {a.batch} per rank, {a.warmup}+{a.steps} steps", flush=True)
        print(f"# step time median {median:.1f} ms (p10 {p10:.1f}, p90 {p90:.1f}; after backward {after_median:.1f}), "
              f"{samples:.1f} samples/s; "
              f"eval loss {loss:.6f} acc {acc:.4f}; checksum init {init_sum:.9e} final {final_sum:.9e}", flush=True)
        if a.csv:
            fresh = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
            with open(a.csv, "a") as f:
                if fresh:
                    f.write(HEADER + "\n")
                f.write(f"{impl},{a.mode},{world},{elements},{a.batch},{a.warmup},{a.steps},{a.threads},"
                        f"{median:.3f},{p10:.3f},{p90:.3f},{samples:.2f},{loss:.6f},{acc:.4f},"
                        f"{init_sum:.9e},{final_sum:.9e},{after_median:.3f}\n")
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
