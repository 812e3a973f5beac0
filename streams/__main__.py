"""``python -m costline.streams`` is ``costline``."""

from costline.streams.cli.root import main

main()
