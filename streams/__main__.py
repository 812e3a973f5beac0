"""``python -m streams`` is ``costline``."""

from streams.cli import main

main()
