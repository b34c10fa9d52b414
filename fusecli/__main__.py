"""``python -m fusecli``."""

from .cli import main

main()
