"""tools/netlab.py: emulated hosts (network namespaces) with shaped links, and mpiexec across them.

Oracles: the rates the links were shaped to (a TCP stream carries 80-103 % of it: frame headers
and the token bucket's 4 ms burst), the namespace each process reports from the kernel
(``/proc/self/ns/net``), ``ip netns list`` and ``ip link`` before and after a lab, and the exit
status a command was written to return. Tests that make labs skip with ``netlab.available()``'s
reason where namespaces cannot be made (not root).
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from paths import ROOT

SPEC = importlib.util.spec_from_file_location("netlab", ROOT / "tools" / "netlab.py")
netlab = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(netlab)

OK, WHY = netlab.available()
needs_lab = pytest.mark.skipif(not OK, reason=f"netlab: {WHY}")
TOOL = [sys.executable, str(ROOT / "tools" / "netlab.py")]


def _mpi_missing():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    return None if netlab.default_mpiexec() else "no mpiexec"


needs_mpi = pytest.mark.skipif(_mpi_missing() is not None, reason=str(_mpi_missing()))


def ours():
    """This process's lab namespaces."""
    return [ns for ns in netlab._netns_list() if ns.startswith(f"{netlab.PREFIX}{os.getpid()}-")]


def root_links():
    return sorted(line.split()[0] for line in subprocess.run(
        ["ip", "-br", "link"], capture_output=True, text=True).stdout.splitlines())


@pytest.fixture(scope="module", autouse=True)
def leaves_machine_as_found():
    """After all the labs: no namespace of this process left, the machine's links unchanged."""
    before = root_links() if OK else None
    yield
    if OK:
        assert ours() == []
        assert root_links() == before


# -- without a lab -------------------------------------------------------------------------------
def test_rates_and_delays_in_bits_per_second_and_seconds():
    assert netlab.parse_rate("1gbit") == 1e9
    assert netlab.parse_rate("100mbit") == 1e8
    assert netlab.parse_rate("500kbit") == 5e5
    assert netlab.parse_rate(2.5e9) == 2.5e9
    assert netlab.parse_rate("none") is None and netlab.parse_rate(None) is None
    assert netlab.parse_time("50us") == pytest.approx(50e-6)
    assert netlab.parse_time("2ms") == pytest.approx(2e-3)
    assert netlab.parse_time(0.1) == 0.1 and netlab.parse_time(None) is None
    for bad in ("1gigabit", "fast", "-1gbit"):
        with pytest.raises(ValueError):
            netlab.parse_rate(bad)
    with pytest.raises(ValueError):
        netlab.parse_time("50")                 # a delay needs its unit


@pytest.mark.parametrize("flags, words", [
    (["--hosts", "0", "--", "true"], "hosts must be"),
    (["--hosts", "2", "--bandwidth", "1gigabit", "--", "true"], "bad rate"),
    (["--hosts", "2", "--latency", "fast", "--", "true"], "bad delay"),
    (["--hosts", "2"], "no command"),
    (["--", "true"], "--hosts"),
    (["--hosts", "2", "--bogus", "--", "true"], "unrecognized"),
])
def test_bad_flags_are_one_line_and_status_2(flags, words):
    done = subprocess.run(TOOL + flags, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_not_root_is_said_in_one_line():
    if os.geteuid() == 0:
        if not os.path.exists("/usr/bin/setpriv"):
            pytest.skip("root, and no setpriv to drop to another user")
        as_user = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    else:
        as_user = []
    for args in (["--check"], ["--hosts", "2", "--", "true"]):
        done = subprocess.run(as_user + TOOL + args, capture_output=True, text=True, timeout=30)
        if done.returncode != 1 and "Permission denied" in done.stderr:
            pytest.skip("this Python cannot run as another user here")
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and "not root" in done.stderr, done.stderr


# -- labs ----------------------------------------------------------------------------------------
@needs_lab
def test_shaped_link_carries_its_rate_both_ways():
    with netlab.Lab(hosts=2, bandwidth="100mbit") as lab:
        # Both ends of each host's link are shaped: the host's eth0 and its bridge port.
        for host in lab.hosts:
            for where in (["tc", "-n", host.netns, "qdisc", "show", "dev", "eth0"],
                          ["tc", "-n", lab.switch, "qdisc", "show", "dev", host.name]):
                assert "tbf" in subprocess.run(where, capture_output=True, text=True).stdout
        for src, dst in (("h0", "h1"), ("h1", "h0")):
            rate = lab.throughput(src, dst, seconds=1.0)
            assert 0.80e8 < rate < 1.03e8, f"{src} -> {dst}: {rate / 1e6:.1f} Mbit/s"


@needs_lab
def test_nodes_topology_shapes_loopback_and_host_links_apart():
    with netlab.Lab(hosts=2, ranks_per_host=2, bandwidth="400mbit",
                    inter_bandwidth="100mbit") as lab:
        assert lab.size == 4 and lab.nodes
        intra = lab.throughput("h0", "h0", seconds=0.75)
        inter = lab.throughput("h0", "h1", seconds=0.75)
    assert 3.2e8 < intra < 4.12e8, f"intra-node {intra / 1e6:.1f} Mbit/s"
    assert 0.80e8 < inter < 1.03e8, f"inter-node {inter / 1e6:.1f} Mbit/s"


REPORT = """
import json, os, socket
import numpy
from mpi4py import MPI
world = MPI.COMM_WORLD
local = world.Split_type(MPI.COMM_TYPE_SHARED)
data = numpy.ones(1 << 20, numpy.float32)      # 4 MiB
world.Allreduce(MPI.IN_PLACE, data)
assert data[0] == world.size
mine = dict(rank=world.rank, size=world.size, node=os.environ.get("CAFFE_NODE"),
            hostname=socket.gethostname(), netns=os.readlink("/proc/self/ns/net"),
            local=local.size)
everyone = world.gather(mine)                   # one writer: ranks' lines would interleave
if world.rank == 0:
    print(json.dumps(everyone), flush=True)
"""


def _reports(lab, tmp_path):
    script = tmp_path / "report.py"
    script.write_text(textwrap.dedent(REPORT))
    env = dict(os.environ, CAFFE_NODE="stale")      # the caller's value must not reach the ranks
    done = lab.mpiexec([sys.executable, str(script)], env=env, timeout=60,
                       capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_lab
@needs_mpi
def test_mpiexec_puts_each_rank_in_its_host(tmp_path):
    with netlab.Lab(hosts=2) as lab:
        before = [lab.tx_bytes(h) for h in ("h0", "h1")]
        reports = _reports(lab, tmp_path)
        sent = [lab.tx_bytes(h) - b for h, b in zip(("h0", "h1"), before)]
    # The 4 MiB allreduce went over the links (no shared-memory shortcut between hosts):
    # at P = 2 each rank sends at least half the buffer, whatever the algorithm.
    assert min(sent) >= 2 << 20, sent
    assert [r["rank"] for r in reports] == [0, 1] and reports[0]["size"] == 2
    assert [r["node"] for r in reports] == ["h0", "h1"]
    assert [r["hostname"] for r in reports] == ["h0", "h1"]
    mine = os.readlink("/proc/self/ns/net")
    assert len({r["netns"] for r in reports} | {mine}) == 3
    assert [r["local"] for r in reports] == [1, 1]      # MPI sees two nodes


@needs_lab
@needs_mpi
def test_ranks_per_host_fill_hosts_in_order(tmp_path):
    with netlab.Lab(hosts=2, ranks_per_host=2) as lab:
        reports = _reports(lab, tmp_path)
    assert [r["node"] for r in reports] == ["h0", "h0", "h1", "h1"]
    assert reports[0]["netns"] == reports[1]["netns"] != reports[2]["netns"] == reports[3]["netns"]
    assert [r["local"] for r in reports] == [2, 2, 2, 2]   # a host's ranks share memory


@needs_lab
def test_cli_passes_the_command_status_through():
    code = "import os, sys; sys.exit(7 if os.environ['CAFFE_NODE'] == 'h1' else 0)"
    done = subprocess.run(TOOL + ["--hosts", "2", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr[-2000:]
    done = subprocess.run(TOOL + ["--hosts", "1", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


@needs_lab
def test_teardown_after_an_exception_inside_the_lab():
    with pytest.raises(RuntimeError, match="inside"):
        with netlab.Lab(hosts=2) as lab:
            names = [lab.switch] + [h.netns for h in lab.hosts]
            assert set(names) <= set(netlab._netns_list())
            sleeper = lab.popen_in("h1", ["sleep", "60"])
            raise RuntimeError("inside the lab")
    assert sleeper.wait(timeout=5) is not None          # killed with its host
    assert not set(names) & set(netlab._netns_list())
    assert ours() == []


@needs_lab
def test_mpiexec_timeout_kills_the_launch():
    with netlab.Lab(hosts=2) as lab:
        with pytest.raises(subprocess.TimeoutExpired):
            lab.mpiexec(["sleep", "60"], timeout=1, capture_output=True)
        assert [netlab._netns_pids(h.netns) for h in lab.hosts] == [[], []]
        assert lab.mpiexec(["true"], timeout=60).returncode == 0     # the lab still works


@needs_lab
def test_leftovers_of_a_dead_process_are_deleted():
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{netlab.PREFIX}{dead.pid}-1-h0"
    folder = tempfile.mkdtemp(prefix=f"netlab{dead.pid}-")
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netlab.cleanup_leftovers()
        assert name not in netlab._netns_list()
        assert not os.path.exists(folder)
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@needs_lab
def test_delay_adds_its_round_trip_or_says_netem_is_missing():
    try:
        lab = netlab.Lab(hosts=2, latency="2ms").start()
    except netlab.NetlabError as exc:
        assert "netem" in str(exc) and "\n" not in str(exc)
        assert ours() == []                     # the half-made lab is gone
        pytest.skip(str(exc))
    with lab:
        code = textwrap.dedent("""
            import socket, sys, time
            c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            times = []
            for _ in range(20):
                t = time.perf_counter(); c.sendall(b"x"); c.recv(1)
                times.append(time.perf_counter() - t)
            print(sorted(times)[10])
        """)
        echo = lab.popen_in("h1", [sys.executable, "-c", ECHO, lab.hosts[1].address],
                            stdout=subprocess.PIPE, text=True)
        port = echo.stdout.readline().strip()
        done = lab.run_in("h0", [sys.executable, "-c", code, lab.hosts[1].address, port],
                          capture_output=True, text=True, timeout=30)
        echo.kill()
        echo.wait()
    rtt = float(done.stdout)
    assert 4e-3 <= rtt < 8e-3                   # 2 ms each way


ECHO = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    b = c.recv(1)
    if not b:
        break
    c.sendall(b)
"""


# -- a delay on the host links: the relay (tools/netlab_relay.c, no netem needed) ---------------
RELAY_SPEC = importlib.util.spec_from_file_location("netlab_relay",
                                                    ROOT / "tools" / "netlab_relay.py")
relay_py = importlib.util.module_from_spec(RELAY_SPEC)
RELAY_SPEC.loader.exec_module(relay_py)
CHECK_SPEC = importlib.util.spec_from_file_location("latency_check",
                                                    ROOT / "tools" / "latency_check.py")
latency_check = importlib.util.module_from_spec(CHECK_SPEC)
CHECK_SPEC.loader.exec_module(latency_check)


def test_relay_counts_a_gso_packets_headers_once_per_segment():
    # virtio_net_hdr: flags, gso_type TCPV4 (1), hdr_len 52, gso_size 1448; then the packet.
    header = bytes([0, 1, 52, 0, 0xA8, 0x05, 0, 0, 0, 0])
    packet = header + bytes(52 + 3 * 1448 - 100)           # 3 segments, the last one short
    assert relay_py.wire_bytes(packet) == 52 + 3 * 1448 - 100 + 2 * 52
    plain = bytes(10) + bytes(60)                           # gso_type NONE: as it is
    assert relay_py.wire_bytes(plain) == 60


@needs_lab
@pytest.mark.parametrize("relay", ["c", "python"])
def test_delay_shows_in_a_ping_pong(relay):
    if relay == "c" and not shutil.which("cc"):
        pytest.skip("no C compiler: the Python relay serves")
    # Other work on the machine only adds to a round trip: up to 3 tries, judged on the best.
    tries = []
    for _ in range(3):
        with netlab.Lab(hosts=2, bandwidth=None) as lab:
            base = latency_check.tcp_pingpong(lab, sizes=(8,), reps=200)["8"]
        with netlab.Lab(hosts=2, bandwidth=None, latency="300us", relay=relay) as lab:
            assert lab.relay_process is not None and lab.relay_process.poll() is None
            delayed = latency_check.tcp_pingpong(lab, sizes=(8,), reps=200)["8"]
        tries.append((delayed - base) / 2)
        if 0.85 * 300e-6 < tries[-1] < 1.2 * 300e-6:
            break
    assert 0.85 * 300e-6 < tries[-1] < 1.2 * 300e-6, [f"{t * 1e6:.1f} us" for t in tries]


@needs_lab
def test_rate_holds_with_a_delay():
    with netlab.Lab(hosts=2, bandwidth="100mbit", latency="500us") as lab:
        for src, dst in (("h0", "h1"), ("h1", "h0")):
            rate = lab.throughput(src, dst, seconds=1.0)
            assert 0.80e8 < rate < 1.03e8, f"{src} -> {dst}: {rate / 1e6:.1f} Mbit/s"


# The receiver's clock times of its first and last byte (CLOCK_REALTIME: one clock for all hosts).
TIMED_RECEIVER = netlab._RECEIVER.replace("time.perf_counter()", "time.time()").replace(
    "print(got, time.time() - t0, flush=True)", "print(got, t0, time.time(), flush=True)")


@needs_lab
def test_many_to_one_is_held_to_the_port_rate():
    with netlab.Lab(hosts=3, bandwidth="100mbit", latency="200us") as lab:
        far = lab.hosts[2]
        receivers = [lab.popen_in(far, [sys.executable, "-c", TIMED_RECEIVER, far.address],
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        ports = [r.stdout.readline().strip() for r in receivers]
        senders = [lab.popen_in(h, [sys.executable, "-c", netlab._SENDER, far.address, port,
                                    str(12_500_000)]) for h, port in zip(("h0", "h1"), ports)]
        for s in senders:
            s.wait(timeout=60)
        got = [[float(x) for x in r.communicate(timeout=60)[0].split()] for r in receivers]
    # both streams' bytes over the time from the first one's first byte to the last one's last
    total = sum(g[0] for g in got) * 8 / (max(g[2] for g in got) - min(g[1] for g in got))
    assert 0.60e8 < total < 1.04e8, f"two senders into one 100 Mbit/s port: {total / 1e6:.1f}"


@needs_lab
def test_teardown_stops_the_relay_and_leaves_nothing():
    with pytest.raises(RuntimeError, match="inside"):
        with netlab.Lab(hosts=2, latency="50us") as lab:
            relay = lab.relay_process
            names = [lab.switch] + [h.netns for h in lab.hosts]
            devices = subprocess.run(["ip", "-n", lab.hosts[0].netns, "-d", "link", "show",
                                      "eth0"], capture_output=True, text=True).stdout
            assert "tun" in devices
            raise RuntimeError("inside the lab")
    assert relay.poll() is not None and not netlab._pid_alive(relay.pid)
    assert lab.relay_process is None and "dropped" in lab.relay_report
    assert not set(names) & set(netlab._netns_list())
    assert ours() == []


@needs_lab
def test_a_loopback_delay_needs_netem_and_says_so():
    try:
        lab = netlab.Lab(hosts=1, ranks_per_host=2, latency="50us", inter_bandwidth="1gbit")
        lab.start()
    except netlab.NetlabError as exc:
        assert "netem" in str(exc) and "--inter-latency" in str(exc) and "\n" not in str(exc)
        assert ours() == []
        return
    lab.close()                                 # a kernel with netem delays the loopback


PINGPONG_BAR = """
import sys
from mpi4py import MPI
world = MPI.COMM_WORLD
t = MPI.Wtime()
for _ in range(50):
    if world.rank == 0:
        world.send(b"x", 1); world.recv(source=1)
    else:
        world.recv(source=0); world.send(b"x", 0)
rtt = (MPI.Wtime() - t) / 50
assert world.allreduce(1) == 2
sys.exit(0 if rtt > 2 * 50e-6 else 3)           # the delay is there, both ways
"""


@needs_lab
@needs_mpi
def test_cli_latency_runs_mpi_bar_style():
    done = subprocess.run(TOOL + ["--hosts", "2", "--latency", "50us", "--", sys.executable,
                                  "-c", PINGPONG_BAR], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
