#!/usr/bin/env python
"""Calibrate netlab's link delay (the relay): MPI ping-pong at set delays, rates under delay.

Needs root (tools/netlab.py makes the labs), mpi4py and MPICH's mpiexec. Usage::

    python tools/latency_check.py --calibrate --out docs/bench/netlab/latency
    python tools/latency_check.py --aggregate --hosts 2 4 8 --out docs/bench/netlab/latency
    python tools/latency_check.py --calibrate --delays 0 50us --reps 100     # quicker

``--calibrate``: an MPI ping-pong (mpi4py ``Send``/``Recv``, one rank on each of two emulated
hosts) and a blocking TCP ping-pong (Python sockets, h0 -> an echo on h1), 8 B and 64 KiB,
``--reps`` round trips after 20 warm-up ones, median; the lowest median of ``--rounds``
interleaved runs. Links unshaped (the delay alone; ``--calibrate-bandwidth``). Delay 0 is the
plain lab (veth pairs into a bridge); every other delay goes through netlab's relay
(tools/netlab_relay.c). Measured one-way delay = (RTT_d - RTT_0) / 2. The ``relay 0`` row is the
relay with no hold and no compensation: its own cost, (RTT_relay0 - RTT_0) / 2, from which netlab's
``RELAY_OVERHEAD_S`` (taken off the hold) was set. Then the rate under delay: one TCP stream
(``Lab.throughput``, median of 3) and MPI large messages (4 MiB each, one way) at 1 Gbit/s and
100 Mbit/s with 0 and 500 us.

``--aggregate``: every host sends one TCP stream to the next (h0 -> h1 -> ... -> h0), all at
once, for ``--seconds``; the sum of their rates, for the plain lab, the C relay and the Python
relay. Writes ``calibration.json`` / ``aggregate.json`` under ``--out`` and prints markdown.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netlab  # noqa: E402  (tools/netlab.py, beside this script)

PINGPONG = r"""
import json, statistics, sys
import numpy
from mpi4py import MPI
world = MPI.COMM_WORLD
peer = 1 - world.rank
sizes, reps, stream = [int(s) for s in sys.argv[1].split(",")], int(sys.argv[2]), int(sys.argv[3])
result = {}
for size in sizes:
    buf = numpy.zeros(max(size, 1), numpy.uint8)
    times = []
    for i in range(reps + 20):
        t = MPI.Wtime()
        if world.rank == 0:
            world.Send(buf[:size], peer); world.Recv(buf[:size], peer)
        else:
            world.Recv(buf[:size], peer); world.Send(buf[:size], peer)
        times.append(MPI.Wtime() - t)
    result[str(size)] = statistics.median(times[20:])
if stream:
    big, ack = numpy.zeros(4 << 20, numpy.uint8), numpy.zeros(1, numpy.uint8)
    for k in (2, stream):                                      # warm-up, then the timed run
        world.Barrier()
        t = MPI.Wtime()
        for _ in range(k):
            world.Send(big, peer) if world.rank == 0 else world.Recv(big, peer)
        world.Send(ack, peer) if world.rank == 1 else world.Recv(ack, peer)
        elapsed = MPI.Wtime() - t
    result["stream_bits_per_s"] = stream * big.nbytes * 8 / elapsed
if world.rank == 0:
    print(json.dumps(result), flush=True)
"""


#: Niceness of the ping-pong's processes (``--nice``): MPI ranks busy-poll, and on a machine
#: shared with other work a rank that loses its core for a time slice adds milliseconds to a
#: round trip that no link made. None: as they are.
NICE = None


def _niced(argv):
    return ["nice", "-n", str(NICE)] + list(argv) if NICE is not None else list(argv)


#: MPICH's network module for the MPI ping-pong (``--netmod``): None, MPICH's default (ucx).
NETMOD = None
#: TCP congestion control inside the hosts (``--tcp-cc``; a namespace allows reno or bbr):
#: None keeps the machine's (bbr here, which paces a 64 KiB message out over ~1/3 of a round
#: trip once its bandwidth estimate comes from an app-limited ping-pong).
TCP_CC = None


def _set_tcp_cc(lab):
    for host in lab.hosts if TCP_CC else []:
        lab.run_in(host, ["sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={TCP_CC}"],
                   check=True)


def pingpong(lab, sizes=(8, 65536), reps=300, stream=0, timeout=300):
    """Median round trip (seconds) per message size between h0 and h1 of ``lab`` (two hosts,
    one rank each), and with ``stream`` > 0 the bits/s of ``stream`` 4 MiB messages one way."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PINGPONG)
    env = dict(os.environ, MPIR_CVAR_CH4_NETMOD=NETMOD) if NETMOD else None
    try:
        done = lab.mpiexec(_niced([sys.executable, f.name, ",".join(map(str, sizes)), str(reps),
                                   str(stream)]), env=env, timeout=timeout, capture_output=True,
                           text=True)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"ping-pong failed ({done.returncode}): {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


TCP_ECHO = r"""
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(1 << 20)
while True:
    n = c.recv_into(buf)
    if not n:
        break
    c.sendall(memoryview(buf)[:n])
"""

TCP_PING = r"""
import json, socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
reps, result, buf = int(sys.argv[4]), {}, bytearray(1 << 20)
for size in [int(s) for s in sys.argv[3].split(",")]:
    out, times = bytes(size), []
    for _ in range(reps + 20):
        t = time.perf_counter()
        c.sendall(out)
        got = 0
        while got < size:
            got += c.recv_into(buf, size - got)
        times.append(time.perf_counter() - t)
    result[str(size)] = statistics.median(times[20:])
print(json.dumps(result))
"""


def tcp_pingpong(lab, sizes=(8, 65536), reps=300, timeout=120):
    """Median round trip (seconds) per size of a blocking TCP ping-pong (Python sockets,
    TCP_NODELAY) from h0 to an echo server on h1."""
    far = lab.hosts[1]
    echo = lab.popen_in(far, _niced([sys.executable, "-c", TCP_ECHO, far.address]),
                        stdout=subprocess.PIPE, text=True)
    try:
        port = echo.stdout.readline().strip()
        done = lab.run_in("h0", _niced([sys.executable, "-c", TCP_PING, far.address, port,
                                        ",".join(map(str, sizes)), str(reps)]),
                          capture_output=True, text=True, timeout=timeout, check=True)
    finally:
        echo.kill()
        echo.wait()
    return json.loads(done.stdout)


def calibrate(delays, reps, rounds=1, rate=None, relay="auto", sizes=(8, 65536)):
    """Ping-pongs (MPI and TCP) at each set delay (seconds; 0 = the plain lab) and through the
    relay with no hold (``"relay 0"``), ``rounds`` times interleaved: each run's median round
    trip, the lowest of the runs (a run that other work on the machine slowed shows higher).
    Each row: set, RTT per ``"mpi 8"``-like key, one-way delay measured (RTT - RTT_0) / 2."""
    cases = [("relay 0", 1e-9, 1.0)] + [(netlab.format_time(d or None), d, None) for d in delays]
    samples = {label: [] for label, _, _ in cases}
    for _ in range(rounds):
        for label, delay, overhead in cases:
            with netlab.Lab(hosts=2, bandwidth=rate, latency=delay or None, relay=relay,
                            relay_overhead=overhead) as lab:
                _set_tcp_cc(lab)
                rtt = {f"mpi {k}": v for k, v in pingpong(lab, sizes, reps=reps).items()}
                rtt.update((f"tcp {k}", v) for k, v in tcp_pingpong(lab, sizes, reps).items())
            samples[label].append(rtt)
    rows = []
    for label, delay, overhead in cases:      # other work on the machine only adds: the best run
        rtt = {k: min(r[k] for r in samples[label]) for k in samples[label][0]}
        rows.append({"set": label, "set_s": delay if overhead is None else 0.0, "rtt_s": rtt,
                     "rtt_rounds_s": samples[label]})
    base = next(r["rtt_s"] for r in rows if r["set"] == "no delay")
    for row in rows:
        row["one_way_s"] = {k: (t - base[k]) / 2 for k, t in row["rtt_s"].items()}
    return rows


def rates_under_delay(relay="auto"):
    """One TCP stream and MPI 4 MiB messages at 1 Gbit/s and 100 Mbit/s, 0 and 500 us."""
    rows = []
    for rate in ("1gbit", "100mbit"):
        for delay in (None, 500e-6):
            with netlab.Lab(hosts=2, bandwidth=rate, latency=delay, relay=relay) as lab:
                tcp = [lab.throughput("h0", "h1", seconds=1.5) for _ in range(3)]
                mpi = pingpong(lab, sizes=(8,), reps=10, stream=16 if rate == "1gbit" else 3)
            rows.append({"rate": rate, "set": netlab.format_time(delay), "set_s": delay or 0.0,
                         "tcp_bits_per_s": statistics.median(tcp),
                         "mpi_bits_per_s": mpi["stream_bits_per_s"]})
    return rows


def aggregate(lab, seconds=2.0):
    """Bits/s summed over one TCP stream per host, h<i> -> h<i+1 mod N>, all at once."""
    n = len(lab.hosts)
    receivers = [lab.popen_in(h, [sys.executable, "-c", netlab._RECEIVER, h.address],
                              stdout=subprocess.PIPE, text=True) for h in lab.hosts]
    ports = [r.stdout.readline().strip() for r in receivers]
    nbytes = int((lab.link_rate or 4e9) / 8 * seconds)
    senders = [lab.popen_in(lab.hosts[i], [sys.executable, "-c", netlab._SENDER,
                                           lab.hosts[(i + 1) % n].address,
                                           ports[(i + 1) % n], str(nbytes)])
               for i in range(n)]
    t0 = time.perf_counter()
    for s in senders:
        s.wait(timeout=120)
    wall = time.perf_counter() - t0
    got = [r.communicate(timeout=60)[0].split() for r in receivers]
    return {"sum_bits_per_s": sum(int(b) * 8 / float(t) for b, t in got),
            "per_host_bits_per_s": [int(b) * 8 / float(t) for b, t in got],
            "wall_bits_per_s": n * nbytes * 8 / wall}


def aggregate_rows(hosts, rate, delay, seconds):
    """:func:`aggregate` at each host count for the plain lab and both relays."""
    rows = []
    for n in hosts:
        for mech, kw in (("veth+bridge", dict(latency=None)),
                         ("relay c", dict(latency=delay, relay="c")),
                         ("relay python", dict(latency=delay, relay="python"))):
            cpu0 = os.times()
            with netlab.Lab(hosts=n, bandwidth=rate, **kw) as lab:
                row = aggregate(lab, seconds)
                relay_cpu = _relay_cpu(lab)
            row.update(hosts=n, mechanism=mech, rate=rate, set=netlab.format_time(kw["latency"]),
                       relay_cpu_s=relay_cpu, load=os.getloadavg()[0],
                       children_cpu_s=os.times().children_system - cpu0.children_system)
            rows.append(row)
            print(f"{n} hosts, {mech}: {row['sum_bits_per_s'] / 1e9:.2f} Gbit/s", flush=True)
    return rows


def _relay_cpu(lab):
    """CPU seconds (user + system) the lab's relay has used so far, or None."""
    proc = lab.relay_process
    if proc is None:
        return None
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calibration_table(rows):
    """Markdown: per set delay and ping-pong, ``RTT / measured one-way (error)`` in us."""
    keys = list(rows[0]["rtt_s"])
    names = [f"{k.split()[0].upper()} {_size(k.split()[1])}" for k in keys]
    lines = ["| set one-way | " + " | ".join(f"{n}: RTT / one-way" for n in names) + " |",
             "|" + "---|" * (1 + len(keys))]
    for row in rows:
        cells = [row["set"]]
        for k in keys:
            one_way, want = row["one_way_s"][k], row["set_s"]
            err = f" ({(one_way - want) / want:+.0%})" if want else ""
            cells.append(f"{row['rtt_s'][k] * 1e6:.0f} / {one_way * 1e6:.1f}{err}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rates_table(rows):
    """Markdown: TCP and MPI rates at each link rate and delay."""
    lines = ["| link | set one-way | one TCP stream | MPI 4 MiB messages |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rate']} | {r['set']} | {r['tcp_bits_per_s'] / 1e6:.0f} Mbit/s"
                     f" | {r['mpi_bits_per_s'] / 1e6:.0f} Mbit/s |")
    return "\n".join(lines)


def aggregate_table(rows):
    """Markdown: hosts, mechanism, summed rate (each receiver's own), bytes over wall time (from
    starting the senders to the last one done), relay CPU."""
    lines = ["| hosts | mechanism | sum of streams | all bytes / wall time | per host (min-max)"
             " | relay CPU |", "|---|---|---|---|---|---|"]
    for r in rows:
        per = r["per_host_bits_per_s"]
        cpu = "" if r["relay_cpu_s"] is None else f"{r['relay_cpu_s']:.2f} s"
        lines.append(f"| {r['hosts']} | {r['mechanism']} | {r['sum_bits_per_s'] / 1e9:.2f} Gbit/s"
                     f" | {r['wall_bits_per_s'] / 1e9:.2f} Gbit/s"
                     f" | {min(per) / 1e6:.0f}-{max(per) / 1e6:.0f} Mbit/s | {cpu} |")
    return "\n".join(lines)


def _size(nbytes):
    nbytes = int(nbytes)
    return f"{nbytes >> 10} KiB" if nbytes >= 1024 else f"{nbytes} B"


def _write(out, name, payload):
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            json.dump(payload, f, indent=1)
            f.write("\n")


def main(argv=None):
    """The command line; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calibrate", action="store_true", help="ping-pong table and rates")
    p.add_argument("--aggregate", action="store_true", help="all hosts sending at once")
    p.add_argument("--delays", nargs="+", default=["0", "50us", "200us", "500us", "2ms"])
    p.add_argument("--reps", type=int, default=300, help="ping-pong round trips per size")
    p.add_argument("--rounds", type=int, default=3, help="calibrate: interleaved repeats")
    p.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--bandwidth", default="1gbit", help="the links' rate (aggregate)")
    p.add_argument("--calibrate-bandwidth", default="none",
                   help="the links' rate for the ping-pong (default unshaped: the delay alone)")
    p.add_argument("--seconds", type=float, default=2.0, help="aggregate: seconds of data")
    p.add_argument("--no-rates", action="store_true", help="calibrate: the ping-pong only")
    p.add_argument("--relay", default="auto", choices=("auto", "c", "python"))
    p.add_argument("--out", default=None, help="folder for the json files")
    p.add_argument("--nice", type=int, default=None,
                   help="run the ping-pongs' processes at this niceness (e.g. -10 on a busy"
                        " machine: ranks busy-poll)")
    p.add_argument("--netmod", choices=("ucx", "ofi"), default=None,
                   help="MPICH's network module for the MPI ping-pong (default: MPICH's)")
    p.add_argument("--tcp-cc", choices=("bbr", "reno"), default=None,
                   help="TCP congestion control in the hosts (default: the machine's)")
    args = p.parse_args(argv)
    global NICE, NETMOD, TCP_CC
    NICE, NETMOD, TCP_CC = args.nice, args.netmod, args.tcp_cc
    ok, why = netlab.available()
    if not ok:
        print(f"latency_check: {why}", file=sys.stderr)
        return 1
    meta = {"command": " ".join(["python", "tools/latency_check.py"]
                                + (sys.argv[1:] if argv is None else list(argv))),
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if args.calibrate:
        delays = [netlab.parse_time(d) or 0.0 for d in args.delays]
        rows = calibrate(delays, args.reps, args.rounds, args.calibrate_bandwidth, args.relay)
        print(calibration_table(rows), flush=True)
        rates = [] if args.no_rates else rates_under_delay(args.relay)
        print(rates_table(rates), flush=True)
        _write(args.out, "calibration.json", dict(meta, pingpong=rows, rates=rates))
    if args.aggregate:
        rows = aggregate_rows(args.hosts, args.bandwidth, 50e-6, args.seconds)
        print(aggregate_table(rows), flush=True)
        _write(args.out, "aggregate.json", dict(meta, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
