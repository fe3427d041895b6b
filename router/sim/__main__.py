import sys

from router.sim.cli import main

raise SystemExit(main(sys.argv[1:]))
