#!/usr/bin/env python3
"""scripts/cluster: hosts, addresses, reachability, shaping, partitions, coexisting clusters,
idempotency, teardown, errors. Root only: exits 77 (skipped) where namespaces cannot be made.

    test_cluster.py [unittest args]
"""
import ipaddress
import json
import os
import subprocess
import sys
import time
import unittest

import cluster_support as cs

gwcluster = cs.gwcluster
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tcp_probe.py")


def cli(*args, timeout=30):
    """Runs scripts/cluster; returns (status, stdout, stderr)."""
    p = subprocess.run([sys.executable, cs.CLUSTER, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Server:
    """tcp_probe.py listen inside a host, until closed."""

    def __init__(self, c, host, addr, port):
        self.proc = c.popen(host, [sys.executable, PROBE, "listen", addr, str(port)], stdout=subprocess.PIPE,
                            text=True)
        assert self.proc.stdout.readline().strip() == "listening"

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def connect(c, host, addr, port, timeout):
    """tcp_probe.py connect from inside `host`: (status, output)."""
    p = c.run(host, [sys.executable, PROBE, "connect", addr, str(port), str(timeout)], capture_output=True,
              text=True, timeout=timeout + 10)
    return p.returncode, p.stdout


_UDP_RECEIVE = "import socket,sys; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind((sys.argv[1],5004)); " \
               "print('bound',flush=True); s.settimeout(1.5)\ntry: print(s.recv(16).decode())\nexcept OSError: print('none')"


def one_way(c, src, dst):
    """Whether a UDP datagram from host `src` reaches host `dst` (no answer needed: one direction only)."""
    rx = c.popen(dst, [sys.executable, "-c", _UDP_RECEIVE, c.addr(dst)], stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "bound"
        send = "import socket,sys,time\nfor _ in range(5): socket.socket(socket.AF_INET,socket.SOCK_DGRAM)" \
               ".sendto(b'here',(sys.argv[1],5004)); time.sleep(0.1)"
        c.run(src, [sys.executable, "-c", send, c.addr(dst)], check=True, timeout=10)
        return rx.stdout.readline().strip() == "here"
    finally:
        rx.kill()
        rx.wait()
        rx.stdout.close()


def qdiscs(ns, dev):
    return subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout


class ThreeHosts(unittest.TestCase):
    """One cluster of three hosts at 1gbit for the cases that only look at it."""

    @classmethod
    def setUpClass(cls):
        cls.stack = cs.emulated_cluster(3, bandwidth="1gbit", tag="cl")
        cls.c = cls.stack.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.stack.__exit__(None, None, None)
        cls.assert_gone(cls.c)

    @staticmethod
    def assert_gone(c):
        left = [ns for ns in gwcluster.namespaces() if ns.startswith(f"gw-{c.name}-")]
        assert not left, f"namespaces left after down: {left}"
        assert not os.path.exists(c.state_path)

    def test_addresses_links_and_hostnames(self):
        c = self.c
        subnet = ipaddress.ip_network(c.state()["subnet"])
        self.assertTrue(subnet.subnet_of(ipaddress.ip_network("198.18.0.0/15")))
        for h in range(3):
            code, out, err = cli("addr", str(h), "--name", c.name)
            self.assertEqual(code, 0, err)
            self.assertEqual(out.strip(), str(subnet.network_address + h + 1))
            links = c.run(h, ["ip", "-br", "-4", "addr"], capture_output=True, text=True).stdout.split("\n")
            links = sorted(line.split()[0].split("@")[0] for line in links if line.strip())
            self.assertEqual(links, ["eth0", "lo"], "a host sees only lo and its link")
            self.assertIn(f"{c.addr(h)}/24", c.run(h, ["ip", "-4", "addr", "show", "eth0"], capture_output=True,
                                                  text=True).stdout)
            self.assertEqual(c.run(h, ["hostname"], capture_output=True, text=True).stdout.strip(), c.host_ns(h))

    def test_tcp_between_hosts_and_over_each_hosts_loopback(self):
        c = self.c
        for server_host, client_host, addr in ((1, 0, c.addr(1)), (2, 1, c.addr(2)), (0, 2, c.addr(0)),
                                               (1, 1, "127.0.0.1")):
            with self.subTest(server=server_host, client=client_host, addr=addr):
                s = Server(c, server_host, addr, 5001)
                try:
                    code, out = connect(c, client_host, addr, 5001, 5)
                    self.assertEqual(code, 0, out)
                finally:
                    s.close()

    def test_stream_between_hosts(self):
        c = self.c
        server = c.popen(1, [sys.executable, PROBE, "serve", c.addr(1), "5003"], stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(server.stdout.readline().strip(), "listening")
            sent = c.run(0, [sys.executable, PROBE, "send", c.addr(1), "5003", "0.3"], capture_output=True,
                         text=True, timeout=30)
            self.assertEqual(sent.returncode, 0, sent.stderr)
            received = server.stdout.readline()
            # Every byte arrived (the rate is for benchmarks, not for a pass/fail test).
            self.assertEqual(sent.stdout.split()[1], received.split()[1], (sent.stdout, received))
        finally:
            server.kill()
            server.wait()
            server.stdout.close()

    def test_shaping_both_ends_reshape_and_none(self):
        c = self.c
        for h in range(3):
            self.assertIn("tbf", qdiscs(c.host_ns(h), "eth0"))
            self.assertIn("rate 1Gbit", qdiscs(c.host_ns(h), "eth0"))
            self.assertIn("rate 1Gbit", qdiscs(c.switch_ns, f"p{h}"))
        code, _, err = cli("shape", "2", "10gbit", "--name", c.name)
        self.assertEqual(code, 0, err)
        self.assertIn("rate 10Gbit", qdiscs(c.host_ns(2), "eth0"))
        self.assertIn("rate 10Gbit", qdiscs(c.switch_ns, "p2"))
        self.assertIn("10gbit", cli("status", "--name", c.name)[1])
        code, _, err = cli("shape", "2", "none", "--name", c.name)
        self.assertEqual(code, 0, err)
        self.assertNotIn("tbf", qdiscs(c.host_ns(2), "eth0"))
        self.assertNotIn("tbf", qdiscs(c.switch_ns, "p2"))
        self.assertIn("rate 1Gbit", qdiscs(c.host_ns(1), "eth0"), "other hosts keep their shaping")
        c.shape(2, "1gbit")

    def test_partition_makes_connects_time_out_and_heal_restores(self):
        c = self.c
        s = Server(c, 1, c.addr(1), 5002)
        try:
            self.assertEqual(connect(c, 0, c.addr(1), 5002, 5)[0], 0)
            code, _, err = cli("partition", "1", "--name", c.name)
            self.assertEqual(code, 0, err)
            self.assertIn("partitioned", cli("status", "--name", c.name)[1])
            start = time.monotonic()
            code, out = connect(c, 0, c.addr(1), 5002, 1.5)
            # No RST, no ICMP: the packets vanish and only the caller's own deadline ends the wait.
            self.assertEqual(code, 3, out)
            self.assertIn("timed out", out)
            self.assertGreater(time.monotonic() - start, 1.4)
            self.assertEqual(connect(c, 2, c.addr(1), 5002, 1.0)[0], 3, "no host reaches a partitioned one")
            code, _, err = cli("heal", "1", "--name", c.name)
            self.assertEqual(code, 0, err)
            code, out = connect(c, 0, c.addr(1), 5002, 5)
            self.assertEqual(code, 0, out)
            self.assertIn("rate 1Gbit", qdiscs(c.host_ns(1), "eth0"), "healing keeps the shaping")
            self.assertNotIn("partitioned", cli("status", "--name", c.name)[1])
        finally:
            c.heal(1)
            s.close()

    def test_cut_parts_one_pair_only_and_mend_restores(self):
        c = self.c
        servers = [Server(c, h, c.addr(h), 5003) for h in (0, 1)]
        try:
            code, _, err = cli("cut", "0", "1", "--name", c.name)
            self.assertEqual(code, 0, err)
            status = cli("status", "--name", c.name)[1]
            self.assertRegex(status, r"host 0: .* \(cut from host 1\)", status)
            self.assertRegex(status, r"host 1: .* \(cut from host 0\)", status)
            self.assertNotRegex(status, r"host 2: .*cut", status)
            code, out = connect(c, 0, c.addr(1), 5003, 1.5)
            self.assertEqual(code, 3, out)  # vanished, as in a partition: only the deadline ends it
            self.assertIn("timed out", out)
            self.assertEqual(connect(c, 2, c.addr(1), 5003, 5)[0], 0, "the cut host still reaches the others")
            self.assertEqual(connect(c, 1, c.addr(0), 5003, 1.0)[0], 3, "both ways")
            # A partition and its healing keep the cut (a link going down drops neighbour entries).
            self.assertEqual(cli("partition", "0", "--name", c.name)[0], 0)
            self.assertEqual(cli("heal", "0", "--name", c.name)[0], 0)
            self.assertEqual(connect(c, 2, c.addr(0), 5003, 5)[0], 0, "healed")
            self.assertFalse(one_way(c, 0, 1), "still cut from host 0 to host 1")
            self.assertFalse(one_way(c, 1, 0), "and from host 1 to host 0")
            self.assertTrue(one_way(c, 2, 0), "the probe itself works")
            code, _, err = cli("mend", "1", "0", "--name", c.name)  # either order names the pair
            self.assertEqual(code, 0, err)
            self.assertEqual(connect(c, 0, c.addr(1), 5003, 5)[0], 0)
            self.assertEqual(connect(c, 1, c.addr(0), 5003, 5)[0], 0)
            self.assertNotIn("cut from", cli("status", "--name", c.name)[1])
        finally:
            c.heal(0)
            c.mend(0, 1)
            for s in servers:
                s.close()

    def test_errors(self):
        c = self.c
        cases = [
            (("addr", "3", "--name", c.name), 1, "unknown host 3: cluster"),
            (("exec", "7", "--name", c.name, "--", "true"), 1, "unknown host 7"),
            (("shape", "0", "fast", "--name", c.name), 1, "bad rate 'fast'"),
            (("partition", "x", "--name", c.name), 1, "bad host 'x'"),
            (("cut", "1", "1", "--name", c.name), 1, "give two different hosts"),
            (("cut", "0", "5", "--name", c.name), 1, "unknown host 5"),
            (("addr", "0", "--name", "nosuch"), 1, "cluster 'nosuch' is not up"),
            (("up", "--hosts", "2", "--name", "bad-name"), 1, "bad cluster name"),
            (("up", "--hosts", "0", "--name", "zero"), 1, "--hosts 0"),
            (("exec", "0", "--name", c.name, "true"), 2, "give the command after --"),
        ]
        for args, status, message in cases:
            with self.subTest(args=args):
                code, _, err = cli(*args)
                self.assertEqual(code, status, err)
                self.assertIn(message, err)
        self.assertNotIn("nosuch.json", os.listdir(gwcluster.STATE_DIR))
        # exec passes the command's status through.
        self.assertEqual(cli("exec", "1", "--name", c.name, "--", "sh", "-c", "exit 7")[0], 7)

    def test_not_root(self):
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
        p = subprocess.run(nobody + ["-c", "import os; os.stat(%r)" % cs.CLUSTER], capture_output=True)
        if p.returncode != 0:
            self.skipTest("user nobody cannot read scripts/cluster here")
        p = subprocess.run(nobody + [cs.CLUSTER, "up", "--hosts", "2", "--name", "nobody"], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("needs root: ip netns", p.stderr)


class Lifecycle(unittest.TestCase):
    def test_two_clusters_coexist_and_up_and_down_are_idempotent(self):
        a, b = gwcluster.Cluster(cs.unique_name("ca")), gwcluster.Cluster(cs.unique_name("cb"))
        try:
            code, out, err = cli("up", "--hosts", "2", "--name", a.name)
            self.assertEqual(code, 0, err)
            self.assertIn(f"cluster {a.name}: 2 hosts", out)
            self.assertEqual(cli("up", "--hosts", "2", "--bandwidth", "100mbit", "--name", b.name)[0], 0)
            self.assertNotEqual(a.state()["subnet"], b.state()["subnet"])
            subnet = a.state()["subnet"]
            # Again: nothing changes but what was asked (the rate), the subnet stays.
            self.assertEqual(cli("up", "--hosts", "2", "--bandwidth", "1gbit", "--name", a.name)[0], 0)
            self.assertEqual(a.state()["subnet"], subnet)
            self.assertIn("rate 1Gbit", qdiscs(a.host_ns(1), "eth0"))
            # Each cluster's hosts reach each other; the other cluster is another network.
            for c in (a, b):
                s = Server(c, 1, c.addr(1), 6000)
                try:
                    self.assertEqual(connect(c, 0, c.addr(1), 6000, 5)[0], 0)
                finally:
                    s.close()
            self.assertEqual(connect(a, 0, b.addr(1), 6000, 1)[0], 3)
            # Growing and shrinking.
            self.assertEqual(cli("up", "--hosts", "3", "--name", a.name)[0], 0)
            self.assertIn(a.host_ns(2), gwcluster.namespaces())
            self.assertEqual(cli("cut", "0", "2", "--name", a.name)[0], 0)
            subprocess.run(["ip", "netns", "del", a.host_ns(2)], check=True)  # a host lost: `up` repairs it, cut
            self.assertEqual(cli("up", "--hosts", "3", "--name", a.name)[0], 0)
            self.assertFalse(one_way(a, 2, 0), "a host made again keeps its cuts")
            self.assertTrue(one_way(a, 2, 1))
            self.assertEqual(cli("up", "--hosts", "1", "--name", a.name)[0], 0)
            self.assertEqual(a.state().get("cuts"), [], "a cut to a removed host goes with it")
            self.assertNotIn("PERMANENT", subprocess.run(["ip", "-n", a.host_ns(0), "neigh", "show"], capture_output=True,
                                                         text=True).stdout)
            self.assertNotIn(a.host_ns(1), gwcluster.namespaces())
            self.assertEqual(a.hosts, 1)
            # down stops what still runs inside, removes everything, and may be repeated.
            sleeper = b.popen(0, ["sleep", "60"])
            code, _, err = cli("down", "--name", b.name)
            self.assertEqual(code, 0, err)
            self.assertIsNotNone(sleeper.wait(timeout=10))
            self.assertEqual(cli("down", "--name", b.name)[0], 0)
            self.assertFalse([ns for ns in gwcluster.namespaces() if ns.startswith(f"gw-{b.name}-")])
            self.assertFalse(os.path.exists(b.state_path))
            self.assertIn("not up", cli("status", "--name", b.name)[1])
            self.assertEqual(a.hosts, 1, "the other cluster is untouched")
            self.assertIn(a.name, cli("status", "--all")[1])
        finally:
            a.down()
            b.down()

    def test_context_manager_takes_the_cluster_down_when_the_block_fails(self):
        name = cs.unique_name("cx")
        with self.assertRaises(RuntimeError):
            with gwcluster.cluster(2, name=name) as c:
                self.assertEqual(len(c.addresses()), 2)
                raise RuntimeError("a failing test")
        self.assertFalse([ns for ns in gwcluster.namespaces() if ns.startswith(f"gw-{name}-")])
        self.assertNotIn(name + ".json", os.listdir(gwcluster.STATE_DIR))


if __name__ == "__main__":
    cs.require_namespaces()
    unittest.main(verbosity=2)
