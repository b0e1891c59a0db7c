"""`python -m inboxcrm.cli`: the console script without its installed entry point."""

from inboxcrm.cli.main import main

main()
