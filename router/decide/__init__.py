"""Deciding where a request goes: the policies over a plain ``Snapshot`` (``policy``), what the
slo policy knows of the engines (``predict``), each pool's SLO capacity it routes by
(``capacity``) and its tunables (``params``), the pieces of recent traffic a snapshot is built
from (``snapshot``) and the crossover table (``table``). Plain functions over plain data: no I/O
package is imported here (tests/test_layout.py holds it to that)."""
