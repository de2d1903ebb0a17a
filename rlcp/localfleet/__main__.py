"""`python -m rlcp.localfleet`: the whole system on one machine (see `rlcp.localfleet.fleet`)."""

import sys

from rlcp.localfleet.fleet import main

if __name__ == "__main__":
    sys.exit(main())
