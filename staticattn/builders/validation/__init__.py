"""Validation of a step before anything is written: one implementation of each value check
(:mod:`.values`), the host arrays an engine stages (:mod:`.host`), the views it writes in
place (:mod:`.views`), a :class:`~staticattn.builders.batch.Batch` (:mod:`.batch_checks`) and
the consistency of a step across decode-context-parallel ranks (:mod:`.dcp_step`)."""

from staticattn.builders.validation.batch_checks import validate
from staticattn.builders.validation.host import validate_host_step

__all__ = ["validate", "validate_host_step"]
