"""`python -m ascent ...` runs the `ascent` command."""

from ascent.cli import main

main()
