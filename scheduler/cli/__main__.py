"""``python -m scheduler.cli``: what ``cronscale dev`` starts its children with."""

from scheduler.cli.app import main

# Guarded: a process that ``schedule import`` spawns to parse part of a large file imports
# this module again (as ``__mp_main__``), and must not run the command a second time.
if __name__ == "__main__":
    raise SystemExit(main())
