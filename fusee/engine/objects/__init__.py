"""Objects (keyed state): a key is a long-lived run of its type's built-in workflow and
each call an update of it (docs/objects.md). `flow.py` is that workflow, `edit.py` the
edits from outside, `handle.py` what engines and clients call."""

from fusee.engine.objects.handle import ObjectRef, Objects

__all__ = ["ObjectRef", "Objects"]
