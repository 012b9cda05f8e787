"""`python scripts/make_tables.py`: the paper's tables from evaluation directories (`seal.report.make_tables`;
installed as `seal-tables`)."""

import sys

from seal.report.make_tables import main

if __name__ == "__main__":
    sys.exit(main())
