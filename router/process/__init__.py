"""The process layer: `spec-router serve` (``serve``), and for ``--workers N`` the supervisor
(``supervisor``) and each worker (``worker``). On top of everything; nothing in the router
imports it but the command line (``router.cli``).
"""
