"""``python -m scheduler.cli``: what ``cronscale dev`` starts its children with."""

from scheduler.cli.app import main

raise SystemExit(main())
