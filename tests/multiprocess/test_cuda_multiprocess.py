#!/usr/bin/env python3
"""Multi-process training with CUDA tensors: real ranks on loopback TCP, each on the GPU.

    test_cuda_multiprocess.py LAUNCHER MP_CUDA_WORKER [unittest args]

Exits 77 (ctest: skipped, never passed) when the machine has no CUDA device. The ranks
share the machine's GPU(s); every case bounds its own time.
"""
import os
import subprocess
import sys
import unittest

from mp_support import rank_lines

LAUNCHER, WORKER = sys.argv[1], sys.argv[2]


def run(ranks, mode, servers=0, bound=90):
    # The launcher stops every rank after `bound` seconds; the outer timeout only backs it up.
    cmd = [LAUNCHER, "-n", str(ranks), "--timeout", str(bound)] + (["--ps", str(servers)] if servers else [])
    cmd += ["--", WORKER, mode]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=bound + 30,
                       env=dict(os.environ, GRADWIRE_TIMEOUT="60"))
    lines = rank_lines(p.stdout)
    return p.returncode, lines, p.stdout


class CudaMultiprocess(unittest.TestCase):
    def check_pass(self, ranks, mode, servers=0):
        status, lines, out = run(ranks, mode, servers)
        self.assertEqual(status, 0, out)
        for r in range(ranks + servers):
            self.assertTrue(any("PASS" in l for l in lines.get(r, [])), f"rank {r} did not pass:\n{out}")

    def test_multi_worker_mirrored_equals_one_device_on_the_mean_gradient(self):
        for n, mode in ((2, "mirrored-adam"), (3, "mirrored-momentum")):
            with self.subTest(ranks=n, mode=mode):
                self.check_pass(n, mode)

    def test_central_storage_and_local_sgd(self):
        for n, mode in ((3, "central-adam"), (2, "local-sgd")):
            with self.subTest(ranks=n, mode=mode):
                self.check_pass(n, mode)

    def test_parameter_server_sync_with_device_workers_and_servers(self):
        self.check_pass(2, "ps-sync", servers=1)


if __name__ == "__main__":
    probe = subprocess.run([WORKER, "probe"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode == 77:
        print(f"{WORKER}: no CUDA device here: the multi-process GPU tests did not run (ctest reports them as "
              "skipped); run them on a machine with a GPU (ctest -L gpu).")
        sys.exit(77)
    if probe.returncode != 0:
        sys.exit(f"{WORKER} probe failed:\n{probe.stdout}")
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
