"""The ``cronscale`` command line (``cronscale = scheduler.cli:main``).

``app`` wires argparse; ``schedules`` holds the API commands; ``build`` turns arguments into
requests and ``output`` renders responses (both pure, unit-tested); ``processes`` starts the
long-running processes; ``dev`` runs them together in one terminal.
"""

from scheduler.cli.app import main

__all__ = ["main"]
