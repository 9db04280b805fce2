"""An emulated cluster on one machine: hosts are Linux network namespaces on one bridge.

The library behind scripts/cluster, importable by tests and benchmarks:

    import sys; sys.path.insert(0, "path/to/scripts")
    import gwcluster
    with gwcluster.cluster(hosts=3, bandwidth="1gbit", name="t1") as c:
        subprocess.run(c.exec_args(1, ["ping", "-c1", c.addr(0)]))
    # always down here, also when the block raised

Layout of cluster NAME with H hosts (root only; every command is `ip` or `tc`):

    namespace gw-NAME-sw : lo, bridge br0, ports p0..p{H-1} (one per host)
    namespace gw-NAME-hI : lo (up), eth0 = 198.18.X.(I+1)/24, the other end of pI;
                           commands run there see hostname gw-NAME-hI

X comes from one free /24 of 198.18.0.0/15 (RFC 2544's benchmarking range), so several
clusters coexist and none is bridged to the machine's own network. A rate shapes both
directions of a host's link with tbf: host egress on eth0, and the switch port pI's egress
(which is traffic into the host). A partition takes eth0 down inside the host: sockets stay
open and packets vanish, as when a cable is pulled. A cut between two hosts makes each resolve
the other's address to a MAC no host has (a permanent neighbour entry, made again when a
partition heals, as a link going down drops it): the bridge delivers those frames to itself,
which has no address, so only that pair loses touch. State (subnet, hosts, rates, partitions,
cuts) lives in /run/gradwire-cluster/NAME.json; every operation holds a lock so that concurrent calls (ctest
-j) do not pick the same subnet.
"""
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import signal
import subprocess
import time

STATE_DIR = "/run/gradwire-cluster"
DEFAULT_NAME = "gw"
SPACE = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544: benchmarking, never routed
MAX_HOSTS = 250
NOWHERE_MAC = "02:00:00:00:00:00"  # locally administered; a cut pair resolves each other to it
NAME_RE = re.compile(r"^[A-Za-z0-9_.]{1,32}$")
# tc's rate units (tc(8)): bits and bytes per second, SI and IEC prefixes.
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "kibit": 1024, "mibit": 1024 ** 2, "gibit": 1024 ** 3, "tibit": 1024 ** 4,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
          "kibps": 8 * 1024, "mibps": 8 * 1024 ** 2, "gibps": 8 * 1024 ** 3, "tibps": 8 * 1024 ** 4}
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)([a-z]*)$")


class ClusterError(Exception):
    """A problem the user can fix; the message says how."""


def parse_rate(rate):
    """Bits per second of a tc rate ("1gbit", "100mbit", "125mbps"), or None for "none"."""
    text = str(rate).strip().lower()
    if text in ("none", "off", ""):
        return None
    m = _RATE_RE.match(text)
    if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise ClusterError(f"bad rate {rate!r}: give a positive number with a tc unit "
                           f"(bit, kbit, mbit, gbit, tbit, or bps, kbps, mbps, gbps for bytes/s), e.g. 1gbit; "
                           f"or none")
    bits = float(m.group(1)) * _UNITS[m.group(2)]
    if bits < 8000:
        raise ClusterError(f"bad rate {rate!r}: tbf needs at least 8kbit")
    return bits


def _run(*cmd, check=True, capture=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE, text=True)
    if check and p.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p


def check_root():
    if os.geteuid() != 0:
        raise ClusterError("needs root: ip netns (network namespaces, veth pairs and bridges need CAP_SYS_ADMIN "
                           "and CAP_NET_ADMIN); run it with sudo")


def namespaces():
    """Names of the network namespaces that exist (ip netns)."""
    try:
        return set(os.listdir("/run/netns"))
    except FileNotFoundError:
        return set()


def support_problem():
    """None if this machine can make clusters, else why not (for tests: exit 77 and say it)."""
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    probe = f"gw-probe{os.getpid()}"
    try:
        p = _run("ip", "netns", "add", probe, check=False)
        if p.returncode != 0:
            return f"`ip netns add` fails here: {p.stderr.strip()}"
        p = _run("ip", "-n", probe, "link", "add", "eth0", "type", "veth", "peer", "name", "p0", check=False)
        if p.returncode != 0:
            return f"no veth pairs here: {p.stderr.strip()}"
        p = _run("ip", "-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if p.returncode != 0:
            return f"no bridges here: {p.stderr.strip()}"
    except FileNotFoundError:
        return "iproute2's `ip` is not installed"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


@contextlib.contextmanager
def _locked():
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Cluster:
    """Cluster NAME: its namespaces, addresses and links. Methods raise ClusterError."""

    def __init__(self, name=DEFAULT_NAME):
        if not NAME_RE.match(name or ""):
            raise ClusterError(f"bad cluster name {name!r}: use 1 to 32 letters, digits, '_' or '.'")
        self.name = name

    # --- names --------------------------------------------------------------------
    def host_ns(self, host):
        """The namespace of host `host` (also its host name for mpirun's rsh agent)."""
        return f"gw-{self.name}-h{host}"

    @property
    def switch_ns(self):
        return f"gw-{self.name}-sw"

    @property
    def state_path(self):
        return os.path.join(STATE_DIR, self.name + ".json")

    # --- state --------------------------------------------------------------------
    def state(self):
        """The saved state, or None when this cluster is not up."""
        try:
            with open(self.state_path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _save(self, state):
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, self.state_path)

    def _require(self):
        s = self.state()
        if s is None or self.switch_ns not in namespaces():
            raise ClusterError(f"cluster {self.name!r} is not up: run `scripts/cluster up --hosts H --name {self.name}`")
        return s

    def _check_host(self, s, host):
        try:
            host = int(host)
        except (TypeError, ValueError):
            raise ClusterError(f"bad host {host!r}: give a host index 0..{s['hosts'] - 1}") from None
        if not 0 <= host < s["hosts"]:
            raise ClusterError(f"unknown host {host}: cluster {self.name!r} has hosts 0..{s['hosts'] - 1}")
        return host

    @property
    def hosts(self):
        return self._require()["hosts"]

    def _subnet(self, s):
        return ipaddress.ip_network(s["subnet"])

    def addr(self, host):
        """Host `host`'s IPv4 address (a string)."""
        s = self._require()
        host = self._check_host(s, host)
        return self._address(s, host)

    def _address(self, s, host):
        """Host `host`'s address in state `s` (no state read: for callers holding the lock)."""
        return str(self._subnet(s).network_address + host + 1)

    def addresses(self):
        return [self.addr(h) for h in range(self.hosts)]

    @staticmethod
    def _subnets_in_use():
        used = set()
        for f in os.listdir(STATE_DIR):
            if f.endswith(".json"):
                try:
                    with open(os.path.join(STATE_DIR, f)) as fh:
                        used.add(json.load(fh)["subnet"])
                except (OSError, ValueError, KeyError):
                    pass
        return used

    # --- up -----------------------------------------------------------------------
    def up(self, hosts, bandwidth=None):
        """Makes (or repairs) a cluster of `hosts` hosts; links shaped at `bandwidth` (None: unshaped).

        Idempotent: hosts that exist are kept, missing ones made, extra ones removed."""
        check_root()
        if not 1 <= int(hosts) <= MAX_HOSTS:
            raise ClusterError(f"--hosts {hosts}: give 1..{MAX_HOSTS} hosts")
        hosts = int(hosts)
        parse_rate(bandwidth if bandwidth is not None else "none")  # fail before changing anything
        with _locked():
            s = self.state()
            if s is None:
                used = self._subnets_in_use()
                free = next((str(n) for n in SPACE.subnets(new_prefix=24) if str(n) not in used), None)
                if free is None:
                    raise ClusterError("all 512 /24 subnets of 198.18.0.0/15 are taken: `scripts/cluster down` some")
                s = {"name": self.name, "subnet": free, "hosts": 0, "rates": {}}
                self._save(s)  # the subnet is ours from now on, even if a step below fails
            existing = namespaces()
            sw = self.switch_ns
            if sw not in existing:
                _run("ip", "netns", "add", sw)
            _run("ip", "-n", sw, "link", "set", "lo", "up")
            if _run("ip", "-n", sw, "link", "show", "br0", check=False).returncode != 0:
                # No STP: a star of veths has no loops; forward_delay 0 forwards at once.
                _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
            _run("ip", "-n", sw, "link", "set", "br0", "up")
            # Frames to a cut pair's MAC end at the bridge itself (no address there: dropped)
            # instead of flooding every port, where they would take from the hosts' shaped rates.
            _run("bridge", "-n", sw, "fdb", "replace", NOWHERE_MAC, "dev", "br0", "self", "local")
            for h in range(hosts, max(s["hosts"], hosts) + 1):  # shrinking: the extra hosts go
                self._remove_host(h)
                s["rates"].pop(str(h), None)
            for pair in list(s.get("cuts", [])):  # a cut to a removed host goes with it
                a, b = (int(x) for x in pair.split("-"))
                if b >= hosts:
                    _run("ip", "-n", self.host_ns(a), "neigh", "del", self._address(s, b), "dev", "eth0", check=False)
                    s["cuts"].remove(pair)
            subnet = self._subnet(s)
            for h in range(hosts):
                self._make_host(h, f"{subnet.network_address + h + 1}/{subnet.prefixlen}")
            s["hosts"] = hosts
            for h in range(hosts):
                s["rates"][str(h)] = bandwidth if parse_rate(bandwidth or "none") else None
                self._apply_rate(h, s["rates"][str(h)])
                self._apply_cuts(s, h)  # a host made again has no neighbour entries
            self._save(s)
        return s

    def _make_host(self, h, cidr):
        ns, port, sw = self.host_ns(h), f"p{h}", self.switch_ns
        if ns not in namespaces():
            _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        if _run("ip", "-n", ns, "link", "show", "eth0", check=False).returncode != 0:
            _run("ip", "-n", sw, "link", "del", port, check=False)  # a half-made pair from a failed run
            # Made inside the host, so no name is ever taken in the root namespace.
            _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", sw)
        _run("ip", "-n", sw, "link", "set", port, "master", "br0")
        _run("ip", "-n", sw, "link", "set", port, "up")
        _run("ip", "-n", ns, "addr", "replace", cidr, "dev", "eth0")
        if not self._partitioned(h):
            _run("ip", "-n", ns, "link", "set", "eth0", "up")

    def _remove_host(self, h):
        ns = self.host_ns(h)
        if ns in namespaces():
            self._kill_inside(ns)
            _run("ip", "netns", "del", ns, check=False)
        # The port goes with its peer, unless a process kept the host's namespace alive.
        _run("ip", "-n", self.switch_ns, "link", "del", f"p{h}", check=False)

    @staticmethod
    def _kill_inside(ns, grace=2.0):
        """Stops what still runs in namespace `ns`: it would keep the namespace and its link alive."""
        def pids():
            p = _run("ip", "netns", "pids", ns, check=False)
            return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []
        left = pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while left and time.monotonic() < deadline:
                time.sleep(0.05)
                left = pids()
            if not left:
                return

    # --- shaping ------------------------------------------------------------------
    def _apply_rate(self, h, rate):
        """tbf at `rate` on both ends of host h's link (None: no qdisc)."""
        bits = parse_rate(rate or "none")
        for ns, dev in ((self.host_ns(h), "eth0"), (self.switch_ns, f"p{h}")):
            if bits is None:
                _run("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
                continue
            # burst: 1 ms at the rate, at least 64 KiB + a frame, so that one GSO super-packet
            # passes whole (tbf would cut it up otherwise); a queue of 20 ms at the rate
            # (at least 256 KiB) keeps the pipe full without a long standing delay.
            burst = max(int(bits / 8 / 1000), 65536 + 1514)
            limit = max(int(bits / 8 * 0.020), 262144)
            _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                 "rate", str(int(bits)) + "bit", "burst", str(burst), "limit", str(limit))

    def _qdisc(self, h):
        p = _run("tc", "-n", self.host_ns(h), "qdisc", "show", "dev", "eth0", check=False)
        return p.stdout

    def shape(self, host, rate):
        """(Re)shapes host `host`'s link in both directions at `rate` ("none": unshaped)."""
        check_root()
        bits = parse_rate(rate)
        with _locked():
            s = self._require()
            host = self._check_host(s, host)
            s["rates"][str(host)] = rate if bits else None
            self._apply_rate(host, s["rates"][str(host)])
            self._save(s)

    # --- partitions ---------------------------------------------------------------
    def _partitioned(self, h):
        s = self.state() or {}
        return str(h) in s.get("partitioned", [])

    def partition(self, host):
        """Takes host `host`'s eth0 down: its sockets stay open, its packets vanish both ways."""
        check_root()
        with _locked():
            s = self._require()
            host = self._check_host(s, host)
            _run("ip", "-n", self.host_ns(host), "link", "set", "eth0", "down")
            s["partitioned"] = sorted(set(s.get("partitioned", [])) | {str(host)})
            self._save(s)

    def heal(self, host):
        """Brings host `host`'s eth0 up again (and its shaping back if the qdisc went)."""
        check_root()
        with _locked():
            s = self._require()
            host = self._check_host(s, host)
            _run("ip", "-n", self.host_ns(host), "link", "set", "eth0", "up")
            rate = s["rates"].get(str(host))
            if rate and "tbf" not in self._qdisc(host):
                self._apply_rate(host, rate)
            self._apply_cuts(s, host)  # a link taken down drops its neighbour entries, permanent ones too
            s["partitioned"] = sorted(set(s.get("partitioned", [])) - {str(host)})
            self._save(s)

    def cut(self, a, b):
        """Cuts the path between hosts `a` and `b` only: each resolves the other's address to a
        MAC no host has, so their packets vanish both ways (sockets stay open) while both still
        reach every other host, as when one route between two racks fails."""
        self._set_cut(a, b, True)

    def mend(self, a, b):
        """Undoes cut(a, b): both resolve each other's address again."""
        self._set_cut(a, b, False)

    def _set_cut(self, a, b, on):
        check_root()
        with _locked():
            s = self._require()
            a, b = sorted((self._check_host(s, a), self._check_host(s, b)))
            if a == b:
                raise ClusterError(f"cut {a} {b}: give two different hosts (`partition {a}` cuts one host off all)")
            for here, there in ((a, b), (b, a)):
                if on:
                    self._resolve_nowhere(s, here, there)
                else:
                    _run("ip", "-n", self.host_ns(here), "neigh", "del", self._address(s, there), "dev", "eth0",
                         check=False)
            cuts = set(s.get("cuts", [])) - {f"{a}-{b}"}
            s["cuts"] = sorted(cuts | ({f"{a}-{b}"} if on else set()))
            self._save(s)

    def _resolve_nowhere(self, s, here, there):
        _run("ip", "-n", self.host_ns(here), "neigh", "replace", self._address(s, there), "lladdr", NOWHERE_MAC,
             "nud", "permanent", "dev", "eth0")

    def _apply_cuts(self, s, h):
        """Makes host `h`'s side of every cut of it in state `s` hold (again)."""
        for other in self._cut_from(h, s):
            if other < s["hosts"]:
                self._resolve_nowhere(s, h, other)

    def _cut_from(self, h, s=None):
        s = s if s is not None else (self.state() or {})
        pairs = [tuple(int(x) for x in c.split("-")) for c in s.get("cuts", [])]
        return sorted({y if x == h else x for x, y in pairs if h in (x, y)})

    # --- running things -------------------------------------------------------------
    def exec_args(self, host, cmd):
        """The argv that runs `cmd` (a list) inside host `host` (for subprocess).

        The command also gets its own UTS namespace with the host's name as hostname, so that
        every emulated host has its own name, as real hosts do: OpenMPI, for one, names its
        shared-memory segments after the hostname, and ranks of two hosts with one name
        collide. Every step execs, so the command keeps the pid the caller sees."""
        s = self._require()
        host = self._check_host(s, host)
        return in_namespace(self.host_ns(host), cmd)

    def run(self, host, cmd, **kwargs):
        """subprocess.run of `cmd` inside host `host`."""
        return subprocess.run(self.exec_args(host, cmd), **kwargs)

    def popen(self, host, cmd, **kwargs):
        """subprocess.Popen of `cmd` inside host `host`."""
        return subprocess.Popen(self.exec_args(host, cmd), **kwargs)

    # --- down and status --------------------------------------------------------------
    def down(self):
        """Removes every namespace of this cluster (stopping what runs in them) and its state. Idempotent."""
        check_root()
        with _locked():
            prefix = f"gw-{self.name}-"
            mine = re.compile(re.escape(prefix) + r"(h\d+|sw)$")
            for ns in sorted(namespaces()):
                if mine.match(ns):
                    self._kill_inside(ns)
                    _run("ip", "netns", "del", ns, check=False)
            for path in (self.state_path, self.state_path + ".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)

    def status(self):
        """A few lines: subnet, and per host its address, link state and shaping."""
        s = self.state()
        if s is None:
            left = sorted(ns for ns in namespaces() if ns.startswith(f"gw-{self.name}-"))
            extra = f" (but namespaces {', '.join(left)} exist: `scripts/cluster down --name {self.name}`)" if left else ""
            return f"cluster {self.name}: not up{extra}"
        lines = [f"cluster {self.name}: {s['hosts']} hosts on {s['subnet']}, switch namespace {self.switch_ns}"]
        existing = namespaces()
        for h in range(s["hosts"]):
            ns = self.host_ns(h)
            if ns not in existing:
                lines.append(f"  host {h}: {ns} MISSING (run `scripts/cluster up` again to repair)")
                continue
            link = _run("ip", "-n", ns, "-br", "link", "show", "eth0", check=False).stdout.split()
            state = link[1] if len(link) > 1 else "missing"
            if self._partitioned(h):
                state += " (partitioned)"
            cut = self._cut_from(h)
            if cut:
                state += f" (cut from host{'s' if len(cut) > 1 else ''} {', '.join(map(str, cut))})"
            rate = s["rates"].get(str(h)) or "unshaped"
            lines.append(f"  host {h}: {ns} {self.addr(h)} eth0 {state}, {rate}")
        return "\n".join(lines)


def descendants(pids):
    """Every process below `pids` (from /proc), children first found first: what a launcher
    started inside a host, to signal them (tests/cluster_ns, benchmarks/elastic_trials.py)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def in_namespace(ns, cmd):
    """argv running `cmd` in network namespace `ns` with hostname `ns` (see Cluster.exec_args)."""
    return ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', ns] + list(cmd)


def all_clusters():
    """Names of the clusters that have state."""
    try:
        return sorted(f[:-5] for f in os.listdir(STATE_DIR) if f.endswith(".json"))
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def cluster(hosts, bandwidth=None, name=DEFAULT_NAME):
    """`with cluster(3, "1gbit", name="t") as c:` a cluster that is always taken down afterwards."""
    c = Cluster(name)
    try:
        c.up(hosts, bandwidth)
        yield c
    finally:
        c.down()
