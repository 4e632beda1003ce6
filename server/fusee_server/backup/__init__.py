"""Continuous backup of a data directory, and restoring it (docs/backup.md)."""
