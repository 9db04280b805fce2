"""One rank of PyTorch DDP (gloo, CPU) training the Fashion-MNIST MLP across hosts.

Each rank is started on its own host with torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
(gradwire-run sets them; GLOO_SOCKET_IFNAME names the interface Gloo should use). Two recipes:

--recipe peer (the default; benchmarks/cluster.sh): ../shared/peers/torch_ddp_fmnist.py's own run()
    unchanged (SGD with momentum, standardised pixels, one evaluation per epoch), with only its
    init_process_group pointed at MASTER_ADDR:MASTER_PORT (the peer starts its ranks on 127.0.0.1):

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=198.18.1.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=eth0 \\
        /usr/bin/python3 torch_ddp_fmnist_hosts.py --peer ../shared/peers/torch_ddp_fmnist.py --epochs 2

--recipe gradwire (benchmarks/efficient_hosts.py): examples/fashion_mnist's recipe, so that DDP and
    gradwire train the same model the same way: He-uniform init for the ReLU layers, Glorot-uniform
    for the output layer, zero biases (mlp.hpp); pixels in [0, 1]; Adam (lr 1e-3, PyTorch's and
    gradwire's defaults) with the learning rate decayed by a cosine to 0, set before every step;
    every epoch one permutation shared by all ranks, rank r taking its slice of each global batch,
    the last incomplete global batch dropped; --evals-per-epoch test accuracies per epoch, each rank
    scoring its share of the test set; the clock starts once DDP is built and runs through the
    evaluations, as the example's does (train_loop.hpp). It prints the lines efficient_hosts.py
    reads from the example ("curve ...", "rank 0: N steps: sent X MB/step", "reached 88% ...",
    "final test accuracy ..."). --hook picks DDP's communication hook:
        none        DDP's own all-reduce of its gradient buckets
        fp16        default_hooks.fp16_compress_hook
        powersgd:R  powerSGD_hook.powerSGD_hook, PowerSGDState(matrix_approximation_rank=R,
                    start_powerSGD_iter=10): gradwire's --compress powersgd:R also sends plain
                    sums for its first 10 steps (examples/fashion_mnist/family_compressed.hpp)

    The bytes per step are rank 0's payload counted as gradwire's step_stats counts its ring's:
    2 (n-1)/n of what is all-reduced (gloo's allreduce is a ring too: a reduce-scatter and an
    all-gather, each sending (n-1)/n of the buffer). With a hook, what the hook hands to
    torch.distributed.all_reduce in a step; without one, every gradient once (DDP's reducer
    all-reduces its buckets in C++, out of Python's sight). efficient_hosts.py checks both
    against the bytes host 0's interface sent.
"""
import argparse
import importlib.util
import math
import os
import sys
import time

import torch
import torch.distributed as real_dist

POWERSGD_START = 10  # examples/fashion_mnist/family_compressed.hpp: powersgd_start_step


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer", required=True, help="path of torch_ddp_fmnist.py")
    p.add_argument("--recipe", choices=("peer", "gradwire"), default="peer",
                   help="the peer's training (default) or examples/fashion_mnist's")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, help="default: peer 0.05 (SGD), gradwire 1e-3 (Adam)")
    p.add_argument("--momentum", type=float, default=0.9, help="peer recipe only")
    p.add_argument("--hook", default="none", help="gradwire recipe only: none, fp16 or powersgd:RANK (default none)")
    p.add_argument("--evals-per-epoch", type=int, default=1, help="gradwire recipe only (default 1)")
    p.add_argument("--target", type=float, default=0.88, help="gradwire recipe only: the accuracy to report reaching")
    p.add_argument("--seed", type=int, default=1, help="gradwire recipe only: initialisation and shuffling")
    a = p.parse_args()
    if a.recipe == "peer" and a.hook != "none":
        p.error("--hook needs --recipe gradwire (the peer's run() builds its DDP itself)")
    kind, _, rank = a.hook.partition(":")
    if not (a.hook in ("none", "fp16") or (kind == "powersgd" and rank.isdigit() and int(rank) > 0)):
        p.error(f"--hook: none, fp16 or powersgd:RANK, got '{a.hook}'")
    if a.lr is None:
        a.lr = 0.05 if a.recipe == "peer" else 1e-3
    return a


def load_peer(path):
    spec = importlib.util.spec_from_file_location("torch_ddp_fmnist", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    return peer


class _dist_across_hosts:
    """torch.distributed, except that init_process_group meets at MASTER_ADDR, not 127.0.0.1."""

    def __init__(self, master):
        self.master = master

    def __getattr__(self, name):
        return getattr(real_dist, name)

    def init_process_group(self, backend, rank, world_size):
        real_dist.init_process_group(backend, init_method=self.master, rank=rank, world_size=world_size)


class _counted_all_reduce:
    """torch.distributed.all_reduce, counting the bytes handed to it (the hooks call it by that name)."""

    def __init__(self):
        self.bytes = 0
        self.real = real_dist.all_reduce

    def __call__(self, tensor, *args, **kwargs):
        self.bytes += tensor.numel() * tensor.element_size()
        return self.real(tensor, *args, **kwargs)


def with_hook(model, hook):
    """`model` in DDP with `hook` registered (see the module's comment)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook.startswith("powersgd:"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(hook.split(":")[1]),
                                            start_powerSGD_iter=POWERSGD_START)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp


def gradwire_model(seed):
    """mlp.hpp's layers and initialisation (the values differ: another generator)."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(784, 256), torch.nn.Linear(256, 128), torch.nn.Linear(128, 10)]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            fan_out, fan_in = layer.weight.shape
            bound = math.sqrt(6.0 / (fan_in if i < 2 else fan_in + fan_out))
            layer.weight.uniform_(-bound, bound)
            layer.bias.zero_()
    return torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])


def run_gradwire_recipe(a, peer, rank, world, master):
    torch.set_num_threads(1)  # as the example's --threads 1
    real_dist.init_process_group("gloo", init_method=master, rank=rank, world_size=world)
    pixels = lambda name: torch.from_numpy(peer.idx(name).reshape(-1, 784).astype("float32") / 255.0)  # noqa: E731
    labels = lambda name: torch.from_numpy(peer.idx(name).astype("int64"))  # noqa: E731
    xtr, ytr = pixels("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz")
    xte, yte = pixels("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz")
    test_share = slice(len(yte) * rank // world, len(yte) * (rank + 1) // world)

    counted = _counted_all_reduce()
    if a.hook != "none":
        real_dist.all_reduce = counted  # the hooks' calls, not this file's own (real_all_reduce below)
    real_all_reduce = counted.real
    model = with_hook(gradwire_model(a.seed), a.hook)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    lossf = torch.nn.CrossEntropyLoss()
    global_batch = a.batch * world
    steps = len(ytr) // global_batch
    total_steps = steps * a.epochs
    eval_every = max(1, steps // a.evals_per_epoch) if a.evals_per_epoch > 1 else 0
    ring = 2.0 * (world - 1) / world
    if rank == 0:
        print(f"torch {torch.__version__} DDP (gloo) hook {a.hook}, replicas {world}, optimizer adam, lr {a.lr:g} "
              f"(cosine), batch {a.batch} per replica ({global_batch} global), {steps} steps/epoch, "
              f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)

    reached, elapsed = None, 0.0

    def record(epochs):
        """Every rank's share of the test set scored and summed; rank 0 prints the curve line with the
        seconds since the start, this evaluation included (train_loop.hpp's count)."""
        nonlocal reached, elapsed
        with torch.no_grad():
            correct = torch.tensor([float((model.module(xte[test_share]).argmax(1) == yte[test_share]).sum())],
                                   dtype=torch.float64)
        real_all_reduce(correct)
        accuracy = float(correct) / len(yte)
        elapsed = time.perf_counter() - start
        if rank == 0:
            if reached is None and accuracy >= a.target:
                reached = (epochs, elapsed)
            print(f"curve epochs={epochs:.4f} seconds={elapsed:.6f} accuracy={accuracy:.4f}", flush=True)
        return accuracy

    start = time.perf_counter()
    for epoch in range(1, a.epochs + 1):
        order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(a.seed * 1000003 + epoch))
        epoch_start, loss_sum, sent = time.perf_counter(), 0.0, 0
        for step in range(steps):
            batch = order[step * global_batch + rank * a.batch:][:a.batch]
            for group in opt.param_groups:
                group["lr"] = a.lr * 0.5 * (1.0 + math.cos(math.pi * ((epoch - 1) * steps + step) / total_steps))
            before = counted.bytes
            opt.zero_grad()
            loss = lossf(model(xtr[batch]), ytr[batch])
            loss.backward()  # DDP's all-reduce (or the hook) runs in here
            opt.step()
            sent += ring * (counted.bytes - before if a.hook != "none" else gradient_bytes)
            loss_sum += float(loss)
            if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
                record(epoch - 1 + (step + 1) / steps)
        seconds = time.perf_counter() - epoch_start
        accuracy = record(epoch)
        if rank == 0:
            print(f"epoch {epoch:2d}/{a.epochs}  train_loss {loss_sum / steps:.4f}  test_acc {100 * accuracy:6.2f}%  "
                  f"samples/s {steps * global_batch / seconds:8.0f}  elapsed {elapsed:6.1f} s\n"
                  f"          rank 0: {steps} steps: sent {sent / steps / 1e6:.6g} MB/step (payload)", flush=True)
    if rank == 0:
        if reached:
            print(f"reached {100 * a.target:g}% test accuracy at epoch {reached[0]:.2f}, {reached[1]:.3f} s")
        else:
            print(f"did not reach {100 * a.target:g}% test accuracy in {a.epochs} epochs")
        print(f"final test accuracy {100 * accuracy:.2f}% after {a.epochs} epochs, "
              f"{elapsed:.1f} s of training", flush=True)
    # No teardown: torch 1.13's ProcessGroupGloo destructor joins its worker threads holding the GIL,
    # and a worker freeing a tensor that Python made waits for the GIL; ranks hung at exit that way
    # (the evaluations' all_reduce tensors). The last collective is done; nothing is left to free.
    sys.stdout.flush()
    os._exit(0)


def main():
    a = parse()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"  # read before run() overwrites them
    peer = load_peer(a.peer)
    if a.recipe == "gradwire":
        run_gradwire_recipe(a, peer, rank, world, master)
        return
    peer.dist = _dist_across_hosts(master)
    a.procs = world
    peer.run(rank, a, 0)


if __name__ == "__main__":
    main()
