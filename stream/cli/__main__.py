"""``python -m stream.cli``."""

from stream.cli.main import main

raise SystemExit(main())
