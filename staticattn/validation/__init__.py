"""Every check of a step before anything is written: one implementation of each value check
(:mod:`.values`), the host arrays an engine hands (:mod:`.host_arrays`), the views it writes
in place (:mod:`.in_place_views`), block ids against the KV pool (:mod:`.block_ids`), the
extents of the staging (:mod:`.extents`), bounded replay's starts (:mod:`.replay_start`),
image spans (:mod:`.image_spans`) and the consistency of a step across decode-context-parallel
ranks (:mod:`.dcp_step`)."""

from staticattn.validation.host_arrays import validate_host_step

__all__ = ["validate_host_step"]
