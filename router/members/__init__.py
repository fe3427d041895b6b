"""Which backends each pool has, as it changes at run time: the members and how two sets of
them differ (``member``), the owners of the set (``store``: one process's, or under
``--workers`` the shared table's), each process's applied view and its "membership changed"
notification (``roster``), where the set comes from (``targets``: the configured URLs; and
``discovery`` over ``dns``, with ``grace`` deciding what a failed or empty answer does)."""
