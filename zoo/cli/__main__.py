"""`python -m zoo.cli ...` is `zoo ...`."""

from zoo.cli import main

main()
