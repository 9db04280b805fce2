#!/usr/bin/env python3
"""examples/fashion_mnist started the way launchers start it: what a multi-process launch of an
in-process strategy, and a parameter-server job without servers, say and exit with.

Usage: test_fashion_mnist.py path/to/fashion_mnist path/to/gradwire-run path/to/docs/launching.md [unittest args]

Each case runs the real example with a launcher's variables (or under scripts/gradwire-run),
on a tiny generated data set where it gets as far as training.
"""
import gzip
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

FASHION_MNIST = None
GRADWIRE_RUN = None
LAUNCHING_MD = None

# The launchers' variables that cluster::detect() reads: a case starts from an environment without them.
LAUNCHER_VARIABLES = re.compile(r"(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|NODE_RANK|"
                                r"MASTER_ADDR|MASTER_PORT|GRADWIRE_JOB_TOKEN|GRADWIRE_NUM_PS|TF_CONFIG|"
                                r"OMPI_.*|PMIX_.*|SLURM_.*)")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not LAUNCHER_VARIABLES.fullmatch(k)}
    env.update(extra)
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_idx(path, magic, dims, payload):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)


def write_tiny_data(directory, train=256, test=64, seed=1):
    """Random 28x28 images and labels in the four idx files the example reads."""
    rng = random.Random(seed)
    for prefix, count in (("train", train), ("t10k", test)):
        pixels = bytes(rng.randrange(256) for _ in range(count * 28 * 28))
        labels = bytes(rng.randrange(10) for _ in range(count))
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), 0x803, (count, 28, 28), pixels)
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), 0x801, (count,), labels)


class Case(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.data = cls.tmp.name
        write_tiny_data(cls.data)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_example(self, *args, env, timeout=60):
        p = subprocess.run([FASHION_MNIST, "--epochs", "1", "--data", self.data, *args], env=env, capture_output=True,
                           text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def run_processes(self, size, args, **env):
        """`size` processes of the example under srun's variables (one port for all): each
        rank's (returncode, stdout, stderr), and all of it as one text for messages."""
        port = str(free_port())
        procs = [subprocess.Popen([FASHION_MNIST, *args, "--data", self.data],
                                  env=ParameterServerUnderSrun.srun_env(r, size, MASTER_PORT=port, **env),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(size)]
        outputs = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=120)
                outputs.append((p.returncode, out, err))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        text = "\n".join(f"rank {r}: rc {rc}\n{out}{err}" for r, (rc, out, err) in enumerate(outputs))
        return outputs, text

    def accuracy_lines(self, text):
        return re.findall(r"^(?:\[\d+\] )?final test accuracy", text, re.MULTILINE)


class OptimizerChosenAtRunTime(Case):
    """--optimizer picks one of four at run time (optim::one_of: each trainer is compiled once for
    all four). Each trains, and its checkpoint keeps its name: resuming under another optimizer is
    refused naming both, under its own the run is found complete."""

    def test_each_optimizer_trains_and_its_checkpoint_resumes_under_it_alone(self):
        finals = {}
        with tempfile.TemporaryDirectory() as checkpoints:
            for name, other in (("sgd", "momentum"), ("momentum", "sgd"), ("adam", "adamw"), ("adamw", "adam")):
                with self.subTest(optimizer=name):
                    where = os.path.join(checkpoints, name)
                    rc, out, err = self.run_example("--optimizer", name, "--checkpoint-dir", where, env=clean_env())
                    self.assertEqual(rc, 0, out + err)
                    self.assertEqual(len(self.accuracy_lines(out)), 1, out)
                    with open(os.path.join(where, "model.ckpt"), "rb") as f:
                        finals[name] = f.read()
                    rc, out, err = self.run_example("--optimizer", other, "--checkpoint-dir", where, env=clean_env())
                    self.assertNotEqual(rc, 0, out + err)
                    self.assertIn(f"saved with optimizer '{name}', the strategy uses '{other}'", out + err)
                    rc, out, err = self.run_example("--optimizer", name, "--checkpoint-dir", where, env=clean_env())
                    self.assertEqual(rc, 0, out + err)
                    self.assertIn("the run is complete", out)
        # Each choice took effect: four optimizers, four different models (adamw's decay alone
        # moves adam's parameters by 1e-5 a step: the bits differ where the loss may not).
        self.assertEqual(len(set(finals.values())), 4)


class InProcessStrategyUnderALauncher(Case):
    """A launcher that starts N copies of an in-process strategy (one_device by default) would train
    N independent models and print N results: every rank refuses, exit 2, naming what to use."""

    def launchers(self):
        port = str(free_port())
        return {
            "torchrun / gradwire-run": dict(RANK="1", WORLD_SIZE="2", MASTER_PORT=port),
            "mpirun": dict(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", OMPI_MCA_ess_base_jobid="7"),
            "srun": dict(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2", SLURM_LOCALID="1",
                         SLURM_TASKS_PER_NODE="2", SLURM_JOB_ID="42", SLURM_STEP_ID="0"),
            "TF_CONFIG": dict(TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:%s", "127.0.0.1:1"]}, '
                                        '"task": {"type": "worker", "index": 1}}' % port),
        }

    def test_one_device_is_refused_under_every_launcher(self):
        for launcher, variables in self.launchers().items():
            with self.subTest(launcher=launcher):
                rc, out, err = self.run_example(env=clean_env(**variables))
                self.assertEqual(rc, 2, out + err)
                self.assertIn("fashion_mnist: --strategy one_device trains in this process alone, but this is rank 1 "
                              "of a job of 2 processes", err)
                self.assertIn("so each process would train a model of its own: "
                              "use --strategy multi_worker_mirrored", err)
                self.assertIn("usage: fashion_mnist", err)
                self.assertEqual(self.accuracy_lines(out), [], out)

    def test_threads_strategies_are_refused_too(self):
        env = clean_env(RANK="0", WORLD_SIZE="2", MASTER_PORT=str(free_port()))
        for args in (["--strategy", "mirrored"], ["--strategy", "local_sgd"],
                     ["--strategy", "parameter_server", "--transport", "simulated"]):
            with self.subTest(args=args):
                rc, out, err = self.run_example(*args, env=env)
                self.assertEqual(rc, 2, out + err)
                self.assertIn(f"fashion_mnist: --strategy {args[1]} runs its replicas as threads of this process", err)
                self.assertIn("rank 0 of a job of 2 processes", err)

    def test_gradwire_run_n_2_stops_with_status_2(self):
        rc = subprocess.run([sys.executable, GRADWIRE_RUN, "-n", "2", FASHION_MNIST, "--epochs", "1", "--data",
                             self.data], env=clean_env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(rc.returncode, 2, rc.stdout + rc.stderr)
        self.assertRegex(rc.stderr, r"\[\d\] fashion_mnist: --strategy one_device trains in this process alone")
        self.assertEqual(self.accuracy_lines(rc.stdout), [], rc.stdout)

    def test_one_process_still_trains(self):
        """No launcher, a launcher's one-process job, and a Slurm batch script's own process (no
        srun: SLURM_NTASKS is the allocation's) train one model and exit 0."""
        for name, variables in {"no launcher": {},
                                "WORLD_SIZE=1": dict(RANK="0", WORLD_SIZE="1"),
                                "sbatch script": dict(SLURM_PROCID="0", SLURM_NTASKS="4", SLURM_LOCALID="0",
                                                      SLURM_TASKS_PER_NODE="4", SLURM_JOB_ID="42")}.items():
            with self.subTest(name=name):
                rc, out, err = self.run_example(env=clean_env(**variables))
                self.assertEqual(rc, 0, out + err)
                self.assertEqual(len(self.accuracy_lines(out)), 1, out)


class ParameterServerUnderSrun(Case):
    """srun gives no roles: a parameter-server job says GRADWIRE_NUM_PS, which makes the last ranks serve."""

    @staticmethod
    def srun_env(rank, size, **extra):
        return clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS=str(size), SLURM_STEP_NUM_TASKS=str(size),
                         SLURM_LOCALID=str(rank), SLURM_TASKS_PER_NODE=str(size), SLURM_JOB_ID="42",
                         SLURM_STEP_ID="0", **extra)

    def test_help_names_gradwire_num_ps(self):
        p = subprocess.run([FASHION_MNIST, "--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0)
        self.assertIn("GRADWIRE_NUM_PS=S", p.stdout)

    def test_a_job_without_servers_names_gradwire_num_ps(self):
        rc, out, err = self.run_example("--strategy", "parameter_server", "--transport", "tcp",
                                        env=self.srun_env(0, 3, MASTER_PORT=str(free_port())))
        self.assertEqual(rc, 2, out + err)
        self.assertIn("this job has 0 server(s) in 3 process(es)", err)
        self.assertIn("under srun or mpirun set GRADWIRE_NUM_PS=SERVERS on every rank", err)

    def test_launching_md_slurm_section_names_gradwire_num_ps(self):
        with open(LAUNCHING_MD) as f:
            text = f.read()
        section = text.split("## With Slurm: `srun`", 1)[1].split("\n## ", 1)[0]
        self.assertIn("GRADWIRE_NUM_PS", section)

    def test_gradwire_num_ps_under_srun_trains(self):
        """What the error and the docs say, done: 2 workers and 1 server with srun's variables."""
        outputs, text = self.run_processes(3, ["--strategy", "parameter_server", "--transport", "tcp", "--epochs", "1",
                                               "--batch", "32"], GRADWIRE_NUM_PS="1", GRADWIRE_TIMEOUT="60")
        self.assertEqual([rc for rc, _, _ in outputs], [0, 0, 0], text)
        self.assertIn("2 workers + 1 servers", outputs[0][1], text)
        self.assertEqual(len(self.accuracy_lines(outputs[0][1])), 1, text)
        self.assertIn("ps rank 2: mode sync", outputs[2][1], text)



class FinalParameterHash(Case):
    """Every replica prints `rank R: final parameters fnv1a HEX` at the end, so that a script can
    check that the replicas agree: equal on every rank of a synchronous run, the same whether the
    replicas are threads or processes over TCP (2 ranks: every all-reduce algorithm adds a + b), and
    not a constant (another seed trains to another model)."""

    HASH = re.compile(r"^(?:\[\d+\] )?rank (\d+): final parameters fnv1a ([0-9a-f]{16})$", re.MULTILINE)

    def hashes(self, text):
        return {int(rank): value for rank, value in self.HASH.findall(text)}

    def threads(self, *extra):
        rc, out, err = self.run_example("--strategy", "mirrored", "--replicas", "2", "--batch", "32", *extra,
                                        env=clean_env())
        self.assertEqual(rc, 0, out + err)
        return self.hashes(out)

    def test_threads_and_processes_end_with_one_hash(self):
        threads = self.threads()
        self.assertEqual(sorted(threads), [0, 1], threads)
        self.assertEqual(threads[0], threads[1])
        outputs, text = self.run_processes(2, ["--strategy", "multi_worker_mirrored", "--transport", "tcp", "--epochs",
                                               "1", "--batch", "32"], GRADWIRE_TIMEOUT="60")
        self.assertEqual([rc for rc, _, _ in outputs], [0, 0], text)
        processes = {}
        for _, out, _ in outputs:
            processes.update(self.hashes(out))
        self.assertEqual(processes, threads, text)

    def test_another_seed_ends_with_another_hash(self):
        first, second = self.threads("--seed", "1"), self.threads("--seed", "2")
        self.assertEqual(len(set(first.values())), 1, first)
        self.assertNotEqual(first[0], second[0])


class DiLoCo(Case):
    """--strategy diloco: a few steps on threads (whole model, and streamed with a delay) end with
    one hash where the last step was an outer step; over TCP processes it ends where the threads do;
    its flags are refused with other strategies and a delay of a period or more is refused."""

    def hashes(self, out):
        return {int(rank): value for rank, value in FinalParameterHash.HASH.findall(out)}

    def test_threads_train_and_agree_after_the_last_outer_step(self):
        # 256 samples, 2 x 16 a step: 8 steps, outer steps after 4 and 8.
        rc, out, err = self.run_example("--strategy", "diloco", "--replicas", "2", "--batch", "16", "--period", "4",
                                        "--optimizer", "adamw", env=clean_env())
        self.assertEqual(rc, 0, out + err)
        self.assertIn("strategy diloco (period 4, outer Nesterov lr 0.7 momentum 0.9, fragments 1, delay 0) over inproc",
                      out)
        self.assertEqual(len(self.accuracy_lines(out)), 1, out)
        hashes = self.hashes(out)
        self.assertEqual(sorted(hashes), [0, 1], out)
        self.assertEqual(hashes[0], hashes[1], out)
        outputs, text = self.run_processes(2, ["--strategy", "diloco", "--transport", "tcp", "--epochs", "1",
                                               "--batch", "16", "--period", "4", "--optimizer", "adamw"],
                                           GRADWIRE_TIMEOUT="60")
        self.assertEqual([rc for rc, _, _ in outputs], [0, 0], text)
        processes = {}
        for _, out, _ in outputs:
            processes.update(self.hashes(out))
        self.assertEqual(processes, hashes, text)

    def test_streamed_with_a_delay(self):
        rc, out, err = self.run_example("--strategy", "diloco", "--replicas", "3", "--batch", "16", "--period", "4",
                                        "--fragments", "3", "--delay", "1", "--outer-lr", "0.5",
                                        "--outer-momentum", "0.8", "--evals-per-epoch", "2", env=clean_env())
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(len(self.accuracy_lines(out)), 1, out)
        self.assertEqual(sorted(self.hashes(out)), [0, 1, 2], out)

    def test_its_flags_are_refused_elsewhere(self):
        for args, words in ((["--strategy", "local_sgd", "--outer-lr", "0.5"],
                             "--outer-lr is for --strategy diloco, not local_sgd"),
                            (["--strategy", "mirrored", "--fragments", "2"],
                             "--fragments is for --strategy diloco, not mirrored"),
                            (["--strategy", "central_storage", "--delay", "1"],
                             "--delay is for --strategy diloco, not central_storage"),
                            (["--strategy", "one_device", "--period", "4"],
                             "--period is for --strategy local_sgd or diloco, not one_device"),
                            (["--strategy", "diloco", "--period", "2", "--delay", "2"],
                             "--delay 2 must be below --period 2"),
                            (["--strategy", "diloco", "--outer-momentum", "1"],
                             "--outer-momentum expects a number in [0, 1), got '1'"),
                            (["--strategy", "diloco", "--transport", "ucx"],
                             "--strategy diloco runs over --transport inproc, tcp or simulated"),
                            (["--strategy", "diloco", "--checkpoint-dir", "/tmp/x"],
                             "--strategy diloco does not take --checkpoint-dir yet")):
            with self.subTest(args=args):
                rc, out, err = self.run_example(*args, env=clean_env())
                self.assertEqual(rc, 2, out + err)
                self.assertIn(words, err)


class ShardedAndCompressed(Case):
    """--strategy sharded (ZeRO-1) and --compress CODEC: on threads and over TCP processes the
    replicas end with one hash, the same over TCP as on threads (the same bits either way), and
    sharded's as mirrored's (its bits are the ring all-reduce's: on 2 ranks any all-reduce's);
    sharded holds about half of Adam's state per replica on 2; checkpoints are one per rank and
    resume; bad codecs and misplaced --compress are refused."""

    STATE = re.compile(r"^rank 0: optimizer state (\d+) bytes$", re.MULTILINE)

    def hashes(self, out):
        return {int(rank): value for rank, value in FinalParameterHash.HASH.findall(out)}

    def threads_then_processes(self, strategy, *args):
        rc, out, err = self.run_example("--strategy", "mirrored" if strategy == "multi_worker_mirrored" else strategy,
                                        "--replicas", "2", "--batch", "16", *args, env=clean_env())
        self.assertEqual(rc, 0, out + err)
        threads = self.hashes(out)
        self.assertEqual(sorted(threads), [0, 1], out)
        self.assertEqual(threads[0], threads[1], out)
        outputs, text = self.run_processes(2, ["--strategy", strategy, "--transport", "tcp", "--epochs", "1",
                                               "--batch", "16", *args], GRADWIRE_TIMEOUT="60")
        self.assertEqual([rc for rc, _, _ in outputs], [0, 0], text)
        processes = {}
        for _, o, _ in outputs:
            processes.update(self.hashes(o))
        self.assertEqual(processes, threads, text)
        return out

    def test_sharded_trains_like_mirrored_and_holds_half_the_state(self):
        out = self.threads_then_processes("sharded")
        self.assertIn("strategy sharded over inproc", out)
        rc, mirrored, err = self.run_example("--strategy", "mirrored", "--replicas", "2", "--batch", "16",
                                             env=clean_env())
        self.assertEqual(rc, 0, mirrored + err)
        self.assertEqual(self.hashes(out), self.hashes(mirrored), out + mirrored)
        # Adam: two moments of the 235,146 parameters, 4 bytes each; rank 0 holds its chunk of each bucket.
        whole = 2 * 235146 * 4
        self.assertEqual(int(self.STATE.search(mirrored)[1]), whole, mirrored)
        self.assertAlmostEqual(int(self.STATE.search(out)[1]) / whole, 0.5, delta=0.001, msg=out)

    def test_sharded_checkpoints_one_file_per_rank_and_resumes(self):
        with tempfile.TemporaryDirectory() as ckpt:
            args = ["--strategy", "sharded", "--replicas", "2", "--batch", "16", "--checkpoint-dir", ckpt]
            rc, first, err = self.run_example(*args, env=clean_env())
            self.assertEqual(rc, 0, first + err)
            self.assertEqual(sorted(os.listdir(ckpt)), ["model-rank-0.ckpt", "model-rank-1.ckpt"])
            rc, again, err = self.run_example(*args, "--epochs", "2", env=clean_env())
            self.assertEqual(rc, 0, again + err)
            self.assertIn("resumed from", again)

    def test_each_codec_keeps_replicas_identical_on_threads_and_processes(self):
        for codec in ("fp16", "bf16", "int8", "topk:0.05", "powersgd:2"):
            with self.subTest(codec=codec):
                out = self.threads_then_processes("multi_worker_mirrored", "--compress", codec)
                self.assertIn(f"(compress {codec}) over inproc", out)

    def test_diloco_pseudo_gradients_through_a_codec(self):
        rc, out, err = self.run_example("--strategy", "diloco", "--replicas", "2", "--batch", "16", "--period", "4",
                                        "--compress", "int8", env=clean_env())
        self.assertEqual(rc, 0, out + err)
        self.assertIn("fragments 1, delay 0) (compress int8) over inproc", out)
        hashes = self.hashes(out)
        self.assertEqual(sorted(hashes), [0, 1], out)
        self.assertEqual(hashes[0], hashes[1], out)  # 8 steps: the last one an outer step

    def test_parameter_server_pushes_through_each_codec_on_threads_and_processes(self):
        """--strategy parameter_server --compress CODEC: the sync workers end with one hash (they
        pull the same parameters), the same over TCP processes (a step's sum of 2 workers' decoded
        pushes is the same in either order: 0 + a + b, element by element; not PowerSGD's, whose
        decode_add adds r products into the sum, so the order the pushes arrive in shows in the
        last bits), and async trains through a codec too."""
        for codec in ("fp16", "bf16", "int8", "topk:0.05", "powersgd:2"):
            with self.subTest(codec=codec):
                args = ["--strategy", "parameter_server", "--batch", "16", "--compress", codec]
                rc, out, err = self.run_example(*args, "--replicas", "2", "--ps", "1", env=clean_env())
                self.assertEqual(rc, 0, out + err)
                self.assertIn(f"strategy parameter_server (sync) (compress {codec}) over inproc", out)
                threads = self.hashes(out)
                self.assertEqual(sorted(threads), [0, 1], out)
                self.assertEqual(threads[0], threads[1], out)
                outputs, text = self.run_processes(3, [*args, "--transport", "tcp", "--epochs", "1"],
                                                   GRADWIRE_NUM_PS="1", GRADWIRE_TIMEOUT="60")
                self.assertEqual([rc for rc, _, _ in outputs], [0, 0, 0], text)
                processes = {}
                for _, o, _ in outputs:
                    processes.update(self.hashes(o))
                self.assertEqual(sorted(processes), [0, 1], text)
                self.assertEqual(processes[0], processes[1], text)
                if not codec.startswith("powersgd"):
                    self.assertEqual(processes, threads, text)
        rc, out, err = self.run_example("--strategy", "parameter_server", "--replicas", "2", "--ps", "1", "--batch",
                                        "16", "--ps-mode", "async", "--compress", "int8", env=clean_env())
        self.assertEqual(rc, 0, out + err)
        self.assertIn("strategy parameter_server (async) (compress int8) over inproc", out)

    def test_bad_codecs_and_misplaced_compress_are_refused(self):
        for args, words in ((["--strategy", "mirrored", "--compress", "zstd"], "--compress zstd: unknown codec"),
                            (["--strategy", "mirrored", "--compress", "topk:0"], "the fraction kept must be in (0, 1]"),
                            (["--strategy", "mirrored", "--compress", "powersgd:0"], "the rank must be >= 1"),
                            (["--strategy", "local_sgd", "--compress", "fp16"],
                             "--compress is for --strategy mirrored or multi_worker_mirrored"),
                            (["--strategy", "diloco", "--compress", "topk:0.1"],
                             "--strategy diloco takes --compress fp16, bf16 or int8"),
                            (["--strategy", "mirrored", "--compress", "fp16", "--backup-workers", "1"],
                             "--compress does not combine with --backup-workers"),
                            (["--strategy", "parameter_server", "--ps-mode", "bounded:2", "--compress", "int8"],
                             "--compress with --strategy parameter_server takes --ps-mode sync or async"),
                            (["--strategy", "sharded", "--transport", "ucx"],
                             "--strategy sharded runs over --transport inproc, tcp or simulated")):
            with self.subTest(args=args):
                rc, out, err = self.run_example(*args, env=clean_env())
                self.assertEqual(rc, 2, out + err)
                self.assertIn(words, err)


class BackupWorkers(Case):
    """--backup-workers B (K of N for all-reduce): three processes over TCP with one straggler end
    with one parameter hash on every rank, and each rank says how often its gradients were
    dropped; flags it cannot honour are refused before training. Which steps drop whom depends
    on timing; that the late ranks are exactly the slow ones is tests/aggregation/test_k_of_n.cpp's."""

    DROPPED = re.compile(r"^rank (\d+): K of N: computed (\d+) of the job's (\d+) steps, (\d+) of them dropped$",
                         re.MULTILINE)

    def test_three_processes_with_a_straggler_end_with_one_hash(self):
        for transport in ("tcp", "ucx"):
            with self.subTest(transport=transport):
                self.three_processes_with_a_straggler(transport)

    def three_processes_with_a_straggler(self, transport):
        outputs, text = self.run_processes(3, ["--strategy", "multi_worker_mirrored", "--transport", transport,
                                               "--epochs", "1", "--batch", "16", "--backup-workers", "1",
                                               "--straggler", "2:5"], GRADWIRE_TIMEOUT="60")
        if transport == "ucx" and "this build has no UCX" in text:
            self.skipTest("this build of fashion_mnist has no UCX")
        self.assertEqual([rc for rc, _, _ in outputs], [0, 0, 0], text)
        hashes, dropped = {}, {}
        for _, out, _ in outputs:
            hashes.update({int(r): h for r, h in FinalParameterHash.HASH.findall(out)})
            dropped.update({int(r): (int(c), int(n), int(d)) for r, c, n, d in self.DROPPED.findall(out)})
        self.assertEqual(sorted(hashes), [0, 1, 2], text)
        self.assertEqual(len(set(hashes.values())), 1, text)
        self.assertEqual(sorted(dropped), [0, 1, 2], text)
        steps = 256 // (16 * 3)
        for rank, (computed, job_steps, d) in dropped.items():
            self.assertEqual(job_steps, steps, text)
            self.assertLessEqual(computed, steps, text)
            self.assertLessEqual(d, computed, text)
        # With one backup at most one rank is out of each step: late (dropped) or catching up (skipped).
        self.assertLessEqual(sum(d + (steps - c) for c, _, d in dropped.values()), steps, text)

    def test_flags_it_cannot_honour_are_refused(self):
        for args, words in ((["--strategy", "local_sgd", "--backup-workers", "1"],
                             "--backup-workers is for --strategy mirrored or multi_worker_mirrored"),
                            (["--strategy", "mirrored", "--replicas", "2", "--backup-workers", "2"],
                             "--backup-workers 2 leaves no replica of 2 in a step")):
            with self.subTest(args=args):
                rc, out, err = self.run_example(*args, env=clean_env())
                self.assertEqual(rc, 2, out + err)
                self.assertIn(words, err)

    def test_threads_train_with_backups(self):
        rc, out, err = self.run_example("--strategy", "mirrored", "--replicas", "3", "--batch", "16",
                                        "--backup-workers", "1", env=clean_env())
        self.assertEqual(rc, 0, out + err)
        hashes = {int(r): h for r, h in FinalParameterHash.HASH.findall(out)}
        self.assertEqual(sorted(hashes), [0, 1, 2], out)
        self.assertEqual(len(set(hashes.values())), 1, out)


class Elastic(Case):
    """--min-replicas M (the elastic all-reduce): four processes over TCP lose rank 0 mid-run;
    the other three go on to the end with one parameter hash, the lowest of them now printing,
    and every epoch applies each training sample at most once and all but fewer than a global
    batch (the example checks its sampler's count on every replica and prints it)."""

    SAMPLES = re.compile(r"^rank (\d+): epoch (\d+) samples: (\d+) applied once, (\d+) left over, none twice$",
                         re.MULTILINE)
    VIEW = re.compile(r"^rank (\d+): view 1 at step (\d+): ranks 1,2,3 go on \(lost 0\)$", re.MULTILINE)

    def test_rank_0_lost_mid_run(self):
        for transport in ("tcp", "ucx"):
            with self.subTest(transport=transport):
                self.rank_0_lost_mid_run(transport)

    def rank_0_lost_mid_run(self, transport):
        size, epochs = 4, 20
        port = str(free_port())
        args = ["--strategy", "multi_worker_mirrored", "--transport", transport, "--epochs", str(epochs), "--batch", "8",
                "--min-replicas", "2", "--data", self.data]
        procs = [subprocess.Popen([FASHION_MNIST, *args], env=ParameterServerUnderSrun.srun_env(r, size, MASTER_PORT=port),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(size)]
        outputs = {}
        try:
            # Rank 0 (the chief) is killed once it has reported its third epoch.
            seen = []
            for line in procs[0].stdout:
                seen.append(line)
                if "this build has no UCX" in line:
                    self.skipTest("this build of fashion_mnist has no UCX")
                if line.startswith("rank 0: epoch 3 samples:"):
                    procs[0].kill()
                    break
            procs[0].wait()
            self.assertTrue(any(l.startswith("rank 0: epoch 3 samples:") for l in seen), "".join(seen))
            for r in range(1, size):
                out, _ = procs[r].communicate(timeout=120)
                outputs[r] = (procs[r].returncode, out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        text = "".join(seen) + "\n".join(f"rank {r}: rc {rc}\n{out}" for r, (rc, out) in outputs.items())
        self.assertEqual([rc for rc, _ in outputs.values()], [0, 0, 0], text)
        hashes, samples, views = {}, {}, {}
        for _, out in outputs.values():
            hashes.update({int(r): h for r, h in FinalParameterHash.HASH.findall(out)})
            views.update({int(r): int(step) for r, step in self.VIEW.findall(out)})
            for r, e, once, left in self.SAMPLES.findall(out):
                samples[int(e)] = (int(r), int(once), int(left))
        for r, e, once, left in self.SAMPLES.findall("".join(seen)):
            samples[int(e)] = (int(r), int(once), int(left))
        self.assertEqual(sorted(hashes), [1, 2, 3], text)
        self.assertEqual(len(set(hashes.values())), 1, text)
        self.assertEqual(sorted(views), [1, 2, 3], text)
        self.assertEqual(len(set(views.values())), 1, text)  # the same step on every survivor
        self.assertEqual(sorted(samples), list(range(1, epochs + 1)), text)
        for e, (r, once, left) in samples.items():
            self.assertEqual(once + left, 256, text)
            self.assertLess(left, 8 * 4, text)  # less than a global batch (of the most replicas)
            self.assertEqual(r, 0 if e <= 3 else 1, text)

    def test_flags_it_cannot_honour_are_refused(self):
        for args, env, words in (
                (["--strategy", "local_sgd", "--min-replicas", "1"], {},
                 "--min-replicas is for --strategy multi_worker_mirrored"),
                (["--strategy", "central_storage"], {"GRADWIRE_MIN_REPLICAS": "2"},
                 "--min-replicas is for --strategy multi_worker_mirrored"),
                (["--strategy", "mirrored", "--transport", "simulated", "--replicas", "2", "--min-replicas", "3"], {},
                 "--min-replicas 3 is more than the 2 replica(s) of the job"),
                (["--strategy", "mirrored", "--transport", "simulated", "--min-replicas", "1", "--backup-workers", "1"],
                 {}, "--min-replicas and --backup-workers do not combine yet")):
            with self.subTest(args=args, env=env):
                rc, out, err = self.run_example(*args, env=clean_env(**env))
                self.assertEqual(rc, 2, out + err)
                self.assertIn(words, err)

    def test_a_rank_that_dies_in_virtual_time(self):
        # The simulator: rank 2 of 4 dies at a virtual time mid-run; the rest finish with one hash.
        rc, out, err = self.run_example("--strategy", "mirrored", "--transport", "simulated", "--replicas", "4",
                                        "--epochs", "3", "--batch", "8", "--min-replicas", "2",
                                        "--cluster", "hosts=4 latency=50us bandwidth=1Gbit compute=modelled die=2@20ms",
                                        "--step-compute", "0.001", env=clean_env())
        self.assertEqual(rc, 0, out + err)
        hashes = {int(r): h for r, h in FinalParameterHash.HASH.findall(out)}
        self.assertEqual(sorted(hashes), [0, 1, 3], out)
        self.assertEqual(len(set(hashes.values())), 1, out)
        self.assertEqual(len(re.findall(r"^rank \d: view 1 at step \d+: ranks 0,1,3 go on \(lost 2\)$", out,
                                        re.MULTILINE)), 3, out)

class SimulatedTime(Case):
    """Over --transport simulated every strategy family times its run in virtual time: the training
    time the chief reports is the job's virtual length (less only the last rank's tail), not the
    seconds the simulation took. The parameter-server family once timed itself on the steady clock,
    and its simulated times to a target accuracy were wall seconds."""

    VIRTUAL = re.compile(r"^simulated ([\d.]+) s of virtual time$", re.MULTILINE)
    TRAINING = re.compile(r"^final test accuracy [\d.]+% after \d+ epochs, ([\d.]+) s of training$", re.MULTILINE)

    def test_every_family_reports_virtual_seconds(self):
        # 200 ms of modelled compute a step over 4 steps: at least 0.8 s of virtual time, where
        # the simulation itself takes a small part of that in real time.
        common = ["--transport", "simulated", "--batch", "16", "--step-compute", "0.2",
                  "--cluster", "compute=modelled latency=20us bandwidth=10Gbit"]
        for name, args in (("all_reduce", ["--strategy", "multi_worker_mirrored", "--replicas", "4"]),
                           ("K of N", ["--strategy", "multi_worker_mirrored", "--replicas", "4",
                                       "--backup-workers", "1"]),
                           ("parameter server", ["--strategy", "parameter_server", "--replicas", "4"]),
                           ("central storage", ["--strategy", "central_storage", "--replicas", "4"]),
                           ("local SGD", ["--strategy", "local_sgd", "--replicas", "4", "--period", "2"]),
                           ("sharded", ["--strategy", "sharded", "--replicas", "4"]),
                           ("DiLoCo", ["--strategy", "diloco", "--replicas", "4", "--period", "2"]),
                           ("compressed", ["--strategy", "multi_worker_mirrored", "--replicas", "4",
                                           "--compress", "int8"])):
            with self.subTest(name=name):
                rc, out, err = self.run_example(*args, *common, env=clean_env())
                self.assertEqual(rc, 0, out + err)
                virtual = float(self.VIRTUAL.search(out)[1])
                training = float(self.TRAINING.search(out)[1])
                self.assertGreaterEqual(virtual, 0.8, out)
                self.assertGreaterEqual(training, 0.8, out)  # "%.1f": the virtual length, rounded
                self.assertLessEqual(training, virtual + 0.05, out)


class SimulatedRestart(Case):
    def test_a_rank_that_dies_and_restarts_in_virtual_time_rejoins(self):
        # The simulator: rank 2 of 4 dies at 20 ms of virtual time and its replacement starts
        # at 60 ms (restart=, as gradwire-run --max-restarts starts one): the survivors take it
        # back, and all four end with one hash.
        rc, out, err = self.run_example("--strategy", "mirrored", "--transport", "simulated", "--replicas", "4",
                                        "--epochs", "10", "--batch", "8", "--min-replicas", "2",
                                        "--cluster", "hosts=4 latency=50us bandwidth=1Gbit compute=modelled "
                                                     "die=2@20ms restart=2@60ms",
                                        "--step-compute", "0.001", env=clean_env())
        self.assertEqual(rc, 0, out + err)
        hashes = {int(r): h for r, h in FinalParameterHash.HASH.findall(out)}
        self.assertEqual(sorted(hashes), [0, 1, 2, 3], out)
        self.assertEqual(len(set(hashes.values())), 1, out)
        self.assertRegex(err + out, r"rank 2 joined view 2 of 4 ranks at step \d+", out + err)


if __name__ == "__main__":
    FASHION_MNIST, GRADWIRE_RUN, LAUNCHING_MD = sys.argv[1:4]
    unittest.main(argv=[sys.argv[0]] + sys.argv[4:])
