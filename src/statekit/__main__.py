"""``python -m statekit``: the statekit command line."""

from statekit.cli import main

if __name__ == "__main__":
    main(prog_name="statekit")
