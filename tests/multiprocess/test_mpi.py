#!/usr/bin/env python3
"""The multi-process suite over transport::mpi, started by OpenMPI's mpirun.

    test_mpi.py MP_WORKER_MPI PS_WORKER_MPI [unittest args]     e.g. Correctness, Failures

The same worker scenarios as test_multiprocess.py runs over TCP and UCX (mp_worker.cpp,
ps_worker.cpp), each rank checking its results against float64 references, plus what MPI
lets a rank see of failures. Exits 77 (skipped) without mpirun. Every run is bounded.
"""
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

MP_WORKER, PS_WORKER = sys.argv[1], sys.argv[2]
SKIP = 77
# Shared memory unless a case says otherwise; --oversubscribe: more ranks than cores.
MPIRUN = ["mpirun", "--oversubscribe", "--allow-run-as-root"]
# gradwire-run's and torchrun's variables would win over OpenMPI's in cluster::detect().
ENV = {k: v for k, v in os.environ.items()
       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", "GRADWIRE_JOB_TOKEN")}
_RANK_LINE = re.compile(r"^rank (\d+): (.*)$")


def run(ranks, worker, *args, mca=(), env=None, bound=120):
    """Runs `worker args` on `ranks` ranks under mpirun; returns (status, {rank: [lines]}, seconds, output)."""
    cmd = MPIRUN + [a for kv in mca for a in ("--mca", *kv)]
    for name, value in (env or {}).items():
        cmd += ["-x", f"{name}={value}"]
    cmd += ["-np", str(ranks), worker, *args]
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=bound, env=ENV)
    lines = {}
    for line in p.stdout.splitlines():
        m = _RANK_LINE.match(line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return p.returncode, lines, time.monotonic() - start, p.stdout


class Correctness(unittest.TestCase):
    def check_pass(self, ranks, *args, worker=MP_WORKER, **kw):
        status, lines, _, out = run(ranks, worker, *args, **kw)
        self.assertEqual(status, 0, out)
        for r in range(ranks):
            self.assertTrue(any(l.startswith("PASS") for l in lines.get(r, [])), f"rank {r} did not pass:\n{out}")
        return lines

    def test_collectives_against_float64_reference(self):
        # ring, halving-doubling, hierarchical, auto (one-shot at small sizes), average,
        # broadcast, reduce_scatter, all_gather, barrier; sizes 0, 1, 7, 1000003.
        for n in (2, 3, 4):
            with self.subTest(ranks=n):
                self.check_pass(n, "collectives")

    def test_collectives_over_the_tcp_btl(self):  # as between hosts: OpenMPI's TCP instead of shared memory
        self.check_pass(3, "collectives", mca=[("btl", "self,tcp")])

    def test_bucketing_and_async_engine(self):
        self.check_pass(3, "bucketing")
        self.check_pass(3, "async")

    def test_point_to_point_out_of_order_and_size_mismatch(self):
        self.check_pass(2, "point-to-point")

    def test_strategies_equal_one_device_large_batch(self):
        for n, opt in ((2, "sgd"), (3, "momentum"), (4, "adam"), (3, "central-momentum"), (3, "local-sgd")):
            with self.subTest(ranks=n, optimizer=opt):
                self.check_pass(n, "train", opt)

    def test_sync_parameter_server_equals_all_reduce(self):
        # 2 workers and 1 server (the last rank): the chief compares with a serial reference.
        lines = self.check_pass(3, "sync", worker=PS_WORKER, env={"GRADWIRE_NUM_PS": "1"})
        self.assertTrue(any("PASS server" in l for l in lines.get(2, [])), lines)


class Failures(unittest.TestCase):
    def test_mismatched_collectives_name_both_ranks_and_values(self):
        # Rank 1's neighbours see the mismatch; their abort messages tell every other rank.
        cases = {"count": ("count=1001", "count=1000"), "dtype": ("f64", "f32"), "op": ("broadcast", "all_reduce")}
        for kind, values in cases.items():
            with self.subTest(kind=kind):
                status, lines, took, out = run(4, MP_WORKER, "mismatch", kind, bound=60)
                self.assertEqual(status, 0, out)
                for r in range(4):
                    got = " ".join(lines.get(r, []))
                    self.assertIn("EXPECTED mismatch", got, out)
                    for v in ("rank 1", *values):
                        self.assertIn(v, got, out)
                self.assertLess(took, 30)

    def test_deadline_is_a_timeout_naming_peer_tag_and_size(self):
        status, lines, took, out = run(2, MP_WORKER, "timeout", bound=60)
        self.assertEqual(status, 0, out)
        for r in range(2):
            got = " ".join(lines.get(r, []))
            self.assertIn("EXPECTED timeout", got, out)
            self.assertIn(f"receive from rank {(r + 1) % 2} (tag 4242, 12345 bytes)", got, out)
            self.assertIn("PASS timeout", got, out)
        self.assertLess(took, 30)

    def test_killed_rank_ends_the_job_in_bounded_time(self):
        # OpenMPI's launcher ends the job when a rank dies without MPI_Finalize: the
        # survivors are killed (they would otherwise wait for the dead rank until their
        # deadline: over shared memory MPI reports nothing). What the user sees is
        # mpirun's report naming the rank and the signal, and a non-zero status.
        status, lines, took, out = run(3, MP_WORKER, "kill", "1", bound=60)
        self.assertNotEqual(status, 0, out)
        self.assertRegex(out, r"rank 1 with PID \d+ on node \S+ exited on signal 9", out)
        self.assertLess(took, 30, "the job must end at once, not at the survivors' deadline")


if __name__ == "__main__":
    if shutil.which("mpirun") is None:
        print("SKIPPED: mpirun is not installed (Debian: apt-get install openmpi-bin)")
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
