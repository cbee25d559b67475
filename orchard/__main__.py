"""`python -m orchard`: the same as the `orchard` command."""

from orchard.cli import main

main()
