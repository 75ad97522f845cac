"""`python -m opforge ...`: the `opforge` command line, for environments
without the console script on PATH.

    $ python -m opforge --version
    opforge 0.1.0 (built against torch 2.13.0+cpu)
"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
