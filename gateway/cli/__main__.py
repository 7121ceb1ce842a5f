"""`python -m gateway.cli ...`: the same as the `batchyard` console script."""

from gateway.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
