"""Cross-rank agreement: every rank of a group issues the same collectives, in order.

Before launching a collective each rank posts its signature (the collective's name,
program and input shapes) to the group's c10d store under the group's next collective
number and reads its peers' (four store round trips, ~0.1 ms on one host; the issuing
thread also waits there for its peers to reach the collective). Ranks that issued
different collectives (op or shape) all fail at once with an error naming each rank's
collective, instead of hanging in, or silently mixing, two different XLA programs. A
peer that has not posted within a grace period (TORCHTPU_DIST_CHECK_GRACE, default
5 s, at most the group timeout) is not waited for further: the collective launches
and is verified when it completes (if it never does, the timeout error says what each
peer last issued). Compiled graphs (`check_program`) and fused regions (`exchange`)
post a digest of their collectives the same way before a new program first runs.
TORCHTPU_DIST_CHECK=0 turns all of it off (the group then has no Agreement).
"""
from __future__ import annotations

import datetime
import json
import time

from .watchdog import TpuDistError, watchdog


def shape_str(ts) -> str:
    return ", ".join(f"{tuple(t.shape)}:{str(t.dtype).replace('torch.', '')}" for t in ts)


def _detail(key) -> str:
    """The program's static arguments, as a user reads them (reduction, root)."""
    if key[0] in ("allreduce", "reduce_scatter"):
        return f"({key[1]})"
    if key[0] in ("broadcast", "scatter"):
        return f"(src {key[1]})"
    return ""


def _sig_key(seq: int, rank: int) -> str:
    return f"torchtpu/sig/{seq}/{rank}"


class Agreement:
    """The signature protocol of one group over its c10d store."""

    def __init__(self, store, rank: int, size: int, grace: float, timeout: float, group_name):
        self.store = store
        self.rank = rank
        self.size = size
        self.grace = grace
        self.timeout = timeout
        self.group_name = group_name  # callable: the group's name can be set after creation
        self.seq = 0  # group-wide collectives issued (point-to-point ones are not counted)

    def match(self, name, key, flats, ts, desc):
        """Post this rank's signature for the next collective and compare with the peers'.

        Returns (verify, info) for the watchdog: verify is None when every peer's signature
        was seen and matched here; else it checks them once the collective has completed."""
        store, me = self.store, self.rank
        self.seq += 1
        seq = self.seq
        prog = f"{name} {key!r} " + " ".join(f"{str(f.dtype)}[{f.shape[0]}]" for f in flats)
        mine = json.dumps(dict(prog=prog, what=f"{name}{_detail(key)} on [{shape_str(ts)}]"))
        peers = [_sig_key(seq, r) for r in range(self.size) if r != me]
        try:
            store.set(_sig_key(seq, me), mine)
            if seq > 2:
                store.delete_key(_sig_key(seq - 2, me))  # every peer has read it (it posted seq - 1)
        except Exception as e:  # noqa: BLE001
            msg = f"torchtpu.distributed: {desc}: the c10d store is unreachable ({e}); a peer probably died"
            watchdog().fail(msg)
            raise TpuDistError(msg) from e

        def info() -> str:
            return self.peer_report(seq)

        def verify(wait: float = 0.0) -> bool:
            if wait > 0:
                try:
                    store.wait(peers, datetime.timedelta(seconds=wait))
                except Exception:  # noqa: BLE001 - not all posted within the grace period
                    return False
            elif not store.check(peers):
                return False
            sigs = {me: json.loads(mine)}
            for r, v in zip([r for r in range(self.size) if r != me], store.multi_get(peers)):
                sigs[r] = json.loads(v)
            if any(sigs[r]["prog"] != sigs[me]["prog"] for r in sigs):
                self.mismatch(seq, desc, sigs)
            return True

        try:
            if verify(self.grace):
                return None, info
        except TpuDistError:
            raise
        except Exception:  # noqa: BLE001 - store trouble: let the collective itself decide
            pass
        return (lambda: verify()), info

    def exchange(self, prog: str, what: str) -> tuple[int, dict]:
        """Post this rank's next program (a fused region's or a compiled graph's collectives)
        under the group's next collective number and wait for every peer's; returns the
        number and {rank: {"prog", "what"}} for every rank. A peer that never posts ends in
        the process-group timeout with an error naming what this rank was about to run."""
        wd = watchdog()
        wd.check()
        store, me = self.store, self.rank
        self.seq += 1
        seq = self.seq
        mine = dict(prog=prog, what=what)
        others = [r for r in range(self.size) if r != me]
        peers = [_sig_key(seq, r) for r in others]
        desc = f"{what} (rank {me} of {self.size}, collective #{seq})"
        wd.dispatching = (desc, time.monotonic(), self.timeout, lambda: self.peer_report(seq))
        try:
            store.set(_sig_key(seq, me), json.dumps(mine))
            if seq > 2:
                store.delete_key(_sig_key(seq - 2, me))  # every peer has read it (it posted seq - 1)
            store.wait(peers, datetime.timedelta(seconds=self.timeout))
            sigs = {r: json.loads(v) for r, v in zip(others, store.multi_get(peers))}
        except Exception as e:  # noqa: BLE001
            msg = (f"torchtpu.distributed: {desc}: the peers did not post their next collective within the "
                   f"process-group timeout ({e}); a peer probably died or hangs")
            wd.fail(msg)  # ends the process unless TORCHTPU_DIST_ABORT=0
            raise TpuDistError(msg) from e
        finally:
            wd.dispatching = None
        sigs[me] = mine
        return seq, sigs

    def check_program(self, what: str, digest: str) -> None:
        """Before a compiled SPMD program first runs: every rank must run the same
        collectives (a rank-dependent branch in compiled code compiles another graph)."""
        prog = f"GRAPH {digest}"
        seq, sigs = self.exchange(prog, what)
        if any(v["prog"] != prog for v in sigs.values()):
            self.mismatch(seq, f"{what} (rank {self.rank} of {self.size})", sigs)

    def mismatch(self, seq, desc, sigs):
        lines = "; ".join(f"rank {r} issued {sigs[r]['what']}" for r in sorted(sigs))
        msg = (f"torchtpu.distributed: {desc}: the ranks of group {self.group_name()!r} issued different "
               f"collectives at collective #{seq}: {lines}. Every rank of a group must issue the same "
               "collectives, in the same order, on tensors of the same shapes and dtypes.")
        # let every peer read this rank's signature before a process (maybe the store's host) ends
        try:
            self.store.set(f"torchtpu/seen/{seq}/{self.rank}", "1")
            self.store.wait([f"torchtpu/seen/{seq}/{r}" for r in sigs], datetime.timedelta(seconds=3))
        except Exception:  # noqa: BLE001
            pass
        watchdog().fail(msg)  # ends the process unless TORCHTPU_DIST_ABORT=0
        raise TpuDistError(msg)

    def peer_report(self, seq: int) -> str:
        """What each peer last posted, for an error message (reads the store, never waits)."""
        out = []
        for r in range(self.size):
            if r == self.rank:
                continue
            for s in (seq, seq - 1):
                k = _sig_key(s, r)
                if s > 0 and self.store.check([k]):
                    what = json.loads(self.store.get(k))["what"]
                    out.append(f"rank {r} issued {what} as collective #{s}" + ("" if s == seq else
                                                                              " and nothing since"))
                    break
            else:
                out.append(f"rank {r} has not issued collective #{seq}")
        return f"collective #{seq} of group {self.group_name()!r} here; " + ", ".join(out) if out else ""
