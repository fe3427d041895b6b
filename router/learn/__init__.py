"""Learning from the requests served: the curves and the crossover (``learner``), the engine
models of the slo policy (``models``), and their owner (``keeper``). Plain data and arithmetic:
no I/O package is imported here (tests/test_layout.py holds it to that)."""
