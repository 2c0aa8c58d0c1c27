"""The ``faultstream`` command line (entry point ``stream.cli:main``)."""

from stream.cli.main import main

__all__ = ["main"]
