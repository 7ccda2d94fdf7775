"""Where the tests find the repository: its root, the package and the scripts."""

from __future__ import annotations

from pathlib import Path

#: The repository's root (the folder holding ``staticattn/`` and ``tests/``).
ROOT = Path(__file__).resolve().parents[2]
