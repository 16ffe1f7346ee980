"""The job's spark-submit entry point (`/opt/kcm/rollup.py ARGS` in the image): the same as `kcm rollup ARGS`."""

import sys

from kcm_cli.main import main

if __name__ == "__main__":
    sys.exit(main(["rollup", *sys.argv[1:]]))
