"""python -m uma: the same as the `uma` command."""

from uma.cli import main

main()
