"""`python -m opprof` runs the command line."""

from opprof.cli import main

if __name__ == "__main__":
    main()
