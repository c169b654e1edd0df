"""`python -m seqis.bench`: run the benchmark sections (see seqis/bench/__init__.py)."""

from . import main

main()
