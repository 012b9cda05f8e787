"""Rules profiles: which game an episode plays. Chosen per episode (the create request's ``rules`` field).

* ``release`` — the authors' training environment (docs/release_behaviour.md): strict ``<tool_call>`` parsing
  with an error observation and a retry, the release's step limit, strict tool availability, its prompt.
  The training default, and what training-time validation reports.
* ``official`` — BFCL's own multi-turn pipeline for the Qwen function-calling format
  (``env_service.official``): its prompt, its decoding of each reply (an undecodable reply ends the turn),
  its per-turn force-quit, its held-out function handling and its observation texts. Its score is the number
  to set beside the leaderboard and beside papers that used BFCL's CLI.

The profile changes only what the model sees and how its replies are read; the executor, the checker and
the per-turn diagnosis are the same for both.
"""

from __future__ import annotations

RELEASE = "release"
OFFICIAL = "official"
RULES = (RELEASE, OFFICIAL)
DEFAULT_RULES = RELEASE

DESCRIPTIONS = {
    RELEASE: "release (the authors' training environment)",
    OFFICIAL: "official (BFCL's multi-turn pipeline, Qwen function-calling format)",
}


def check_rules(name: str) -> str:
    """`name` if it is a rules profile, else ValueError naming the choices."""
    if name not in RULES:
        raise ValueError(f"unknown rules profile {name!r}; expected one of {', '.join(RULES)}")
    return name
