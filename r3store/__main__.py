"""``python -m r3store``: the ``r3store`` command line (as ``python -m r3store.cli``)."""

from r3store.cli import main

if __name__ == "__main__":
    main(prog_name="r3store")
