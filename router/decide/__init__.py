"""Deciding where a request goes: the policies over a plain ``Snapshot`` (``policy``), what the
slo policy predicts (``predict``, ``twin``), the pieces of recent traffic a snapshot is built
from (``snapshot``) and the crossover table (``table``). Plain functions over plain data: no I/O
package is imported here (tests/test_layout.py holds it to that)."""
