#!/usr/bin/env python
"""netlab's delay relay in Python: the same program as ``tools/netlab_relay.c``, for machines
without a C compiler (netlab uses it then, or when asked: ``Lab(relay="python")``).

Usage: ``netlab_relay.py HOLD_NS BURST_BYTES QUEUE_NS WAKE_NS FIFO_PRIORITY PORT...`` with
``PORT = NETNS_PATH,IFNAME,OCTET,RATE``; see the C
file for what it does. It carries less than the C relay (measured in tools/latency_check.py's
``--aggregate``: docs/scaling.md, "Latency on the links").
"""
import ctypes
import fcntl
import os
import select
import signal
import struct
import sys
import time
from collections import deque

TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0
IFF_TUN, IFF_NO_PI, IFF_VNET_HDR = 0x0001, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
VNET = 10                       # struct virtio_net_hdr before each packet
CLONE_NEWNET = 0x40000000
BUF = VNET + 65536 + 4096
BATCH = 64


def _setns(path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def wire_bytes(data):
    """Bytes a packet (after its virtio_net_hdr) takes on the wire: a GSO packet's segments each
    carry its headers, as tbf counts them."""
    gso_type, hdr_len, gso_size = data[1], data[2] | data[3] << 8, data[4] | data[5] << 8
    size = len(data) - VNET
    if gso_type and gso_size and size > hdr_len:
        size += (-(-(size - hdr_len) // gso_size) - 1) * hdr_len
    return size


def tun_open(netns, name):
    """A TUN device ``name`` made in ``netns`` (a path); returns its non-blocking fd."""
    _setns(netns)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(),
                                           IFF_TUN | IFF_NO_PI | IFF_VNET_HDR))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    _setns("/proc/self/fd/%d" % HOME)
    return fd


class Port:
    """One output port: its fd, its FIFO of (send time ns, packet), its token bucket."""

    def __init__(self, fd, rate):
        self.fd, self.ns_per_byte = fd, (8e9 / rate if rate > 0 else 0.0)
        self.tat, self.queue, self.dropped = 0, deque(), 0


def main(argv):
    hold, burst, queue_ns, wake, priority = (int(a) for a in argv[:5])
    if priority > 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        except OSError as exc:
            print(f"netlab_relay: SCHED_FIFO (going on without): {exc}", file=sys.stderr)
    ports, by_octet = {}, {}
    for spec in argv[5:]:
        netns, name, octet, rate = spec.split(",")
        port = Port(tun_open(netns, name), float(rate))
        ports[port.fd] = by_octet[int(octet)] = port
    print("ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    clock = time.monotonic_ns
    watched = [0] + list(ports)
    while True:
        now, nxt = clock(), None
        for q in ports.values():
            while q.queue and q.queue[0][0] <= now:
                os.write(q.fd, q.queue.popleft()[1])
            if q.queue and (nxt is None or q.queue[0][0] < nxt):
                nxt = q.queue[0][0]
        timeout = None if nxt is None else max(nxt - now - wake, 0) / 1e9
        for fd in select.select(watched, [], [], timeout)[0]:     # select: microseconds
            if fd == 0:
                if not os.read(0, 1):
                    return 0
                continue
            for _ in range(BATCH):
                try:
                    data = os.read(fd, BUF)
                except BlockingIOError:
                    break
                ok = len(data) >= VNET + 20 and data[VNET] >> 4 == 4
                q = by_octet.get(data[VNET + 19]) if ok else None
                if q is None:
                    continue
                ready = send = clock() + hold
                if q.ns_per_byte:
                    size = wire_bytes(data)
                    send = max(ready, q.tat + int((size - burst) * q.ns_per_byte))
                    if send - ready > queue_ns:
                        q.dropped += 1
                        continue
                    q.tat = max(q.tat, send) + int(size * q.ns_per_byte)
                q.queue.append((send, data))


if __name__ == "__main__":
    HOME = os.open("/proc/self/ns/net", os.O_RDONLY)
    sys.exit(main(sys.argv[1:]))
