"""Entry point: `python worker.py` runs the inboxcrm worker (see inboxcrm/worker.py)."""

from inboxcrm.worker import main

if __name__ == "__main__":
    main()
