"""Gateway sessions -> Episodes (the record rlx.evaluation.agents.play returns) -> training rows.

The steps of a harness episode are its model calls, in call order: step t has the call's reward
(Outcome.rewards[t], or the episode's reward on the last call), anchor, sampled text (actions[t]), the
text the harness showed the model for it (observations[t]) and policy version (versions[t]).

A session whose harness rewrote its history has several rows (sessions.py). Which rows are trained:
ALL of them, each sampled token exactly once, with the advantage of its own step. The Episode is the row
of the LAST call (the conversation the harness ended with); the other rows go in Episode.forks. Every row's
turn_spans has one entry per step of the episode, empty for steps sampled in another row, so token
advantages index the episode's steps the same way in every row. Tokens a fork copied from an earlier row
are context there (loss mask 0): they are trained in the row that sampled them. In the group statistics
(GRPO's mean and std) the EPISODE counts once, whatever its number of rows: rows are a layout of its
tokens, not extra samples. (Dropping the earlier rows would leave the turns before a context trim
untrained; counting rows as episodes would weight an episode by how often its harness rewrote history.)
"""

from __future__ import annotations

from rlx.engines.records import Episode


def session_episode(session, outcome, tokenizer=None) -> Episode:
    """The Episode of a closed session and its checked Outcome (rlx/gateway/harness.py)."""
    calls = sorted(session.calls, key=lambda c: c.index)
    truncated = outcome.error is not None or session.cut is not None or outcome.truncated
    if not calls:
        return Episode(prompt_ids=[], truncated=True, error=outcome.error)

    def row_episode(r: int) -> Episode:
        row = session.rows[r]
        spans = [call.span if call.row == r else (0, 0) for call in calls]
        return Episode(prompt_ids=list(row.prompt_ids), ids=list(row.ids), loss_mask=list(row.loss_mask),
                       logprobs=list(row.logprobs), turn_spans=spans, truncated=truncated)

    main = calls[-1].row
    episode = row_episode(main)
    n = len(calls)
    if outcome.error is not None:
        rewards = [0.0] * n
    elif outcome.rewards is not None:
        rewards = list(outcome.rewards)
    else:
        rewards = [0.0] * (n - 1) + [outcome.reward]
    episode.step_rewards = rewards
    episode.anchors = list(outcome.anchors) if outcome.anchors is not None else [None] * n
    episode.valid = list(outcome.valid) if outcome.valid is not None else [True] * n
    episode.actions = [c.text for c in calls]
    episode.observations = [c.observation for c in calls]
    episode.versions = [c.version for c in calls]
    episode.metrics = {"success": outcome.success} if outcome.success is not None else {}
    if outcome.error is not None:
        episode.metrics = {"success": 0.0}
    if session.cut is not None:  # a call was refused by env.max_turns or env.max_total_tokens
        episode.metrics["cut"] = 1.0
    episode.terminated = not truncated
    episode.turn_truncated = sum(c.finish_reason == "length" for c in calls)
    episode.error = outcome.error
    episode.forks = [row_episode(r) for r in range(len(session.rows)) if r != main]
    return episode


def harness_metrics(episodes: list[Episode], prefix: str) -> dict:
    """<prefix>/forks (extra rows per episode), /timeouts (count), /cut (episodes refused a call by a limit,
    env.max_turns or max_total_tokens, count)."""
    n = max(len(episodes), 1)
    return {f"{prefix}/forks": sum(len(e.forks) for e in episodes) / n,
            f"{prefix}/timeouts": sum(bool(e.error and e.error.startswith("timeout")) for e in episodes),
            f"{prefix}/cut": sum(int(e.metrics.get("cut", 0)) for e in episodes)}
