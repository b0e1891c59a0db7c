"""Run `inboxcrm.sandbox` (the same options; `python -m sandbox --help`)."""

import sys

from inboxcrm.sandbox.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
