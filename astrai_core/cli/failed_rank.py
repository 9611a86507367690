"""Which rank of a failed distributed run caused the others' failure, and how to say it.

torchrun reports how each process ended (exit status or signal, and when); each process
may also have left its one-line error and its progress (:mod:`astrai_core.distributed.
worker_report`). One failure drags the others down (torchrun stops them, gloo aborts the
ones that lose a peer, a collective times out waiting for a frozen rank), so the first to
end is often not the cause: :func:`blame` reads the kind of each ending, and the progress
when no rank failed on its own.
"""

from __future__ import annotations

import signal

from astrai_core.distributed.worker_report import Ending


# How a process ended, most likely the cause first: killed by a signal from outside (or a
# crash) no later than any other process ended; an error of its own; an abort (gloo's
# threads abort a process whose peer went away); SIGTERM, which torchrun sends the
# survivors once one process failed; a collective that failed because a peer was gone or
# stuck; a signal after the others ended (torchrun's SIGKILL for a process that ignored
# its SIGTERM).
_KILLED, _OWN_ERROR, _ABORTED, _TERMINATED, _LOST_PEER, _KILLED_LATER = range(6)


def _kind(ending: Ending, first: int) -> int:
    if ending.code >= 0 or (ending.error and not ending.lost_peer):
        # a process that reported an error of its own failed first, even where torchrun's
        # SIGTERM reached it while it was still exiting (after a peer's gloo abort)
        return _LOST_PEER if ending.lost_peer else _OWN_ERROR
    if ending.code == -signal.SIGABRT:
        return _ABORTED
    if ending.code == -signal.SIGTERM:
        return _TERMINATED
    return _KILLED if ending.timestamp <= first else _KILLED_LATER


def blame(endings: dict[int, Ending]) -> tuple[int, str]:
    """(the rank whose failure caused the others', what happened to it, in words)."""
    first = min(e.timestamp for e in endings.values())
    kinds = {rank: _kind(e, first) for rank, e in endings.items()}
    if all(kind > _OWN_ERROR for kind in kinds.values()):
        frozen = _frozen(endings)
        if frozen:
            return frozen[0], _froze(frozen, endings)
    rank = min(endings, key=lambda r: (kinds[r], endings[r].timestamp, r))
    return rank, _failure(rank, endings[rank])


def _frozen(endings: dict[int, Ending]) -> list[int]:
    """The ranks that stopped making progress: when some rank timed out waiting in a
    collective, those still running then (stopped by torchrun afterwards), narrowed to the
    ones whose recorded progress is behind every other rank's."""
    waited = [e.timestamp for e in endings.values() if e.lost_peer]
    if not waited:
        return []
    stuck = [r for r, e in endings.items() if not e.lost_peer and e.timestamp >= min(waited)]
    progress = {r: e.progress for r, e in endings.items()}
    if None not in progress.values() and len(set(progress.values())) > 1:
        lowest = min(progress.values())
        stuck = [r for r in stuck if progress[r] == lowest] or stuck
    return sorted(stuck)


def _froze(ranks: list[int], endings: dict[int, Ending]) -> str:
    ending = endings[ranks[0]]
    where = f" {ending.where}" if ending.where else ""
    who = f"rank {ranks[0]}" if len(ranks) == 1 else \
        f"one of ranks {', '.join(map(str, ranks))}"
    return (f"{who} stopped making progress{where} and the others timed out waiting for it "
            f"(parallel.timeout_seconds); it was then stopped with {_signal_name(ending.code)}")


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}" if code < 0 else f"status {code}"


def culprit(failures: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(rank, exit code) of the process whose failure caused the others', from ``{rank:
    (exit code, timestamp)}`` alone (see :func:`blame`)."""
    rank, _ = blame({r: Ending(code, stamp) for r, (code, stamp) in failures.items()})
    return rank, failures[rank][0]


def _failure(rank: int, ending: Ending | int) -> str:
    """What happened to the failed ``rank``: the error it reported, or a signal it could
    not report (SIGKILL: out of memory, or killed from outside)."""
    if isinstance(ending, int):
        ending = Ending(ending, 0)
    code = ending.code
    if code >= 0:
        if ending.error:
            return f"rank {rank} exited with status {code}: {ending.error}"
        return (f"rank {rank} exited with status {code} without reporting an error (any "
                "output of its own is above)")
    name = _signal_name(code)
    if ending.error:
        return f"rank {rank} failed ({name} while it exited): {ending.error}"
    return (f"rank {rank} was killed by {name} (signal {-code}) and could print no error "
            "of its own (out of memory, or killed from outside?)")
