"""The gateway's connections to the EPP, and which of them went away.

Envoy sends a request's ext_proc stream and, after its last byte, its access-log record from
the same worker thread, over that worker's one HTTP/2 connection to the EPP: the gRPC peer
(``ipv4:10.0.0.7:43122``) of the ext_proc stream is the peer the record will come from. When
that connection's access-log stream ends (the gateway was killed, or the connection broke),
the records of the requests routed over it will not come. A live gateway opens a new
access-log stream at its next record and keeps asking over ext_proc, so a peer whose last
log stream closed and that is heard from no more within a grace period is gone: its leases
are let go (``Picker.gateway_gone``) instead of waiting for ``--lease-max-age``.

A peer that never had an access-log stream here (its records go to another EPP replica) is
never judged gone; the max age bounds its leases.
"""

from __future__ import annotations

from collections import Counter


class Connections:
    """Open access-log streams by peer, and the peers whose last one closed (plain data)."""

    def __init__(self) -> None:
        self._logs: Counter[str] = Counter()
        self._quiet: dict[str, int] = {}  # peer -> the closing that made it quiet
        self._closings = 0

    def heard(self, peer: str) -> None:
        """An ext_proc stream from ``peer``: it is alive."""
        if self._quiet:
            self._quiet.pop(peer, None)

    def log_opened(self, peer: str) -> None:
        self._logs[peer] += 1
        self._quiet.pop(peer, None)

    def log_closed(self, peer: str) -> int | None:
        """An access-log stream from ``peer`` ended: if it was its last, a token to ask
        ``gone`` with once the grace period has passed (None: others are open)."""
        self._logs[peer] -= 1
        if self._logs[peer] > 0:
            return None
        del self._logs[peer]
        self._closings += 1
        self._quiet[peer] = self._closings
        return self._closings

    def gone(self, peer: str, token: int) -> bool:
        """Whether ``peer`` stayed quiet since the closing ``token`` names (and forget it)."""
        if self._quiet.get(peer) != token:
            return False
        del self._quiet[peer]
        return True

    def status(self) -> dict[str, int]:
        return {"log_streams": sum(self._logs.values()), "quiet_peers": len(self._quiet)}
