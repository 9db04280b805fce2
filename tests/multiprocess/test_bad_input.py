#!/usr/bin/env python3
"""Bad input over a network transport, in real processes (scripts/gradwire-run):

    test_bad_input.py LAUNCHER WORKER BadInput|BadInputUcx

BadInput (WORKER over TCP): a rank that builds another model gets, like every rank, a mismatch
at construction naming both models; a NaN gradient on one rank (finite check on) fails every
rank within seconds, naming it; a rank started with a smaller WORLD_SIZE is refused by rank 0;
GRADWIRE_LOG=<unknown> says so once per process and logs at info; a second job given the first
one's MASTER_PORT is told that the port is taken; a Slurm batch script that runs the program
without srun fails at once, naming SLURM_NTASKS and srun.
BadInputUcx (WORKER over UCX): a rank started with another WORLD_SIZE, larger or smaller, is a
config error on every rank, naming both sizes.
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from mp_support import poll_until, rank_lines

LAUNCHER, WORKER = sys.argv[1], sys.argv[2]


def run(ranks, *args, env=None, extra=()):
    cmd = [LAUNCHER, "-n", str(ranks), *extra, "--keep-going", "--", WORKER, *args]
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=dict(os.environ, **{"GRADWIRE_TIMEOUT": "30", **(env or {})}))
    return p.returncode, rank_lines(p.stdout), time.monotonic() - start, p.stdout


class BadInput(unittest.TestCase):
    def test_a_rank_with_another_model_fails_every_rank_at_construction(self):
        status, lines, took, out = run(3, "model")
        self.assertEqual(status, 0, out)
        for r in range(3):
            got = " ".join(lines.get(r, []))
            self.assertIn("ERROR mismatch between ranks", got, out)
            self.assertIn("rank 0 has 2 tensors of f32, 1017 elements: [1001], [4, 4]", got, out)
            self.assertIn("tensor 0 is [1001] on rank 0, [1000] on rank 1", got, out)
        self.assertLess(took, 20)  # at construction, not at a deadline

    def test_a_nan_gradient_on_one_rank_fails_every_rank_naming_it(self):
        status, lines, took, out = run(3, "nan")
        self.assertEqual(status, 0, out)
        for r in range(3):
            got = " ".join(lines.get(r, []))
            self.assertIn("strategy::step on rank 1: gradient 0 (parameter of shape [1001]) holds nan at element 123",
                          got, out)
            self.assertIn("ERROR invalid argument" if r == 1 else "ERROR peer lost", got, out)
        self.assertLess(took, 20)

    def test_a_rank_started_with_a_smaller_world_size_is_refused_by_rank_0(self):
        # Rank 1 joins a job of 3 as if WORLD_SIZE were 2: rank 0 refuses its hello, naming both
        # sizes, and waits for a rank 1 that never connects until GRADWIRE_TIMEOUT. (Rank 2
        # dials a rank 1 that refuses it or has gone: some error, which the worker checks.)
        status, lines, took, out = run(3, "world-size", "2", env={"GRADWIRE_TIMEOUT": "5"})
        self.assertEqual(status, 0, out)
        got = " ".join(lines.get(1, []))
        self.assertIn("ERROR configuration error: rank 0 refused this rank's connection: rank 1 was started with "
                      "world size 2, rank 0 with 3: give every rank the same WORLD_SIZE", got, out)
        got = " ".join(lines.get(0, []))
        self.assertIn("ERROR timeout: rank 0: ranks 1 did not connect within 5000 ms: did they start, with the "
                      "same WORLD_SIZE and job token?", got, out)
        self.assertIn("ERROR", " ".join(lines.get(2, [])), out)
        self.assertLess(took, 5 + 20)

    def test_an_unknown_gradwire_log_level_says_so_once_per_process_and_logs_at_info(self):
        warning = "gradwire: GRADWIRE_LOG=verbose is not one of off, info, debug; logging at info"
        status, lines, took, out = run(2, "log", env={"GRADWIRE_LOG": "verbose"})
        self.assertEqual(status, 0, out)
        for r in range(2):
            got = lines.get(r, [])
            self.assertEqual(got.count(warning), 1, out)
            self.assertIn("OK", got, out)
            # Logging at info: the info lines, prefixed by rank, and no debug lines.
            logged = [l for l in got if l.startswith(f"[gradwire {r}/2 +")]
            self.assertTrue(any("info: strategy ready in" in l for l in logged), out)
            self.assertFalse(any(" debug: " in l for l in logged), out)
        # A level it knows: no warning.
        status, lines, took, out = run(2, "log", env={"GRADWIRE_LOG": "info"})
        self.assertEqual(status, 0, out)
        self.assertNotIn("is not one of off, info, debug", out)
        self.assertTrue(any("info: strategy ready in" in l for l in lines.get(0, [])), out)

    def test_a_second_job_on_the_first_jobs_master_port_is_told_the_port_is_taken(self):
        # Two jobs on one host given one MASTER_PORT, each with its own job token (as
        # gradwire-run gives): the second job's rank 0 cannot listen on the port (config), and
        # its rank 1 reaches the first job's rendezvous store, which refuses its token (auth).
        # Rank 1 names the taken port first, the token second; the worker checks each kind.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory(prefix="gw-same-port-") as d:
            release = os.path.join(d, "release")
            first = subprocess.Popen([LAUNCHER, "-n", "2", "--master-port", str(port), "--", WORKER, "hold", release],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, GRADWIRE_TIMEOUT="30"))
            first_out = []

            def read_first():
                for line in first.stdout:
                    first_out.append(line)

            reader = threading.Thread(target=read_first, daemon=True)
            reader.start()
            try:
                poll_until(lambda: sum("JOINED" in l for l in first_out) == 2, 60, "the first job joined")
                status, lines, took, out = run(2, "same-port", extra=["--master-port", str(port)])
            finally:
                open(release, "w").close()  # the first job ends (a barrier) once it sees this
                first.wait(timeout=60)
                reader.join(timeout=10)
                first.stdout.close()
        self.assertEqual(first.returncode, 0, "".join(first_out))
        self.assertEqual(status, 0, out)
        self.assertIn(f"ERROR configuration error: cannot listen on 127.0.0.1:{port} (the rendezvous store's port "
                      f"(MASTER_PORT)): the port is in use, by another job", " ".join(lines.get(0, [])), out)
        self.assertIn(f"ERROR authentication failed: the rendezvous store at 127.0.0.1:{port} "
                      f"(MASTER_ADDR:MASTER_PORT) belongs to another job (it refused this rank's job token): most "
                      f"likely another job already uses that port: give this job a different MASTER_PORT; or, if it "
                      f"is this job's own store, its ranks were given different job tokens: give every rank the same "
                      f"GRADWIRE_JOB_TOKEN", " ".join(lines.get(1, [])), out)
        self.assertLess(took, 20)  # at once, not at GRADWIRE_TIMEOUT (30 s)

    def test_a_slurm_batch_script_that_runs_the_program_without_srun_fails_at_once_naming_slurm_ntasks_and_srun(self):
        # What `sbatch -n 4` gives the batch script itself (read from a real Slurm 22.05):
        # task 0 of the allocation and no step (srun would add SLURM_STEP_ID). Run there
        # without srun the program is the only process: it used to wait GRADWIRE_TIMEOUT,
        # then name WORLD_SIZE. The worker checks that the error is a config error.
        launchers = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "OMPI_", "PMIX_")) and k not in launchers}
        env.update(SLURM_JOB_ID="4242", SLURM_JOBID="4242", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
                   SLURM_NTASKS="4", SLURM_NPROCS="4", SLURM_TASKS_PER_NODE="4", SLURM_GTIDS="0",
                   GRADWIRE_TIMEOUT="5")
        p = subprocess.run([WORKER, "batch-script"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60, env=env)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertIn("ERROR configuration error: SLURM_NTASKS=4 is the allocation's task count, but this process was "
                      "not started by srun (SLURM_PROCID is set, SLURM_STEP_ID is not: a batch script that runs the "
                      "program itself), so no other task starts and it would wait GRADWIRE_TIMEOUT for 3 ranks that "
                      "never come: start the program with srun in the batch script (srun ./program ...), which "
                      "starts all 4 tasks", p.stdout)


class BadInputUcx(unittest.TestCase):
    def check_world_size(self, rank1_size):
        # Rank 1 joins a job of 3 as if WORLD_SIZE were rank1_size: every rank reads the size
        # each peer published with its address and names both; nobody waits for a deadline.
        status, lines, took, out = run(3, "world-size", str(rank1_size))
        self.assertEqual(status, 0, out)
        says = {0: f"rank 1 was started with world size {rank1_size}, rank 0 with 3",
                1: f"rank 0 was started with world size 3, rank 1 with {rank1_size}",
                2: f"rank 1 was started with world size {rank1_size}, rank 2 with 3"}
        for r in range(3):
            got = " ".join(lines.get(r, []))
            self.assertIn(f"ERROR configuration error: {says[r]}: give every rank the same WORLD_SIZE", got, out)
        self.assertLess(took, 20)  # GRADWIRE_TIMEOUT is 30

    def test_a_rank_started_with_a_larger_world_size_fails_every_rank_naming_both_sizes(self):
        self.check_world_size(4)

    def test_a_rank_started_with_a_smaller_world_size_fails_every_rank_naming_both_sizes(self):
        self.check_world_size(2)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
