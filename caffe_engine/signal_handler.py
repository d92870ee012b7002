"""SIGINT and SIGHUP remembered while a command runs, and acted on where it asks.

Caffe: src/caffe/util/signal_handler.cpp. A handler only records the signal; the command asks
at a safe point: ``train`` between solver iterations (:meth:`SignalHandler.check_for_signals`,
the solver's ``action_request_function``: ``--sigint_effect`` / ``--sighup_effect``), ``test``
and ``time`` between batches and layers (:meth:`InterruptCheck.check`). Python's own
KeyboardInterrupt, raised wherever the signal lands, is lost when that is a weakref callback or
a ``__del__`` (Python prints "Exception ignored ... KeyboardInterrupt" and the command runs on).
The handlers are installed for the duration of a ``with`` block; the previous ones come back
after it.
"""
import signal

from .flags import UsageError


class SignalHandler:
    """SIGINT / SIGHUP turned into solver actions (Caffe's SignalHandler).

    A signal is remembered until :meth:`check_for_signals` reports it once (SIGHUP first).
    An effect of None leaves that signal's handler as it is.

    Raises:
        UsageError: an effect other than ``stop``, ``snapshot``, ``none`` (or None).
    """

    def __init__(self, sigint_effect="stop", sighup_effect="snapshot"):
        from .solvers import SolverAction
        for name, value in (("sigint_effect", sigint_effect), ("sighup_effect", sighup_effect)):
            if value is not None and value not in SolverAction.ALL:
                raise UsageError(f'Invalid signal effect "{value}" was specified (--{name}: '
                                 "stop, snapshot or none)")
        self.effects = {name: effect for name, effect in
                        (("SIGINT", sigint_effect), ("SIGHUP", sighup_effect)) if effect}
        self.got = dict.fromkeys(self.effects, False)
        self._previous = {}

    def _handle(self, signum, frame):
        self.got[signal.Signals(signum).name] = True

    def __enter__(self):
        for name in self.got:
            sig = getattr(signal, name, None)     # no SIGHUP on Windows
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def check_for_signals(self):
        """The action for a signal received since the last call (``none`` without one)."""
        for name in ("SIGHUP", "SIGINT"):
            if self.got.get(name):
                self.got[name] = False
                return self.effects[name]
        return "none"


class InterruptCheck(SignalHandler):
    """SIGINT during ``caffe test`` and ``caffe time`` (SIGHUP as it was): remembered, and
    raised as KeyboardInterrupt (``caffe: interrupted``, status 130) by :meth:`check`, which
    the commands call between batches and layers. A second SIGINT before a check raises at
    once."""

    def __init__(self):
        super().__init__(sigint_effect="stop", sighup_effect=None)

    def _handle(self, signum, frame):
        self.check()
        super()._handle(signum, frame)

    def check(self):
        """Raise KeyboardInterrupt when SIGINT has come."""
        if self.got["SIGINT"]:
            raise KeyboardInterrupt
