"""Built-in text environments small enough for the built-in tiny model to learn on a CPU.

Each follows the gymnasium shape (an environment of the user's needs nothing from rlx), registered by name:
    reset(*, seed=None, options=None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)
info carries "anchor" (a hashable key of the current state: GiGPO groups steps taken in the same
state), "is_action_valid" (step only) and "metrics" (numbers the trainer averages, e.g. success).
Actions are a few characters; surrounding whitespace is ignored. A seed fixes the whole task (the
number, the map), so the G episodes of a group play the same task.
"""

from __future__ import annotations

import random
from collections import deque

from rlx.envs.registry import ENVIRONMENTS

MOVES = {"L": (0, -1), "D": (1, 0), "R": (0, 1), "U": (-1, 0)}


@ENVIRONMENTS.register("guess_number")
class GuessNumber:
    """Guess a secret integer in 1..high; each wrong guess is answered "higher" or "lower".

    Reward 1 when the guess is right (terminated), 0 otherwise; an answer that is not an integer in
    range is an invalid action (feedback "invalid", no reward). Truncated after max_guesses guesses.
    Anchor: the interval still possible (lo, hi) given the feedback so far."""

    def __init__(self, high: int = 8, max_guesses: int = 4):
        self.high, self.max_guesses = high, max_guesses

    def reset(self, *, seed=None, options=None):
        self.secret = random.Random(seed).randint(1, self.high)
        self.lo, self.hi, self.guesses = 1, self.high, 0
        return f"Guess a number from 1 to {self.high}.", {"anchor": (self.lo, self.hi)}

    def step(self, action: str):
        self.guesses += 1
        text = action.strip()
        valid = text.isdigit() and 1 <= int(text) <= self.high
        reward, terminated = 0.0, False
        if not valid:
            obs = "invalid"
        elif int(text) == self.secret:
            obs, reward, terminated = "correct", 1.0, True
        elif int(text) < self.secret:
            obs, self.lo = "higher", max(self.lo, int(text) + 1)
        else:
            obs, self.hi = "lower", min(self.hi, int(text) - 1)
        truncated = not terminated and self.guesses >= self.max_guesses
        info = {"anchor": (self.lo, self.hi), "is_action_valid": valid, "metrics": {"success": float(terminated)}}
        return obs, reward, terminated, truncated, info

    def expert_action(self) -> str:
        """Binary search (demonstrations for a warm start; not part of the environment protocol)."""
        return str((self.lo + self.hi) // 2)

    def random_action(self, rng: random.Random) -> str:
        return str(rng.randint(1, self.high))


@ENVIRONMENTS.register("grid")
class Grid:
    """FrozenLake-style grid (gymnasium's FrozenLake, made text and deterministic): reach G from S
    without stepping into a hole H, with actions L, D, R, U (one letter).

    The map is drawn from the seed with a path from S to G guaranteed; the observation is the map
    with the agent shown as P, one row per line, cells separated by spaces. layout "random": S and G
    anywhere (the policy must read the map to know where to go); "corners": S top-left and G
    bottom-right as in gymnasium's FrozenLake, only the holes move (a map-blind preference for D and R
    already helps, and the start cell recurs in every episode). Reward 1 at the goal; a hole ends the episode with 0;
    a move into the wall keeps the position (valid); any other answer is an invalid action. The
    episode is truncated after max_steps moves. Anchor: the agent's position (the map is fixed by the
    seed, so identical states recur across the episodes of a group)."""

    def __init__(self, size: int = 3, holes: int = 2, max_steps: int = 6, layout: str = "random"):
        if layout not in ("random", "corners"):
            raise ValueError(f"Grid layout must be 'random' or 'corners', got {layout!r}")
        self.size, self.holes, self.max_steps, self.layout = size, holes, max_steps, layout

    def reset(self, *, seed=None, options=None):
        rng = random.Random(seed)
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        corners = [(0, 0), (self.size - 1, self.size - 1)]
        while True:
            if self.layout == "corners":
                (start, goal), holes = corners, rng.sample([c for c in cells if c not in corners], self.holes)
            else:
                start, goal, *holes = rng.sample(cells, 2 + self.holes)
            if _reachable(self.size, start, goal, set(holes)):
                break
        self.start, self.goal, self.hole_cells = start, goal, set(holes)
        self.position, self.steps = start, 0
        return self._render(), {"anchor": self.position}

    def _render(self) -> str:
        """One row per line, cells separated by spaces ("P . G"): each cell is its own token (a
        tokenizer merges ".." into one), so a cell sits at the same token offset on every map."""
        def cell(r, c):
            return ("P" if (r, c) == self.position else "G" if (r, c) == self.goal else
                    "H" if (r, c) in self.hole_cells else ".")
        return "\n".join(" ".join(cell(r, c) for c in range(self.size)) for r in range(self.size))

    def step(self, action: str):
        self.steps += 1
        move = MOVES.get(action.strip().upper()[:1]) if len(action.strip()) == 1 else None
        if move is not None:
            r, c = self.position[0] + move[0], self.position[1] + move[1]
            if 0 <= r < self.size and 0 <= c < self.size:
                self.position = (r, c)
        success = self.position == self.goal
        terminated = success or self.position in self.hole_cells
        truncated = not terminated and self.steps >= self.max_steps
        info = {"anchor": self.position, "is_action_valid": move is not None, "metrics": {"success": float(success)}}
        return self._render(), float(success), terminated, truncated, info

    def expert_action(self) -> str:
        """First move of a shortest safe path to the goal (demonstrations; not part of the protocol)."""
        return _first_move(self.size, self.position, self.goal, self.hole_cells)

    def random_action(self, rng: random.Random) -> str:
        return rng.choice(list(MOVES))


def _first_move(size: int, start, goal, holes: set) -> str | None:
    """Breadth-first search: the first move of a shortest path avoiding holes, None when unreachable."""
    first = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return first[cell] or "L"  # already at the goal: any move
        for name, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in holes and nxt not in first:
                first[nxt] = first[cell] or name
                queue.append(nxt)
    return None


def _reachable(size: int, start, goal, holes: set) -> bool:
    return _first_move(size, start, goal, holes) is not None


@ENVIRONMENTS.register("corridor")
class Corridor:
    """A corridor with a key and a door: the door at the right end opens only with the key, which lies
    somewhere to the left of the start. Actions L, R (one letter); stepping on the key picks it up.

    Reward 1 for walking through the door holding the key, 0 otherwise, and only then: the reward of
    the first moves (fetching the key, away from the door) is delayed to the end of the episode, so
    credit assignment matters. Observation: the corridor (A agent, K key until taken, D door) and
    whether the key is held. Truncated after max_steps moves. Anchor: (position, has key)."""

    def __init__(self, length: int = 5, max_steps: int = 8):
        self.length, self.max_steps = length, max_steps

    def reset(self, *, seed=None, options=None):
        rng = random.Random(seed)
        self.key = rng.randrange(0, self.length - 2)
        self.position = rng.randrange(self.key + 1, self.length - 1)
        self.has_key, self.steps = False, 0
        return self._render(), {"anchor": (self.position, self.has_key)}

    def _render(self) -> str:
        cells = ["A" if i == self.position else "K" if i == self.key and not self.has_key else "."
                 for i in range(self.length)]
        return "".join(cells) + "D " + ("key" if self.has_key else "no key")

    def step(self, action: str):
        self.steps += 1
        text = action.strip().upper()
        valid = text in ("L", "R")
        success = False
        if valid:
            target = self.position + (1 if text == "R" else -1)
            if target == self.length:  # the door
                success = self.has_key
            elif target >= 0:
                self.position = target
                self.has_key = self.has_key or self.position == self.key
        truncated = not success and self.steps >= self.max_steps
        info = {"anchor": (self.position, self.has_key), "is_action_valid": valid,
                "metrics": {"success": float(success)}}
        return self._render(), float(success), success, truncated, info

    def expert_action(self) -> str:
        """Left to the key, then right to the door (demonstrations; not part of the protocol)."""
        return "R" if self.has_key else "L"

    def random_action(self, rng: random.Random) -> str:
        return rng.choice(["L", "R"])
