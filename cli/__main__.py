"""`python -m cli ...` (from a checkout) or `python -m kdtree_cli ...` (installed) = `kdtree`."""

from .main import main

main()
