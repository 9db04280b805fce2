"""One rank of ../shared/peers/torch_ddp_fmnist.py's training across hosts (benchmarks/cluster.sh).

The peer starts its ranks itself with torch.multiprocessing on 127.0.0.1; across hosts each rank is
started on its own host instead, with torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
(and GLOO_SOCKET_IFNAME naming the interface Gloo should use). This runs the peer's own run()
unchanged, with only its init_process_group pointed at MASTER_ADDR:MASTER_PORT:

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=198.18.1.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=eth0 \
        /usr/bin/python3 torch_ddp_fmnist_hosts.py --peer ../shared/peers/torch_ddp_fmnist.py --epochs 2
"""
import argparse
import importlib.util
import os

import torch.distributed as real_dist

p = argparse.ArgumentParser()
p.add_argument("--peer", required=True, help="path of torch_ddp_fmnist.py")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--momentum", type=float, default=0.9)
a = p.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
master = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"  # read before run() overwrites them

spec = importlib.util.spec_from_file_location("torch_ddp_fmnist", a.peer)
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)


class _dist_across_hosts:
    """torch.distributed, except that init_process_group meets at MASTER_ADDR, not 127.0.0.1."""

    def __getattr__(self, name):
        return getattr(real_dist, name)

    def init_process_group(self, backend, rank, world_size):
        real_dist.init_process_group(backend, init_method=master, rank=rank, world_size=world_size)


peer.dist = _dist_across_hosts()
a.procs = world
peer.run(rank, a, 0)
