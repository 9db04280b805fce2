#!/usr/bin/env python3
"""Jobs across emulated hosts (scripts/cluster): gradwire-run --nnodes, mpirun with
scripts/cluster-rsh, and Slurm-style variables set by hand. Every rank must print
"rank R: PASS"; every job has a hard time bound. Root only: exits 77 (skipped) without
namespaces, and the Mpirun group also without mpirun.

    test_multihost.py WORKER [--print-spec PROGRAM] [Launcher|Mpirun|Slurm|unittest names...]
    WORKER: tests/multiprocess's mp_worker; PROGRAM: tests/cluster's cluster_print_spec
"""
import os
import re
import sys
import time
import unittest

import cluster_support as cs

WORKER = None
PRINT_SPEC = None  # tests/cluster/print_spec.cpp, optional: what detect() saw on each rank
BOUND_S = 150  # per job: a rank that hangs fails the test instead of stalling CI


class Base(unittest.TestCase):
    def assert_all_pass(self, job, world):
        finished = job.wait(BOUND_S)
        out = job.output()
        self.assertTrue(finished, f"the job did not finish within {BOUND_S} s:\n{out}")
        self.assertEqual(job.passed_ranks(), set(range(world)), out)
        self.assertTrue(all(code == 0 for code in job.returncodes), f"{job.returncodes}\n{out}")


    def assert_topology(self, job, per_host):
        """Every rank saw the emulated hosts as hosts: rank r on host i is local rank r - (ranks before i)."""
        seen = {int(m.group(1)): tuple(int(g) for g in m.groups()[1:])
                for m in re.finditer(r"rank (\d+): topology hosts=(\d+) local_rank=(\d+) local_size=(\d+)", job.output())}
        expected, rank = {}, 0
        for count in per_host:
            for local in range(count):
                expected[rank] = (len(per_host), local, count)
                rank += 1
        self.assertEqual(seen, expected, job.output())


class Launcher(Base):
    """scripts/gradwire-run --nnodes H --node-rank R, started once per host with `cluster exec`."""

    def test_2_hosts_x_2_ranks(self):
        with cs.emulated_cluster(2, bandwidth="1gbit", tag="la") as c:
            for args in (["collectives"], ["train", "sgd"]):
                with self.subTest(args=args), cs.start_launcher_job(c, [2, 2], [WORKER, *args]) as job:
                    self.assert_all_pass(job, 4)
                    if args == ["collectives"]:
                        self.assert_topology(job, [2, 2])
                    # The prefixes are the global ranks, node 1's are 2 and 3.
                    self.assertEqual(sorted(job.rank_lines()), [0, 1, 2, 3])

    def test_3_hosts_with_1_2_3_ranks(self):
        with cs.emulated_cluster(3, tag="lb") as c:
            for args in (["collectives"], ["train", "sgd"]):
                with self.subTest(args=args), cs.start_launcher_job(c, [1, 2, 3], [WORKER, *args]) as job:
                    self.assert_all_pass(job, 6)
                    if args == ["collectives"]:
                        self.assert_topology(job, [1, 2, 3])

    def test_ranks_listen_on_their_hosts_address_not_on_all_interfaces(self):
        # Hosts 0 and 1 of a 3-host job wait for host 2: meanwhile their listening sockets show.
        with cs.emulated_cluster(3, tag="lc") as c:
            commands = cs.launcher_commands(c, [1, 1, 1], [WORKER, "collectives"])
            with cs.Job(c, commands[:2]) as first:
                seen = {}
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not all(len(seen.get(h, [])) >= 1 + (h == 0) for h in (0, 1)):
                    time.sleep(0.1)
                    seen = {h: cs.listening(c, h) for h in (0, 1)}
                # Host 0: the store (the master port) and rank 0's peer port; host 1: rank 1's.
                self.assertEqual(len(seen[0]), 2, seen)
                self.assertIn((c.addr(0), cs.MASTER_PORT), seen[0])
                self.assertEqual(len(seen[1]), 1, seen)
                for h in (0, 1):
                    for addr, _ in seen[h]:
                        self.assertEqual(addr, c.addr(h), f"host {h} listens on {addr}, not on its eth0: {seen}")
                with cs.Job(c, commands[2:]) as last:
                    for job in (first, last):
                        self.assertTrue(job.wait(BOUND_S), job.output())
                    self.assertEqual(first.passed_ranks() | last.passed_ranks(), {0, 1, 2},
                                     first.output() + last.output())

    def test_ranks_told_to_listen_on_every_interface_tell_their_peers_a_reachable_address(self):
        # GRADWIRE_LISTEN_HOST=0.0.0.0: each rank listens on all its interfaces, and publishes
        # the address it reaches the store from (a peer on another host sent to "0.0.0.0"
        # would dial its own loopback). Hosts 0 and 1 wait for host 2 while their sockets show.
        with cs.emulated_cluster(3, tag="ld") as c:
            env = dict(os.environ, GRADWIRE_LISTEN_HOST="0.0.0.0")
            commands = cs.launcher_commands(c, [1, 1, 1], [WORKER, "collectives"])
            with cs.Job(c, commands[:2], env) as first:
                seen = []
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not seen:
                    time.sleep(0.1)
                    seen = cs.listening(c, 1)
                self.assertEqual([addr for addr, _ in seen], ["0.0.0.0"], f"host 1 listens on {seen}")
                with cs.Job(c, commands[2:], env) as last:
                    for job in (first, last):
                        self.assertTrue(job.wait(BOUND_S), job.output())
                    self.assertEqual(first.passed_ranks() | last.passed_ranks(), {0, 1, 2},
                                     first.output() + last.output())


class Mpirun(Base):
    """OpenMPI's mpirun inside host 0, its daemons started in the other hosts by scripts/cluster-rsh."""

    def test_collectives_2_hosts_x_2_ranks(self):
        with cs.emulated_cluster(2, tag="mp") as c:
            with cs.start_mpirun_job(c, [2, 2], [WORKER, "collectives"]) as job:
                self.assert_all_pass(job, 4)
                self.assert_topology(job, [2, 2])  # mpirun -H h0:2,h1:2 fills host 0 first


class Slurm(Base):
    """The variables srun sets, given by hand (no Slurm here), across hosts with 1 and 2 tasks."""

    def test_slurm_variables_across_hosts_form_one_job(self):
        per_host = [1, 2]
        with cs.emulated_cluster(2, tag="sl") as c:
            def env_of(host, local, rank):
                return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(local),
                        "SLURM_NODEID": str(host), "SLURM_TASKS_PER_NODE": "1,2", "SLURM_JOB_ID": "4242",
                        "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gw-h[0-1]", "MASTER_ADDR": c.addr(0)}
            # Nothing of another launcher: Slurm's variables must carry the job alone.
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("OMPI_", "PMIX_", "SLURM_")) and k not in
                   ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "GRADWIRE_JOB_TOKEN")}
            with cs.start_env_job(c, per_host, [WORKER, "collectives"], env_of, env) as job:
                self.assert_all_pass(job, 3)
            if PRINT_SPEC:
                # What each rank detected: Slurm as the source, its place, one master and token.
                with cs.start_env_job(c, per_host, [PRINT_SPEC], env_of, env) as job:
                    self.assertTrue(job.wait(60), job.output())
                    specs = sorted((dict(re.findall(r"(\w+)=(\S*)", line)) for line in job.output().splitlines()
                                    if line.startswith("rank=")), key=lambda s: int(s["rank"]))
                    self.assertEqual([(s["rank"], s["world"], s["local_rank"], s["local_size"], s["source"])
                                      for s in specs],
                                     [("0", "3", "0", "1", "slurm"), ("1", "3", "0", "2", "slurm"),
                                      ("2", "3", "1", "2", "slurm")], job.output())
                    self.assertEqual({s["master"].rsplit(":", 1)[0] for s in specs}, {c.addr(0)})
                    self.assertEqual(len({(s["master"], s["token"]) for s in specs}), 1, job.output())


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    WORKER = os.path.abspath(sys.argv.pop(1))
    if sys.argv[1:2] == ["--print-spec"]:
        PRINT_SPEC = os.path.abspath(sys.argv[2])
        del sys.argv[1:3]
    cs.require_namespaces()
    if sys.argv[1:] == ["Mpirun"] and not cs.mpirun_available():
        print("SKIPPED: mpirun is not installed (Debian: apt-get install openmpi-bin)")
        sys.exit(cs.SKIP)
    unittest.main(verbosity=2)
