"""``python -m compass``: the same command line as the ``compass`` script."""

from __future__ import annotations

from compass._cli.main import main

if __name__ == "__main__":
    main()
