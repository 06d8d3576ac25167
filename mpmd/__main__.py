"""``python -m mpmd``: the same command line as the ``mpmd`` script."""

from mpmd.cli.main import main

if __name__ == "__main__":
    main(prog_name="mpmd")
