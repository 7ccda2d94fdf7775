"""Bounded replay's per-request starts (``docs/spec/deepseek-v41.md`` §8.1) for drawn steps:
a strategy that draws them for a step, and the plain predicate of the starts a step must
refuse (:func:`~staticattn.validation.replay_start.check_replay_start`'s rule, written from
the spec)."""

from __future__ import annotations

from hypothesis import strategies as st

from staticattn.arena import ArenaConfig

__all__ = ["replay_fault", "replay_starts"]


def _leading_decodes(cfg: ArenaConfig, q) -> int:
    """The requests in front of the first one whose query exceeds the decode threshold:
    every request of a step without a prefill."""
    over = [i for i, x in enumerate(q) if x > cfg.decode_threshold]
    return over[0] if over else len(q)


@st.composite
def replay_starts(draw, cfg: ArenaConfig, q, s) -> list[int]:
    """Starts of a step of query lengths ``q`` and sequence lengths ``s``: each prefill's
    inside its context (0 often), the decodes' 0; one step in three with a planted fault --
    a start given for one of the leading decodes (any request of a step of decodes only)
    or one past its request's context."""
    rs = [draw(st.sampled_from([0, max(0, b - a)]) | st.integers(0, max(0, b - a)))
          if a > cfg.decode_threshold else 0 for a, b in zip(q, s)]
    fault = draw(st.sampled_from([None, None, None, None, "decode", "past"]))
    lead = _leading_decodes(cfg, q)
    if fault == "decode" and lead:
        rs[draw(st.integers(0, lead - 1))] = draw(st.integers(1, 3))
    elif fault == "past" and rs:
        b = draw(st.integers(0, len(rs) - 1))
        rs[b] = max(0, s[b] - q[b]) + 1
    return rs


def replay_fault(cfg: ArenaConfig, q, s, rs) -> bool:
    """Whether starts ``rs`` break §8.1 for the step: a start past its request's context
    (``s - q``), or a non-zero start for one of the leading decodes (which the staging
    would drop: only prefill requests replay)."""
    if not any(rs):
        return False
    if any(r > b - a for r, a, b in zip(rs, q, s)):
        return True
    return any(rs[: _leading_decodes(cfg, q)])
