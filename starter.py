"""Entry point: `python starter.py` runs the relay (see inboxcrm/ingress/app.py)."""

from inboxcrm.ingress.main import main

if __name__ == "__main__":
    main()
