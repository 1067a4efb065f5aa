"""Where the tests find the repository: its root, whatever folder of tests/ a test sits in."""

from pathlib import Path

#: The repository's root (the parent of tests/).
REPO = Path(__file__).resolve().parent.parent
