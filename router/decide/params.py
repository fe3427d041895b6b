"""The ``slo`` policy's tunables, in one place, each with where its value came from.

A tunable is kept only while a sweep of it over the policy lab's family of workloads
(``bench/policy_family.py --sweep``, ``bench/results/policy-family.md``) shows that moving it by
25% either way moves goodput beyond the noise; what did not earn its place is gone, and what is
derived (from the curves, the mix, the SLO) is not a tunable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def _tunable(default: float, provenance: str) -> float:
    return field(default=default, metadata={"provenance": provenance})


@dataclass(frozen=True, slots=True)
class Params:
    # A capacity is the most requests an engine runs with their time per token within this
    # share of the target (the steady state's mean: about half of the requests come out above
    # it, their share of stalls being random).
    tpot_margin: float = _tunable(1.0, "the SLO's own target; swept in policy-family.md")
    # A capacity is the most requests an engine runs with at least this share of them within
    # the target (their stalls being random: a Poisson number of prefills in their decode).
    meet_share: float = _tunable(0.5, "the median request; swept in policy-family.md")
    # How much a request meeting the strict target counts over one meeting only the relaxed
    # one (a strict one counts for both).
    strict_weight: float = _tunable(1.0, "the benchmark's two goodputs, as equals")
    # (experimental switches, decided by the lab)
    rule: str = field(default="phases", metadata={"provenance": "lab"})
    lately: float = field(default=5.0, metadata={"provenance": "lab"})
    phase2: str = field(default="spread", metadata={"provenance": "lab"})
    dump: str = field(default="most", metadata={"provenance": "lab"})
    phase3: str = field(default="overloaded", metadata={"provenance": "lab"})
    overload: float = _tunable(1.0, "lab")

    def provenance(self) -> dict[str, tuple[float, str]]:
        """Each tunable's value and where it came from (for /router/status and the report)."""
        return {f.name: (getattr(self, f.name), f.metadata["provenance"]) for f in fields(self)}


DEFAULT = Params()
