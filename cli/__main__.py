"""`python -m cli ...` = the `kdtree` command (for machines where it is not installed)."""

from cli.main import main

main()
