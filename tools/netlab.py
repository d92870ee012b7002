#!/usr/bin/env python
"""Emulated hosts on one machine: network namespaces, shaped links, and mpiexec across them.

Command line (needs root; exits with the command's status)::

    python tools/netlab.py --hosts 4 -- python -m caffe_engine train --solver S --comm ring
    python tools/netlab.py --hosts 2 --bandwidth 100mbit -- python bench.py
    python tools/netlab.py --hosts 2 --ranks-per-host 2 --inter-bandwidth 1gbit -- python b.py
    python tools/netlab.py --hosts 8 --latency 50us -- python b.py     # 50 us one way, no netem
    python tools/netlab.py --check          # can labs be made here? one line, status 0 or 1

runs ``mpiexec -n N*R COMMAND...`` with ranks 0..R-1 on host h0, R..2R-1 on h1, and so on
(``-v`` first describes the lab on stderr). Bad flags give one line on stderr and status 2; a
missing ``mpiexec``, a loopback delay (``--latency`` with ``--inter-*``) on a kernel without
netem, or a machine where namespaces cannot be made (not root) one line and status 1. Ctrl-C,
SIGTERM or SIGHUP stops mpiexec, tears the lab down and exits with 128 + the signal's number.

API (from tests and benchmarks; load this file by path, as tests/tools/test_netlab.py does)::

    ok, why = netlab.available()        # (False, "one line") where labs cannot be made
    with netlab.Lab(hosts=2, ranks_per_host=1, bandwidth="1gbit", latency=None,
                    inter_bandwidth=None, inter_latency=None) as lab:
        lab.hosts                       # [Host(name="h0", address="198.18.0.2", netns=...), ...]
        lab.mpiexec([sys.executable, "x.py"], env=None, timeout=60,
                    capture_output=True, text=True)        # -> subprocess.CompletedProcess
        lab.run_in("h1", ["python3", "-c", "..."])         # one command inside a host
        lab.popen_in("h1", [...]), lab.command_in("h1", [...])
        lab.throughput("h0", "h1")      # bits/s of one TCP stream from h0 to h1
        lab.tx_bytes("h0")              # bytes h0 has sent on its link (the kernel's counter)
        lab.describe()                  # one line: hosts, ranks, links

Rates are bits/s (``1e9``) or tc's words (``"1gbit"``, ``"100mbit"``, ``"500kbit"``); delays are
seconds (``50e-6``) or ``"50us"``/``"2ms"``/``"1s"``; None (``none`` on the command line) leaves
that property unshaped. Errors: :class:`NetlabError` (one line) when a lab cannot be made or used,
ValueError for bad values, ``subprocess.TimeoutExpired`` from :meth:`Lab.mpiexec` (the launch is
killed first).

What a lab is
-------------
* One switch: a namespace ``cel<pid>-<n>-sw`` holding a bridge (``br0``, address 198.18.0.1).
  ``mpiexec`` runs there, so its ranks' proxies reach it over the links (``-iface br0``).
* N hosts: namespaces ``cel<pid>-<n>-h<i>``, each with loopback and ``eth0`` at 198.18.0.(2+i)/24,
  the far end of a veth pair whose near end (``h<i>``) is a port of the bridge. With a delay on
  the host links the switch is the relay instead (below): ``eth0`` and the switch's ``br0`` are
  then TUN devices, same names and addresses. Every process started in a host (by mpiexec or
  :meth:`Lab.run_in`) has its own hostname ``h<i>`` (a UTS namespace;
  ``MPI.Get_processor_name()`` and ``socket.gethostname()`` say ``h<i>``) and
  ``CAFFE_NODE=h<i>`` in its environment (the caller's own ``CAFFE_NODE`` is not passed on), so a
  hierarchical allreduce can group ranks by node.
* Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range) and exist only on interfaces
  inside the lab's own namespaces: the machine's own namespace gets no address, route, link or
  qdisc, and nothing is sent anywhere else. IPv6 is switched off inside the lab.
* Teardown (``with``-exit, :meth:`Lab.close`, at interpreter exit, or the CLI's signal handlers)
  stops the relay (if any), kills what still runs inside the lab's namespaces and deletes them,
  which deletes their links and the bridge, and removes its folder in ``$TMPDIR`` (the launcher
  script, the compiled relay). A lab left by a killed process (``kill -9``) is deleted by the
  next lab made on the machine (namespace and folder names carry the pid that made them:
  ``cel<pid>-...``, ``netlab<pid>-...``); its relay exits by itself (its stdin closes).

What each value shapes
----------------------
A host's link to the switch is the veth pair. Its rate is a token bucket (tc ``tbf``) on the
egress of *both* ends, so each direction is limited separately (full duplex): host -> switch on
the host's ``eth0``, switch -> host on the bridge port (several hosts sending to one are held to
that host's rate, as by a real switch port).

A delay on the host links (``latency``, or ``inter_latency`` in the nodes topology) is the one-way
delay from any host to any other (round trip host-to-host = 2 x delay). This kernel has no netem,
so it is made in user space, always (netem is not used for host links even where the kernel has
it: one mechanism, calibrated here): each host's ``eth0`` is a TUN device (IPv4, no ARP; TCP's 64
KiB GSO packets pass whole, ``IFF_VNET_HDR``) held by one relay process (tools/netlab_relay.c,
compiled with the system ``cc`` into the lab's folder at start; tools/netlab_relay.py where there
is no compiler), started in the switch's namespace, which also holds the switch's ``br0``. The
relay forwards each packet to the device of its destination address at read time + delay (less
its own measured cost, :data:`RELAY_OVERHEAD_S`), FIFO per output port, through a token bucket
per output port at the link rate with tbf's burst and queue (so several senders into one host
are held to its rate, as the bridge port's tbf does); tbf stays on each host's ``eth0``. It runs
SCHED_FIFO (MPI ranks busy-poll every core) and wakes :data:`RELAY_WAKE_S` before a packet's time
to spin the rest (a timer here fires 20-30 us late). It exits when the lab closes (its stdin).

* One switch (no ``inter_*``): ``bandwidth`` (default 1 Gbit/s) and ``latency`` shape every
  host's link. Ranks of one host (``ranks_per_host`` > 1) talk through MPICH's shared memory,
  unshaped, and MPI sees each host as a node (``MPI_COMM_TYPE_SHARED`` groups a host's ranks).
* Nodes (``inter_bandwidth`` and/or ``inter_latency`` given): the host links ("inter-node") take
  ``inter_bandwidth``/``inter_latency`` (a missing one: unshaped); ``bandwidth``/``latency`` shape
  the intra-node link (default: unshaped), the loopback inside each host, over which that host's
  ranks then talk TCP too (``MPIR_CVAR_NOLOCAL=1``; each rank is then its own
  ``MPI_COMM_TYPE_SHARED`` group: group by ``CAFFE_NODE`` instead). A loopback delay is tc
  ``netem`` on ``lo`` (once per packet: one way between two ranks of a host) and needs the
  kernel's netem: without it (this kernel) the lab is refused with a one-line NetlabError.

The token bucket holds ``max(rate x 4 ms, 128 KiB)``: below that burst a transfer goes faster than
the rate (smaller buckets lost 10-30 % of 1 Gbit/s here). Rates count whole frames (headers
included), so one TCP stream carries about 95 % of the rate as payload.

Transport: ranks use MPICH over TCP only, ``-genv UCX_TLS tcp`` (UCX otherwise moves data through
shared memory between any two processes of one kernel, namespaces or not: a 32 MiB allreduce at
P = 2 then took 0.05 s over "1 Gbit/s" links, and 4 MiB allreduced sent 7.6 kB on them) and
``-genv FI_PROVIDER tcp`` for the OFI netmod (``MPIR_CVAR_CH4_NETMOD=ofi``, also checked).
``mpiexec`` must be MPICH's hydra (the ``mpich`` wheel's): hosts are given as ``-hosts
addr:R,...`` and started through ``-launcher ssh -launcher-exec <a script of the lab>`` that
enters the host's namespace and runs hydra's proxy there, one proxy per host.

The emulated hosts share the machine's cores: ``caffe_engine``'s ``share_cores`` sees each host
as a machine of its own, so set ``OMP_NUM_THREADS`` (or the like) for more ranks than cores.

Measured here (2 cores shared with other work, load 2-4; kernel 6.18; MPICH 5.0.2 ch4:ucx)
-----------------------------------------------------------------------------------------
* One TCP stream h0 -> h1 (:meth:`Lab.throughput`, Python sockets, 2 s of data, 5 runs):
  100 Mbit/s links: 95.0 Mbit/s median (94.4-95.7), i.e. 11.9 MB/s; 1 Gbit/s: 952 Mbit/s
  (891-956); unshaped veth: 11.0 Gbit/s (6.2-14.3, CPU-bound).
* ``Allreduce`` of 32 MiB float32 via mpi4py, one rank per host, 1 Gbit/s links: P = 2,
  0.30-0.36 s (the bound, 32 MiB each way on every link, is 0.27 s); P = 4, 0.61-0.79 s;
  unshaped links, P = 2: 0.09-0.15 s.
* Nodes, 2 hosts x 2 ranks, intra 2 Gbit/s, inter 500 Mbit/s: one stream 1.99 Gbit/s on a
  loopback, 471 Mbit/s between hosts; a 32 MiB allreduce at P = 4, 1.02 s.
* Set-up 0.15-0.35 s, teardown 0.05 s (2 hosts).
* A delay (the relay; tools/latency_check.py, load 4-5): an MPI ping-pong of 8 B between two
  hosts gains 50.9, 208, 543 and 2046 us one way at 50 us, 200 us, 500 us and 2 ms set (within
  10 %); the relay's own cost before compensation, 12-16 us one way (MPI 8 B). Rates hold: one
  TCP stream at 1 Gbit/s and 500 us, 952 Mbit/s; at 100 Mbit/s, 97 Mbit/s. 8 hosts all sending at
  once on 1 Gbit/s: 7.27 Gbit/s summed through the C relay (veth lab 6.86, Python relay 4.27);
  unshaped, ~14 Gbit/s (CPU-bound). 8 hosts with a delay: set-up 0.2-0.3 s (compiling the
  relay included), teardown 0.3 s.
* This kernel has no ``sch_netem`` (CONFIG_NET_SCH_NETEM unset): host-link delays are the relay's
  (calibrated by tools/latency_check.py: docs/scaling.md, "Latency on the links"); a loopback
  delay raises :class:`NetlabError` saying so, its netem path is untested here.
"""
import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import namedtuple

PREFIX = "cel"
#: Namespace names: cel<pid>-<n>-sw, cel<pid>-<n>-h<i>, cel<pid>-probe.
NAME_RE = re.compile(rf"^{PREFIX}(\d+)-(?:\d+-(?:sw|h\d+)|probe)$")
#: A lab's folder (its launcher script) in the temporary directory: netlab<pid>-<random>.
DIR_RE = re.compile(r"^netlab(\d+)-\w+$")
#: The lab's /24, inside RFC 2544's 198.18.0.0/15.
SUBNET = "198.18.0"
SWITCH_ADDRESS = f"{SUBNET}.1"
MAX_HOSTS = 250
#: Token bucket: seconds of line rate it holds, and its floor in bytes (above a 64 KiB GSO frame).
BURST_S = 0.004
MIN_BURST = 128 << 10
#: Seconds of line rate a shaped link queues before it drops.
QUEUE_S = 0.025
#: netem's queue, packets (netem only delays the loopback, where the kernel has it).
NETEM_LIMIT = 10000
#: The delay relay (a lab with a delay on its host links): its C source (compiled into the lab's
#: folder with the system ``cc``), its Python fallback, and the MTU of the TUN devices it serves:
#: Ethernet's, as the veth lab's (TCP's segments and windows alike); the TUN devices take TCP's
#: 64 KiB GSO packets whole (IFF_VNET_HDR), so 1 Gbit/s is a few thousand reads/s.
RELAY_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netlab_relay.c")
RELAY_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netlab_relay.py")
RELAY_MTU = 1500
#: Seconds the relay itself adds one way (TUN, wake-up, copies) over the veth lab at delay 0,
#: taken off the hold so a set delay is the added delay (tools/latency_check.py measures it).
RELAY_OVERHEAD_S = {"c": 12e-6, "python": 20e-6}
#: The relay wakes this many seconds before a packet's time and spins the rest: a timer here
#: fires 20-30 us late (median; a VM's idle vCPU).
RELAY_WAKE_S = 40e-6
#: The relay's SCHED_FIFO priority (0: ordinary scheduling): MPI ranks busy-poll every core, and
#: an ordinary relay waited for one of them for up to 5 ms before releasing a packet.
RELAY_PRIORITY = 1
#: The MPICH environment every rank gets: TCP only, no shared memory between hosts.
MPI_TCP_ENV = {"UCX_TLS": "tcp", "FI_PROVIDER": "tcp"}
NODE_VAR = "CAFFE_NODE"
#: Host links' rate on one switch unless told (the nodes topology leaves loopbacks unshaped).
DEFAULT_BANDWIDTH = "1gbit"
UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}

Host = namedtuple("Host", "name address netns")
Host.__doc__ = "One emulated host: its name (h0, ...), IPv4 address and namespace."

_seq = 0


class NetlabError(RuntimeError):
    """A lab could not be made or used; the message is one line."""


# -- values --------------------------------------------------------------------------------------
def parse_rate(value):
    """Bits per second from ``1e9``, ``"1gbit"``, ``"100mbit"``, ``"500kbit"``, ``"1e9"``.

    Returns None for None, ``"none"`` or ``0``. Raises ValueError for anything else.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)):
        rate = float(value)
    else:
        text = str(value).strip().lower()
        if text in ("none", "0"):
            return None
        match = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(?:bit|bps|b/s)?", text)
        if not match:
            raise ValueError(f"bad rate {value!r} (want bits/s, e.g. 1gbit, 100mbit, 5e8)")
        rate = float(match.group(1)) * UNITS[match.group(2)]
    if rate < 0:
        raise ValueError(f"bad rate {value!r}: negative")
    return rate or None


def parse_time(value):
    """Seconds from ``50e-6``, ``"50us"``, ``"2ms"``, ``"1s"``; None for None, ``"none"``, 0."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        if text in ("none", "0"):
            return None
        match = re.fullmatch(r"([0-9.]+(?:e-?[0-9]+)?)\s*(s|sec|ms|msec|us|usec)", text)
        if not match:
            raise ValueError(f"bad delay {value!r} (want e.g. 50us, 2ms, 0.1s)")
        seconds = float(match.group(1)) * TIME_UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"bad delay {value!r}: negative")
    return seconds or None


def format_rate(bits):
    """``1e9`` -> ``"1 Gbit/s"``; None -> ``"unshaped"``."""
    if bits is None:
        return "unshaped"
    for unit, div in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= div:
            return f"{bits / div:g} {unit}"
    return f"{bits:g} bit/s"


def format_time(seconds):
    """``5e-5`` -> ``"50 us"``; None -> ``"no delay"``."""
    if seconds is None:
        return "no delay"
    if seconds >= 1:
        return f"{seconds:g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g} ms"
    return f"{seconds * 1e6:g} us"


# -- commands ------------------------------------------------------------------------------------
def _run(argv, check=True):
    """Run ``ip``/``tc``; raise NetlabError with its last line of stderr when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]
        raise NetlabError(f"`{' '.join(argv)}` failed: {why}")
    return done


def _netns_list():
    """Names of the namespaces ``ip netns`` knows."""
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _pid_alive(pid):
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _netns_pids(netns):
    done = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _kill_inside(namespaces, grace=1.0):
    """SIGTERM, then after ``grace`` seconds SIGKILL, every process inside ``namespaces``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for ns in namespaces for pid in _netns_pids(ns)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.02)


def _delete_namespaces(namespaces):
    """Kill what runs inside ``namespaces``, then delete them (their links and bridge go too)."""
    namespaces = [ns for ns in namespaces if ns in set(_netns_list())]
    _kill_inside(namespaces)
    for ns in namespaces:
        _run(["ip", "netns", "delete", ns], check=False)


def cleanup_leftovers():
    """Delete the namespaces (and launcher folders) of labs whose process has died; returns the
    namespaces' names."""
    dead = [ns for ns in _netns_list()
            if NAME_RE.match(ns) and not _pid_alive(int(NAME_RE.match(ns).group(1)))]
    _delete_namespaces(dead)
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        match = DIR_RE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    return dead


def available():
    """Whether labs can be made here: ``(True, "")`` or ``(False, reason in one line)``."""
    if not sys.platform.startswith("linux"):
        return False, f"no network namespaces on {sys.platform} (Linux only)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"iproute2's `{tool}` is not on PATH"
    if os.geteuid() != 0:
        return False, "not root (euid %d): network namespaces need root" % os.geteuid()
    probe = f"{PREFIX}{os.getpid()}-probe"
    done = _run(["ip", "netns", "add", probe], check=False)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"cannot make a network namespace: {why}"
    _run(["ip", "netns", "delete", probe], check=False)
    return True, ""


def default_mpiexec():
    """The ``mpiexec`` beside this Python (a venv with the ``mpich`` wheel), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def _shape(netns, dev, rate, delay=None):
    """Egress of ``dev`` in ``netns``: tbf at ``rate`` bits/s, under netem ``delay`` seconds
    (only the loopback's delay in the nodes topology uses netem; host links use the relay)."""
    tc = ["tc", "-n", netns, "qdisc", "add", "dev", dev]
    parent = ["root"]
    if delay:
        done = _run(tc + ["root", "handle", "1:", "netem", "delay", f"{delay * 1e6:.0f}us",
                          "limit", str(NETEM_LIMIT)], check=False)
        if done.returncode != 0:
            if "unknown" in done.stderr.lower():
                raise NetlabError("a delay on the intra-node link (loopback) needs the kernel's"
                                  " netem qdisc (CONFIG_NET_SCH_NETEM), which this kernel lacks;"
                                  " drop --latency there (--inter-latency works without it)")
            raise NetlabError(f"netem on {dev} failed: {done.stderr.strip()}")
        parent = ["parent", "1:1", "handle", "10:"]
    if rate:
        burst = max(int(rate / 8 * BURST_S), MIN_BURST)
        limit = burst + int(rate / 8 * QUEUE_S)
        _run(tc + parent + ["tbf", "rate", f"{int(rate)}bit", "burst", str(burst),
                            "limit", str(limit)])


# -- the lab -------------------------------------------------------------------------------------
class Lab:
    """N emulated hosts on one switch, shaped links, and ``mpiexec`` across them.

    Args:
        hosts (int): number of hosts (namespaces), 1..250.
        ranks_per_host (int): MPI ranks each host runs under :meth:`mpiexec`.
        bandwidth: bits/s (or ``"1gbit"``) of each host's link; with ``inter_*`` given, of the
            intra-node link (each host's loopback). None: unshaped. ``"default"``: 1 Gbit/s
            host links on one switch, an unshaped intra-node link in the nodes topology.
        latency: one-way delay in seconds (or ``"50us"``) added on the same links. None: none.
        inter_bandwidth, inter_latency: the host links' rate and delay in the nodes topology.
        mpiexec (str): MPICH hydra's ``mpiexec``; default :func:`default_mpiexec`.
        relay (str): the delay relay's program where the host links have a delay: ``"c"``
            (tools/netlab_relay.c, compiled with ``cc`` into the lab's folder), ``"python"``
            (tools/netlab_relay.py) or ``"auto"`` (C where ``cc`` exists).
        relay_overhead (float): seconds the relay adds one way by itself, taken off its hold;
            default :data:`RELAY_OVERHEAD_S` (measured here by tools/latency_check.py).

    Made on ``with`` (or :meth:`start`), deleted on exit (or :meth:`close`). Raises
    NetlabError when it cannot be made (not root; a loopback delay without netem),
    ValueError for bad values.
    """

    def __init__(self, hosts, ranks_per_host=1, bandwidth="default", latency=None,
                 inter_bandwidth=None, inter_latency=None, mpiexec=None, relay="auto",
                 relay_overhead=None):
        if not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be an integer in 1..{MAX_HOSTS}, not {hosts!r}")
        if not isinstance(ranks_per_host, int) or ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be a positive integer, not {ranks_per_host!r}")
        self.n_hosts = hosts
        self.ranks_per_host = ranks_per_host
        #: Nodes topology: host links take the inter_* values, loopbacks the others.
        self.nodes = inter_bandwidth is not None or inter_latency is not None
        if bandwidth == "default":
            bandwidth = None if self.nodes else DEFAULT_BANDWIDTH
        self.bandwidth, self.latency = parse_rate(bandwidth), parse_time(latency)
        self.inter_bandwidth = parse_rate(inter_bandwidth)
        self.inter_latency = parse_time(inter_latency)
        self.mpiexec_path = mpiexec
        if relay not in ("auto", "c", "python"):
            raise ValueError(f"relay must be 'auto', 'c' or 'python', not {relay!r}")
        self.relay = relay
        self.relay_overhead = relay_overhead
        #: The relay's process (a lab with a delay on its host links), and its exit report.
        self.relay_process = None
        self.relay_report = ""
        #: ``"c"`` or ``"python"``: the relay program this lab runs (None: no relay).
        self.relay_kind = None
        self.hosts = []
        self.switch = None
        self._namespaces = []
        self._dir = None
        self._launcher = None
        self._by_name = {}

    # life
    def __enter__(self):
        return self if self._namespaces else self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self):
        """Make the namespaces, links and shaping; returns self. Undone on any failure."""
        global _seq
        if self.switch is not None:
            raise NetlabError("this lab was started already (make a new Lab)")
        ok, why = available()
        if not ok:
            raise NetlabError(why)
        cleanup_leftovers()
        existing = set(_netns_list())
        while True:
            _seq += 1
            base = f"{PREFIX}{os.getpid()}-{_seq}"
            if not any(ns.startswith(base + "-") for ns in existing):
                break
        atexit.register(self.close)
        try:
            self._make(base)
        except BaseException:
            self.close()
            raise
        return self

    def _add_netns(self, name):
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        # No IPv6 (no link-local addresses or router solicitations) in the lab.
        _run(["ip", "netns", "exec", name, "sysctl", "-q", "-w",
              "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
             check=False)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _make(self, base):
        self.switch = f"{base}-sw"
        self._add_netns(self.switch)
        self._dir = tempfile.mkdtemp(prefix=f"netlab{os.getpid()}-")
        self.hosts = [Host(f"h{i}", f"{SUBNET}.{i + 2}", f"{base}-h{i}")
                      for i in range(self.n_hosts)]
        self._by_name = {host.name: host for host in self.hosts}
        for host in self.hosts:
            self._add_netns(host.netns)
        if self.link_latency:
            self._make_relayed()
        else:
            self._make_bridged()
        if self.nodes:
            for host in self.hosts:
                _shape(host.netns, "lo", self.bandwidth, self.latency)
        self._launcher = self._write_launcher()

    @property
    def link_rate(self):
        """Bits/s of each host's link to the switch (None: unshaped)."""
        return self.inter_bandwidth if self.nodes else self.bandwidth

    @property
    def link_latency(self):
        """One-way delay (seconds) of the host links: made by the relay (None: veth+bridge)."""
        return self.inter_latency if self.nodes else self.latency

    def _make_bridged(self):
        """No delay: each host's eth0 is a veth into the switch's bridge br0, tbf on both ends."""
        ip_sw = ["ip", "-n", self.switch]
        _run(ip_sw + ["link", "add", "br0", "type", "bridge"])
        _run(ip_sw + ["addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0"])
        _run(ip_sw + ["link", "set", "br0", "up"])
        for host in self.hosts:
            _run(ip_sw + ["link", "add", host.name, "type", "veth", "peer", "name", "eth0",
                          "netns", host.netns])
            _run(ip_sw + ["link", "set", host.name, "master", "br0", "up"])
            _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
            _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
            _shape(host.netns, "eth0", self.link_rate)
            _shape(self.switch, host.name, self.link_rate)

    def _make_relayed(self):
        """A delay: each host's eth0 (and the switch's br0) is a TUN device of the relay, which
        forwards by destination after the delay, at each port's rate; tbf on each host's eth0."""
        self._start_relay()
        for netns, dev, address in ([(self.switch, "br0", SWITCH_ADDRESS)]
                                    + [(h.netns, "eth0", h.address) for h in self.hosts]):
            _run(["ip", "-n", netns, "link", "set", dev, "mtu", str(RELAY_MTU), "up"])
            _run(["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", dev])
        for host in self.hosts:
            _shape(host.netns, "eth0", self.link_rate)

    def _relay_argv(self):
        """The relay's program: ``(argv, "c" or "python")``, compiling the C one if asked (with
        ``"auto"``, the Python one where there is no ``cc`` or it fails)."""
        kind = self.relay
        if kind == "auto":
            kind = "c" if shutil.which("cc") else "python"
        if kind == "python":
            return [sys.executable, RELAY_PY], kind
        if not shutil.which("cc"):
            raise NetlabError("relay='c' needs a C compiler (`cc` on PATH); use relay='python'")
        program = os.path.join(self._dir, "netlab_relay")
        done = _run(["cc", "-O2", "-o", program, RELAY_C], check=self.relay == "c")
        if done.returncode != 0:                        # auto: the Python relay serves
            return [sys.executable, RELAY_PY], "python"
        return [program], kind

    def _start_relay(self):
        """Start the relay in the switch's namespace; it makes the TUN devices, then says
        ``ready``. Its hold is the delay less its own measured cost."""
        program, kind = self._relay_argv()
        self.relay_kind = kind
        overhead = RELAY_OVERHEAD_S[kind] if self.relay_overhead is None else self.relay_overhead
        hold = max(self.link_latency - overhead, 0.0)
        rate = self.link_rate or 0
        burst = max(int(rate / 8 * BURST_S), MIN_BURST)
        ports = [f"/var/run/netns/{self.switch},br0,1,0"] + [      # iproute2's NETNS_RUN_DIR
            f"/var/run/netns/{h.netns},eth0,{h.address.rsplit('.', 1)[1]},{rate:.0f}"
            for h in self.hosts]
        argv = (["ip", "netns", "exec", self.switch] + program
                + [f"{hold * 1e9:.0f}", str(burst), f"{QUEUE_S * 1e9:.0f}",
                   f"{RELAY_WAKE_S * 1e9:.0f}", str(RELAY_PRIORITY)] + ports)
        self._relay_log = os.path.join(self._dir, "relay.log")
        with open(self._relay_log, "w") as log:
            self.relay_process = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                                  stdout=subprocess.PIPE, stderr=log)
        if self.relay_process.stdout.readline().strip() != b"ready":
            self._stop_relay()
            raise NetlabError(f"the delay relay did not start: {self.relay_report or '?'}")

    def _stop_relay(self):
        """Close the relay's stdin (it exits and reports its counters), kill it if it lingers."""
        proc, self.relay_process = self.relay_process, None
        if proc is None:
            return
        proc.stdin.close()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        with open(self._relay_log) as log:
            self.relay_report = " / ".join(line.strip() for line in log if line.strip())

    def close(self):
        """Kill what runs in the lab and delete its namespaces (idempotent)."""
        atexit.unregister(self.close)
        blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            self._stop_relay()
            _delete_namespaces(self._namespaces)
            self._namespaces = []
            if self._dir:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    # inside the hosts
    @property
    def size(self):
        """Ranks :meth:`mpiexec` starts: hosts x ranks_per_host."""
        return self.n_hosts * self.ranks_per_host

    def host(self, name):
        """The :class:`Host` called ``name`` (``"h0"``) or a Host itself."""
        if isinstance(name, Host):
            return name
        try:
            return self._by_name[name]
        except KeyError:
            raise NetlabError(f"no host {name!r} in this lab (hosts: "
                              f"{', '.join(self._by_name)})") from None

    def _enter(self, host):
        """The argv prefix that runs a command inside ``host``: its namespace, hostname and
        CAFFE_NODE; the command follows as ``"$@"``."""
        if shutil.which("unshare") and shutil.which("hostname"):
            body = f'hostname "$0" && {NODE_VAR}="$0" && export {NODE_VAR} && exec "$@"'
            return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "/bin/sh", "-c",
                    body, host.name]
        return ["ip", "netns", "exec", host.netns, "env", f"{NODE_VAR}={host.name}"]

    def command_in(self, host, argv):
        """The argv that runs ``argv`` inside ``host`` (for Popen and the like)."""
        self._check_started()
        return self._enter(self.host(host)) + list(argv)

    def run_in(self, host, argv, **kwargs):
        """``subprocess.run(argv, **kwargs)`` inside ``host``; returns its CompletedProcess."""
        return subprocess.run(self.command_in(host, argv), **kwargs)

    def popen_in(self, host, argv, **kwargs):
        """``subprocess.Popen(argv, **kwargs)`` inside ``host``."""
        return subprocess.Popen(self.command_in(host, argv), **kwargs)

    def _check_started(self):
        if not self._namespaces:
            raise NetlabError("the lab is not started (use `with Lab(...) as lab`)")

    # mpiexec
    def _write_launcher(self):
        """hydra's ``-launcher-exec``: called as ``SCRIPT [-x] ADDRESS COMMAND``, ssh's form."""
        cases = "\n".join(f"  {h.address}) set -- {' '.join(map(_sh_quote, self._enter(h)))} ;;"
                          for h in self.hosts)
        script = f"""#!/bin/sh
# netlab's launcher for lab {self.switch}: runs hydra's proxy inside the named host.
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
command="$*"
case "$host" in
{cases}
  *) echo "netlab: no emulated host $host" >&2; exit 1 ;;
esac
exec "$@" /bin/sh -c "$command"
"""
        path = os.path.join(self._dir, "launch.sh")
        with open(path, "w") as f:
            f.write(script)
        os.chmod(path, 0o700)
        return path

    def mpiexec_argv(self, argv):
        """The full command :meth:`mpiexec` runs for ``argv`` (from the machine's namespace)."""
        self._check_started()
        path = self.mpiexec_path or default_mpiexec()
        if not path:
            raise NetlabError("no mpiexec found (install the `mpich` wheel or pass mpiexec=)")
        if not os.access(path, os.X_OK):
            raise NetlabError(f"mpiexec {path!r} is not an executable file")
        env = dict(MPI_TCP_ENV, MPIR_CVAR_NOLOCAL="1") if self.nodes else MPI_TCP_ENV
        genv = [a for key, value in env.items() for a in ("-genv", key, value)]
        hosts = ",".join(f"{h.address}:{self.ranks_per_host}" for h in self.hosts)
        return (["ip", "netns", "exec", self.switch, path, "-launcher", "ssh",
                 "-launcher-exec", self._launcher, "-iface", "br0", "-hosts", hosts,
                 "-n", str(self.size)] + genv + list(argv))

    def mpiexec(self, argv, env=None, timeout=None, **kwargs):
        """Run ``mpiexec -n hosts*ranks_per_host argv...`` with each rank inside its host.

        Args:
            argv (list of str): the command each rank runs.
            env (dict): the ranks' environment (default: this process's); hydra passes it on,
                without ``CAFFE_NODE`` (each host sets its own) and with :data:`MPI_TCP_ENV`.
            timeout (float): seconds; past it the whole launch is killed and
                ``subprocess.TimeoutExpired`` raised.
            **kwargs: passed to ``subprocess.Popen`` (``capture_output``, ``text``, ``cwd``, ...).

        Returns:
            subprocess.CompletedProcess: mpiexec's exit status and (if captured) output.
        """
        cmd = self.mpiexec_argv(argv)
        env = dict(os.environ if env is None else env)
        env.pop(NODE_VAR, None)
        if kwargs.pop("capture_output", False):
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException as exc:
            _kill_group(proc)
            out, err = proc.communicate()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
            raise
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    # measuring
    def throughput(self, src, dst, nbytes=None, seconds=1.5, timeout=60):
        """Bits/s of one TCP stream from host ``src`` to host ``dst`` (Python sockets).

        Sends ``nbytes`` (default: ``seconds`` at the slowest shaped rate on the way, 512 MiB
        unshaped); the receiver times from its first byte to the last. ``src == dst`` measures
        the host's loopback (the intra-node link).
        """
        src, dst = self.host(src), self.host(dst)
        if nbytes is None:
            rate = self._path_rate(src, dst)
            nbytes = int(rate / 8 * seconds) if rate else 512 << 20
        receiver = self.popen_in(dst, [sys.executable, "-c", _RECEIVER, dst.address],
                                 stdout=subprocess.PIPE, text=True)
        try:
            port = receiver.stdout.readline().strip()
            if not port.isdigit():
                raise NetlabError(f"the receiver in {dst.name} did not start")
            self.run_in(src, [sys.executable, "-c", _SENDER, dst.address, port, str(nbytes)],
                        check=True, timeout=timeout)
            got, elapsed = receiver.communicate(timeout=timeout)[0].split()
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()
        return int(got) * 8 / float(elapsed)

    def tx_bytes(self, host, dev="eth0"):
        """Bytes ``host`` has sent on ``dev``: ``"eth0"`` its link to the switch, ``"lo"`` its
        loopback (the intra-node link in the nodes topology). The kernel's counter."""
        host = self.host(host)
        done = _run(["ip", "-n", host.netns, "-j", "-s", "link", "show", "dev", dev])
        return int(json.loads(done.stdout)[0]["stats64"]["tx"]["bytes"])

    def _path_rate(self, src, dst):
        if src == dst:
            return self.bandwidth if self.nodes else None
        return self.inter_bandwidth if self.nodes else self.bandwidth

    def describe(self):
        """One line: the hosts, ranks and what shapes their links."""
        ranks = f"{self.n_hosts} hosts x {self.ranks_per_host} ranks"
        by = f" (the {self.relay_kind} relay)" if self.relay_kind else ""
        if self.nodes:
            return (f"{ranks}: host links (inter-node) {format_rate(self.inter_bandwidth)},"
                    f" {format_time(self.inter_latency)}{by}; intra-node (loopback, TCP)"
                    f" {format_rate(self.bandwidth)}, {format_time(self.latency)}")
        return (f"{ranks}: host links {format_rate(self.bandwidth)},"
                f" {format_time(self.latency)}{by}; a host's ranks share memory")


_RECEIVER = """
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
buf = bytearray(1 << 20)
got, t0 = 0, None
while True:
    n = c.recv_into(buf)
    if not n:
        break
    if t0 is None:
        t0 = time.perf_counter()
    else:
        got += n
print(got, time.perf_counter() - t0, flush=True)
"""

_SENDER = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
left, block = int(sys.argv[3]), memoryview(bytes(1 << 20))
while left > 0:
    k = min(left, len(block))
    c.sendall(block[:k])
    left -= k
c.close()
"""


def _sh_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def _stat(pid):
    """(parent pid, start time in clock ticks) of ``pid`` from /proc, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def _descendants(pid):
    """{pid: start time} of every process below ``pid`` (hydra's proxies and their ranks, each in
    a session of its own, so out of reach of a signal to mpiexec's process group)."""
    children = {}
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat:
            children.setdefault(stat[0], []).append((int(entry), stat[1]))
    found, todo = {}, [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            found[child] = start
            todo.append(child)
    return found


def _kill_group(proc, grace=2.0):
    """Stop mpiexec: SIGINT to it (hydra passes it on to its ranks); after ``grace`` seconds or
    once it has gone, SIGKILL to it and to whatever it had started that still runs."""
    tree = _descendants(proc.pid)

    def running():
        return [pid for pid, start in tree.items()
                if (_stat(pid) or (0, None))[1] == start and _pid_alive(pid)]

    deadline = time.monotonic() + grace
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    while time.monotonic() < deadline and running():
        time.sleep(0.02)
    for pid in running():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and running():
        time.sleep(0.02)


# -- command line --------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"netlab: {message}\n")


class _Signalled(BaseException):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _raise_signal(signum, frame):
    raise _Signalled(signum)


def build_parser():
    """The command line's parser."""
    p = _Parser(prog="netlab.py", description="Run mpiexec across emulated hosts (namespaces "
                "with shaped links); exits with its status.")
    p.add_argument("--hosts", type=int, help="number of hosts (1..%d)" % MAX_HOSTS)
    p.add_argument("--ranks-per-host", type=int, default=1, help="MPI ranks per host")
    p.add_argument("--bandwidth", default="default",
                   help="host links' rate, default 1gbit; with --inter-*: the intra-node link's,"
                        " default unshaped; none: unshaped")
    p.add_argument("--latency", default=None,
                   help="one-way delay added on the same links (host links: the relay, no netem"
                        " needed; the loopback: netem)")
    p.add_argument("--inter-bandwidth", default=None, help="nodes topology: host links' rate")
    p.add_argument("--inter-latency", default=None,
                   help="nodes topology: host links' delay (the relay)")
    p.add_argument("--mpiexec", default=None, help="MPICH hydra's mpiexec (default: the venv's)")
    p.add_argument("--verbose", "-v", action="store_true", help="describe the lab on stderr")
    p.add_argument("--check", action="store_true",
                   help="only say whether labs can be made here (status 0 or 1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    return p


def main(argv=None):
    """The command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.check:
        ok, why = available()
        print(f"netlab: {'labs can be made here' if ok else why}", file=sys.stderr)
        return 0 if ok else 1
    if args.hosts is None:
        parser.error("--hosts N is required")
    if not command:
        parser.error("no command (give it after --)")
    try:
        lab = Lab(args.hosts, args.ranks_per_host, args.bandwidth, args.latency,
                  args.inter_bandwidth, args.inter_latency, args.mpiexec)
    except ValueError as exc:
        parser.error(str(exc))
    handlers = {sig: signal.signal(sig, _raise_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with lab:
            if args.verbose:
                print(f"netlab: {lab.describe()}", file=sys.stderr)
            status = lab.mpiexec(command).returncode
        return 128 - status if status < 0 else status
    except NetlabError as exc:
        print(f"netlab: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except _Signalled as exc:
        return 128 + exc.signum
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
