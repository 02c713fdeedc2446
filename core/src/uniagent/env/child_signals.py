"""Signals as a login shell gets them, for every process a host sandbox starts.

A blocked signal stays blocked and an ignored one ignored across ``exec``, in the started
process and in all it runs. A Ray worker (where verl's agent-loop workers open their
sandboxes) blocks SIGINT in all its threads, and a script's background job ignores SIGINT
and SIGQUIT: inherited, a timed-out command's interrupt never arrived (the whole session
was killed instead), and the tests a reward runs saw another signal state than under
``uniagent run`` (a test of Ctrl-C handling passes in one and hangs in the other).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

#: Dispositions ``subprocess`` resets in every child itself (Python ignores both signals).
_RESET_BY_SUBPROCESS = frozenset({signal.SIGPIPE, getattr(signal, "SIGXFSZ", signal.SIGPIPE)})
#: The signals whose disposition is looked at, as plain numbers (asked at every spawn: about
#: 30 us for all of them, 220 us with ``valid_signals()``'s enums each time).
_CATCHABLE = tuple(
    int(number)
    for number in sorted(signal.valid_signals())
    if number not in _RESET_BY_SUBPROCESS and number not in (signal.SIGKILL, signal.SIGSTOP)
)


def login_signals() -> Callable[[], None] | None:
    """A ``preexec_fn`` that gives a child of the calling thread no blocked signal and no
    ignored one, or ``None`` where it would get none anyway (the common case, which keeps
    ``subprocess``'s ``vfork``: a ``preexec_fn`` costs a ``fork``)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # this thread's: a child's mask
    ignored = tuple(n for n in _CATCHABLE if signal.getsignal(n) is signal.SIG_IGN)
    if not blocked and not ignored:
        return None

    def reset() -> None:  # in the child, between fork and exec
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        for number in ignored:
            signal.signal(number, signal.SIG_DFL)

    return reset
