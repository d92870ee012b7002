"""Notice a dead rank at once: one TCP connection from every rank to rank 0, watched by a thread.

A rank killed by a signal (SIGKILL, the out-of-memory killer) says nothing. With MPICH's default
clean-up ``mpiexec`` then kills the others itself; with ``-disable-auto-cleanup`` (or a launcher
that does not clean up) the survivors would sit in their next allreduce until the communicators'
watchdog fires (50 s by default), because a shared-memory or TCP transport in MPICH does not
report a vanished peer. The kernel does: it closes a dead process's sockets, so the other end of a
connection reads end-of-file within milliseconds, wherever the two processes run.

So at start-up (:func:`start`, collective) rank 0 listens on an ephemeral TCP port on all its
interfaces, broadcasts its port and IPv4 addresses, and every other rank connects and sends its
rank number. One daemon thread per process then reads its connections:

- rank 0 reads all P - 1; end-of-file from rank r that did not first say ``bye`` means rank r
  died: rank 0 prints ``caffe_engine: rank r of P failed: it ended without a word (killed by a
  signal or crashed); aborting all ranks`` and aborts the job (``MPI_Abort``);
- every other rank reads its one connection; end-of-file from rank 0 without ``bye`` means rank 0
  died: rank 1 prints the same line for rank 0 and aborts; the rest abort quietly a moment later
  (one line for the user, not P - 1);
- under the ``caffe`` command each rank runs below a parent (:mod:`.supervisor`) that prints the
  exact line for a death by a signal (``killed by signal 9 (SIGKILL)``), so the watch then
  aborts without a line of its own;
- a rank that fails with an exception prints its own line (:func:`~.distributed.guard`) and
  first tells rank 0 (``fail``), so rank 0 does not print a second, vaguer line for it;
- a rank that ends normally says ``bye`` (``atexit``), so its end-of-file is no failure;
- MPICH's launcher signals the survivors (SIGUSR1) when a process dies, which by default kills
  them before they can say which rank died: the watch ignores that signal while it runs.

If ``MPI_Abort`` itself cannot end the job (a launcher that waits for the dead rank), the process
exits by itself :data:`EXIT_GRACE_S` seconds later. Where the connections cannot be made (no
route between hosts, ``CAFFE_PEER_WATCH=0``) nothing is watched and the watchdog of
:mod:`.communicator` remains the fallback; :func:`start` returns False then.

Messages are lines of text: ``bye``, ``fail``. Only addresses of the job's own hosts are used.
"""
import atexit
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import threading
import time

from .. import environment
from . import launcher, supervisor

#: Seconds a process waits for MPI_Abort to end it before it exits by itself.
EXIT_GRACE_S = 5.0
#: Seconds a non-reporting survivor waits before aborting (the reporting rank goes first).
QUIET_DELAY_S = 1.0
CONNECT_TIMEOUT_S = 2.0
ACCEPT_TIMEOUT_S = 20.0

log = logging.getLogger("caffe_engine")
_WATCH = None


def ipv4_addresses():
    """This host's IPv4 addresses, loopback first (SIOCGIFADDR on every interface; Linux)."""
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), 0x8915, request)   # SIOCGIFADDR
            except OSError:
                continue
            out.append(socket.inet_ntoa(reply[20:24]))
    return sorted(set(out), key=lambda a: (not a.startswith("127."), a))


class PeerWatch:
    """The connections of one rank and the thread that reads them (see the module docstring).

    Args:
        rank, size: this process's place in COMM_WORLD.
        socks: {peer rank: connected socket}.
        on_failure(message, report): called once, on the watch thread, when a peer died;
            ``report`` is whether this rank should print the message. Defaults to
            :func:`_abort`.
    """

    def __init__(self, rank, size, socks, on_failure=None):
        self.rank, self.size, self.socks = rank, size, dict(socks)
        self.on_failure = on_failure or _abort
        self._said_bye = set()
        self._announced = set()
        self._closing = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="caffe-peer-watch", daemon=True)
        self._thread.start()

    def say(self, word):
        """Send ``word`` (``bye`` or ``fail``) to every connected peer; errors are ignored."""
        with self._lock:
            for sock in self.socks.values():
                try:
                    sock.sendall(word.encode() + b"\n")
                except OSError:
                    pass

    def close(self):
        """Say ``bye`` and stop watching (a normal end of this rank)."""
        self._closing = True
        self.say("bye")

    def _run(self):
        buffers = {peer: b"" for peer in self.socks}
        by_fd = {sock.fileno(): peer for peer, sock in self.socks.items()}
        while by_fd:
            try:
                ready, _, _ = select.select(list(by_fd), [], [], 1.0)
            except (OSError, ValueError):
                return
            for fd in ready:
                peer = by_fd[fd]
                try:
                    data = self.socks[peer].recv(4096)
                except OSError:
                    data = b""
                if data:
                    buffers[peer] += data
                    *words, buffers[peer] = buffers[peer].split(b"\n")
                    for word in words:
                        if word == b"bye":
                            self._said_bye.add(peer)
                        elif word == b"fail":
                            self._announced.add(peer)
                    continue
                del by_fd[fd]
                if self._closing or peer in self._said_bye:
                    continue
                self._peer_died(peer)
                return

    def _peer_died(self, peer):
        if peer in self._announced:     # it printed its own line and is aborting the job
            self.on_failure(None, False)
            return
        # Rank 0 watches everyone and reports; when rank 0 itself died, rank 1 reports. Under
        # the caffe command each rank's parent reports its death by a signal exactly.
        report = (self.rank == 0 or self.rank == 1) and not supervisor.supervised()
        self.on_failure(f"caffe_engine: rank {peer} of {self.size} failed: it ended without a "
                        "word (killed by a signal or crashed); aborting all ranks", report)


def _abort(message, report):
    """Print ``message`` (when ``report``) and abort the job; exit by itself if that hangs."""
    exit_later = threading.Timer(EXIT_GRACE_S, os._exit, args=(1,))
    exit_later.daemon = True
    exit_later.start()
    if not report:
        time.sleep(QUIET_DELAY_S)
        message = ""
    launcher.abort_world(message)


def start(comm, on_failure=None):
    """Connect every rank to rank 0 and start watching (collective over the mpi4py ``comm``).

    Returns:
        bool: whether every rank is watched (False: ``CAFFE_PEER_WATCH=0``, one rank, or some
        rank could not connect — the communicators' watchdog is then the only guard).
    """
    global _WATCH
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return False
    # The launcher's banner after a kill names a PID, not a rank: say which is which once.
    parent = f" (under {os.getppid()})" if supervisor.supervised() else ""
    places = comm.allgather((os.getpid(), parent, socket.gethostname()))
    if rank == 0:
        log.info("Ranks: " + ", ".join(f"{r} pid {pid}{under} on {host}"
                                       for r, (pid, under, host) in enumerate(places)))
    if not environment.read("CAFFE_PEER_WATCH"):
        return False
    server = None
    if rank == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("0.0.0.0", 0))
        server.listen(size)
        where = (server.getsockname()[1], ipv4_addresses())
    else:
        where = None
    port, addresses = comm.bcast(where, root=0)
    sock = None
    if rank != 0:
        for address in addresses:
            try:
                sock = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
                sock.settimeout(None)
                sock.sendall(struct.pack("!i", rank))
                break
            except OSError:
                sock = None
    connected = comm.allgather(rank == 0 or sock is not None)
    socks = {}
    if rank == 0:
        server.settimeout(ACCEPT_TIMEOUT_S)
        try:
            for _ in range(sum(connected[1:])):
                conn, _ = server.accept()
                conn.settimeout(None)
                peer = struct.unpack("!i", _recv_exact(conn, 4))[0]
                socks[peer] = conn
        except OSError:
            pass
        server.close()
    elif sock is not None:
        socks[0] = sock
    everyone = comm.allreduce(int(all(connected) and (rank != 0 or len(socks) == size - 1)),
                              op=_min_op())
    if not everyone:
        log.warning("peer watch: not every rank could connect to rank 0; a killed rank is "
                    "noticed only by the communicators' watchdog")
        for s in socks.values():
            s.close()
        return False
    _WATCH = PeerWatch(rank, size, socks, on_failure)
    atexit.register(_WATCH.close)
    _keep_launcher_notice_from_killing()
    return True


def _keep_launcher_notice_from_killing():
    """Ignore SIGUSR1 while the watch runs (only where nothing else handles it).

    MPICH's launcher sends SIGUSR1 to the surviving processes when one of the job dies (seen
    with ``-disable-auto-cleanup``: the survivor ended 30 ms after the kill). Its default action
    kills the survivor before its watch thread can say which rank died; the watch ends the job
    by itself within milliseconds anyway.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def announce_failure():
    """Tell rank 0 that this rank failed and prints its own line (called before aborting:
    :func:`.launcher.before_abort`)."""
    if _WATCH is not None:
        _WATCH.say("fail")


launcher.before_abort(announce_failure)


def _recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed during the handshake")
        data += chunk
    return data


def _min_op():
    from mpi4py import MPI
    return MPI.MIN
