"""`python -m localfleet`: the whole system on one machine (see `localfleet.fleet`)."""

import sys

from localfleet.fleet import main

if __name__ == "__main__":
    sys.exit(main())
