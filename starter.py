"""Entry point: `python starter.py` runs the relay (see inboxcrm/relay.py)."""

from inboxcrm.relay_main import main

if __name__ == "__main__":
    main()
