"""`python launcher.py`: the training launcher (`seal.launcher`; installed as `seal-train`)."""

import sys

from seal.launcher import main

if __name__ == "__main__":
    sys.exit(main())
