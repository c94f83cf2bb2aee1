"""``python -m r3store.cli``: the ``r3store`` command line."""

from r3store.cli import main

if __name__ == "__main__":
    main()
