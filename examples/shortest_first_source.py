"""A curriculum of your own, in one file: the shortest questions first, as a prompt source.

    rlx train plugins=[examples.shortest_first_source] algorithm.prompt_sampling.source=shortest_first

Each step takes the next training rows in order of question length (then around again); rlx's own producer does
the rest (stages, dynamic sampling, the temperature schedule, partial rollouts). Its position is checkpointed.
"""

import rlx


class ShortestFirst:
    def __init__(self, rows: list[dict]):
        self.rows, self.taken = sorted(rows, key=lambda row: len(str(row["question"]))), 0

    def take(self, n: int) -> list[dict]:
        self.taken += n
        return [self.rows[i % len(self.rows)] for i in range(self.taken - n, self.taken)]

    def observe(self, rows: list[dict], verdicts: list) -> dict:  # verdicts: a (G,) bool tensor per row
        return {"curriculum/longest_question_chars": max(len(str(row["question"])) for row in rows)}

    def state_dict(self) -> dict:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self.taken = int(state["taken"])


@rlx.register("prompt_source", "shortest_first")
def shortest_first(rows: list[dict], settings) -> ShortestFirst:
    return ShortestFirst(rows)
