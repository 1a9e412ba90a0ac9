"""`python -m opprof` runs the command line."""

from opprof.cli import main

main()
