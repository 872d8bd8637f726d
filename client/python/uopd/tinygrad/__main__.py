"""python3 -m uopd.tinygrad PROGRAM.py [ARGS...]: runs an unmodified tinygrad program with
the UOPD device registered (DEV=UOPD picks it), as `python3 PROGRAM.py ARGS...` would."""
import runpy
import sys

import uopd.tinygrad  # noqa: F401  (registers the device)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2 if len(sys.argv) < 2 else 0)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(sys.argv[0])))
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
