#!/usr/bin/env python3
"""per_peer<ucx, asio_tcp> across hosts: correctness, and which bytes cross the network.

    test_per_peer.py loopback   SCRIPTS MP_WORKER_PER_PEER PER_PEER_WORKER
    test_per_peer.py namespaces SCRIPTS MP_WORKER_PER_PEER PER_PEER_WORKER

loopback: hosts told apart by GRADWIRE_HOST_ID per rank (2 hosts x 2 ranks; 3 hosts with
1, 2, 3 ranks): every collective of mp_worker against float64; ring all-reduces, whose
intra-host steps must travel through UCX (Intra) and inter-host steps through TCP (Inter);
a killed rank and a collective mismatch reported by every other rank.
namespaces (root; exits 77 otherwise): 2 emulated hosts x 2 ranks (scripts/cluster):
the same collectives, and the bytes on each host's link are the inter-host bytes the
ring must send (UCX left to itself would take shared memory past the link: see
docs/transports.md, "Per peer"). Every run is bounded in time.
"""
import os
import re
import secrets
import socket
import subprocess
import sys

RUN_TIMEOUT_S = 120
COUNT = 1 << 20  # floats per all-reduce: 4 MiB
REPEATS = 3
PASS_RE = re.compile(r"rank (\d+): PASS host (\d+) of (\d+) local (\d+)/(\d+) intra_sent (\d+) inter_sent (\d+)")


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(placement, prog_args, launch, master_addr):
    """Starts one process per rank of `placement` with torchrun-style variables; returns the Popens."""
    port, token = free_port(), secrets.token_hex(8)
    hosts = sorted(set(placement))
    procs = []
    for rank, host in enumerate(placement):
        local = [r for r, h in enumerate(placement) if h == host]
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(placement)), LOCAL_RANK=str(local.index(rank)),
                   LOCAL_WORLD_SIZE=str(len(local)), GROUP_RANK=str(hosts.index(host)), MASTER_ADDR=master_addr,
                   MASTER_PORT=str(port), GRADWIRE_JOB_TOKEN=token, GRADWIRE_TIMEOUT="60")
        procs.append(launch(host, prog_args, env))
    return procs


def start_ranks(placement, prog_args, launch, master_addr):
    """placement: host of each rank (ranks of a host contiguous). launch(host, argv, env) -> Popen."""
    procs = launch_ranks(placement, prog_args, launch, master_addr)
    outputs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail(f"{prog_args} on hosts {placement} did not finish within {RUN_TIMEOUT_S} s")
        outputs.append(out)
        codes.append(p.returncode)
    for rank, (out, code) in enumerate(zip(outputs, codes)):
        if code != 0 or "PASS" not in out:
            fail(f"rank {rank} of {prog_args} on hosts {placement} exited {code}:\n" + "".join(outputs))
    return outputs


def run_expecting(placement, prog_args, launch, master_addr, victim, words):
    """Like start_ranks for a failure case: every rank but `victim` names the cause (`words`)."""
    procs = launch_ranks(placement, prog_args, launch, master_addr)
    try:
        outputs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
        fail(f"{prog_args} on hosts {placement}: a survivor hung instead of failing")
    # The cause, wherever it reaches a rank: in the collective (EXPECTED) or, for a rank
    # still finishing the join when a faster one failed, in the join (FAIL with the cause).
    for rank, out in enumerate(outputs):
        if rank != victim and not all(w in out for w in words):
            fail(f"rank {rank} of {prog_args} should report {words}:\n" + "".join(outputs))


def check_ring_traffic(placement, outputs):
    """Each rank's bytes through Intra and Inter are what a ring all-reduce sends to its successor."""
    n = len(placement)
    # Ring all-reduce: 2 (n - 1) chunks of about COUNT / n floats to the next rank, per repeat.
    ring_bytes = REPEATS * 2 * (n - 1) * (COUNT // n) * 4
    small = 256 << 10  # barriers, the call checks, the topology exchange: far below one chunk
    sent = {}
    for rank, out in enumerate(outputs):
        m = PASS_RE.search(out)
        if not m:
            fail(f"rank {rank} printed no traffic line:\n{out}")
        host, hosts, _, local_size = (int(m.group(i)) for i in (2, 3, 4, 5))
        intra, inter = int(m.group(6)), int(m.group(7))
        if hosts != len(set(placement)) or local_size != placement.count(placement[rank]):
            fail(f"rank {rank} sees {hosts} hosts and {local_size} ranks on its own, placement {placement}")
        successor_local = placement[(rank + 1) % n] == placement[rank]
        through, other = (intra, inter) if successor_local else (inter, intra)
        if not (ring_bytes * 0.99 <= through <= ring_bytes * 1.01 + small and other <= small):
            fail(f"rank {rank} (host {host}): sent {intra} B through shared memory and {inter} B through TCP; "
                 f"its ring successor is {'on its host' if successor_local else 'on another host'}, so about "
                 f"{ring_bytes} B should have gone through {'shared memory' if successor_local else 'TCP'}")
        sent[rank] = (intra, inter)
        print(f"  rank {rank} host {host}: shared memory {intra} B, TCP {inter} B")
    return sent, ring_bytes


def loopback(scripts, mp_worker, per_peer_worker):
    def launch(host, argv, env):
        env = dict(env, GRADWIRE_HOST_ID=f"test-host-{host}")
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for placement in ([0, 0, 1, 1], [0, 1, 1, 2, 2, 2]):
        start_ranks(placement, [mp_worker, "collectives"], launch, "127.0.0.1")
        outputs = start_ranks(placement, [per_peer_worker, str(COUNT), str(REPEATS)], launch, "127.0.0.1")
        check_ring_traffic(placement, outputs)
        print(f"PASS loopback hosts {placement}: collectives, ring traffic split by host")
    # A rank killed (one survivor shares its host, two do not) and a mismatch seen by two ranks
    # reach every rank, through whichever part links them.
    run_expecting([0, 0, 1, 1], [mp_worker, "kill", "2"], launch, "127.0.0.1", 2, ["peer lost", "lost rank 2"])
    run_expecting([0, 0, 1, 1], [mp_worker, "mismatch", "count"], launch, "127.0.0.1", -1,
                  ["mismatch", "count=1001", "count=1000"])
    print("PASS loopback hosts [0, 0, 1, 1]: a killed rank and a mismatch reported by every rank")


def link_bytes(c, host):
    out = c.run(host, ["cat", "/sys/class/net/eth0/statistics/tx_bytes", "/sys/class/net/eth0/statistics/rx_bytes"],
                capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def namespaces(scripts, mp_worker, per_peer_worker):
    sys.path.insert(0, scripts)
    import gwcluster
    problem = gwcluster.support_problem()
    if problem:
        print(f"SKIP: cannot make emulated hosts: {problem}")
        sys.exit(77)
    with gwcluster.cluster(2, None, name=f"pp{os.getpid() % 100000}") as c:
        def launch(host, argv, env):
            return c.popen(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        placement = [0, 0, 1, 1]
        start_ranks(placement, [mp_worker, "collectives"], launch, c.addr(0))
        before = [link_bytes(c, h) for h in (0, 1)]
        outputs = start_ranks(placement, [per_peer_worker, str(COUNT), str(REPEATS)], launch, c.addr(0))
        after = [link_bytes(c, h) for h in (0, 1)]
        sent, ring_bytes = check_ring_traffic(placement, outputs)
        for h in (0, 1):
            tx = after[h][0] - before[h][0]
            inter = sum(sent[r][1] for r, host in enumerate(placement) if host == h)
            intra = sum(sent[r][0] for r, host in enumerate(placement) if host == h)
            # TCP/IP headers and the store's messages add a few percent; shared memory adds nothing.
            if not (inter <= tx <= inter * 1.08 + (1 << 20)):
                fail(f"host {h}'s link carried {tx} B out; its ranks sent {inter} B through TCP and {intra} B "
                     f"through shared memory: only the TCP bytes (plus headers) should cross the link")
            print(f"host {h}: link tx {tx} B, TCP payload {inter} B, shared memory {intra} B (kept off the link)")
        print("PASS emulated hosts 2x2: collectives, only inter-host bytes on the links")


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in ("loopback", "namespaces"):
        print(__doc__)
        sys.exit(2)
    mode, scripts, mp_worker, per_peer_worker = sys.argv[1:]
    (loopback if mode == "loopback" else namespaces)(scripts, mp_worker, per_peer_worker)


if __name__ == "__main__":
    main()
