"""Log-likelihood (multiple-choice) scoring: each choice's sum of log p(continuation | context), and acc / acc_norm.

Definitions (OLMES, Gu et al. 2024; lm-evaluation-harness, Gao et al. 2021):
- ll_j = sum_t log p(c_{j,t} | context, c_{j,<t}) over the tokens of continuation j;
- acc = [argmax_j ll_j == gold];  acc_norm = [argmax_j ll_j / bytes(c_j) == gold] (the per-character normalisation:
  lm-evaluation-harness divides by the continuation's length in bytes, OLMES by its characters; the same on ASCII);
- tokens as lm-evaluation-harness makes them (`split_pair`): the context's trailing white space moves to the
  continuation, context + continuation are tokenized together and split at the length of the context tokenized alone,
  so the merges across the boundary are the whole string's; no special tokens are added; an empty context is one
  end-of-text token.

How rlx computes it (`choice_loglikelihoods`): a question's choices share its context, so the question runs as ONE
sequence, the context once followed by every choice's tokens (but the last), under a tree-shaped attention mask: a
choice's tokens see the context and the choice's own earlier tokens, never another choice, and their position ids
continue from the context's end. The hidden state at the context's last token predicts every choice's first token.
A question with k choices costs C + sum_j (L_j - 1) tokens instead of lm-evaluation-harness's k (C + L_j - 1), the
output head runs only at the scored positions (never the (T, V) logits of the context), and the questions' trees are
packed several to a row (block-diagonal mask, positions restarting per tree), so rows carry almost no padding. Questions
whose choices have different contexts (Winogrande's partial scoring) run one row per distinct context, the same way. A
prefix that every question starts with (the few-shot examples of a 5-shot variant: the same examples for every question)
is encoded once (`shared_prefix`): its keys and values are given to every row as a cache that all of the row's tokens
attend to, so a question costs its own tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.engines.generator import SHARED_PREFIX_MIN, common_prefix


@dataclass(frozen=True)
class ChoiceQuestion:
    """One multiple-choice question: a context per choice (usually all equal), the continuations scored after it,
    the index of the right choice, and a stratum for subsets (an MMLU subject, a task; empty for none)."""

    id: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    stratum: str = ""


def split_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-evaluation-harness's `_encode_pair` makes them (module docstring)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    if not context:
        return [_end_of_text(tokenizer)], whole
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    return context_ids, whole[len(context_ids):]


def _end_of_text(tokenizer) -> int:
    for token_id in (tokenizer.eos_token_id, tokenizer.bos_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError("an empty context needs an end-of-text token and the tokenizer has none")


@dataclass(frozen=True)
class _Tree:
    """One question as a token trie: tokens fed to the model, parent[i] the node token i follows (-1 for a root),
    positions (depth in the trie), and targets: (node whose hidden state predicts the token, token id, choice index)
    for every continuation token."""

    tokens: list[int]
    parent: list[int]
    positions: list[int]
    targets: list[tuple[int, int, int]]
    question: int


def build_tree(sequences: list[tuple[int, list[int], list[int]]], question: int) -> _Tree:
    """The trie of a question's (choice index, context ids, continuation ids): every choice's context + continuation
    but its last token inserted as a path, so prefixes two choices share are fed once (the whole context when the
    contexts are equal; the few-shot examples and the sentence's start in Winogrande, whose contexts differ)."""
    tokens: list[int] = []
    parent: list[int] = []
    positions: list[int] = []
    child: dict[tuple[int, int], int] = {}
    targets = []
    for choice, context_ids, continuation_ids in sequences:
        sequence = list(context_ids) + list(continuation_ids)
        node = -1
        path = []  # path[i]: the node of sequence[i]
        for depth, token in enumerate(sequence[:-1]):
            key = (node, token)
            if key not in child:
                child[key] = len(tokens)
                tokens.append(token)
                parent.append(node)
                positions.append(depth)
            node = child[key]
            path.append(node)
        targets += [(path[i - 1], sequence[i], choice) for i in range(len(context_ids), len(sequence))]
    return _Tree(tokens, parent, positions, targets, question)


def tree_mask(parent: list[int]) -> torch.Tensor:
    """(T, T) boolean: token i attends to token j when j is i or one of i's ancestors (parent links)."""
    size = len(parent)
    mask = torch.zeros(size, size, dtype=torch.bool)
    for i, p in enumerate(parent):
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def shared_prefix(trees: list[_Tree], minimum: int = SHARED_PREFIX_MIN) -> int:
    """The number of leading tokens that every tree starts with as a chain (the few-shot examples, the same for every
    question), cut so that every scored position comes after it; 0 when that is under `minimum` or there is one tree
    (generation's common_prefix on each tree's chained head up to its first scored node, plus one token)."""
    if len(trees) < 2:
        return 0
    limit = min(p for tree in trees for p, _, _ in tree.targets)  # the nodes that predict a scored token are fed
    heads = []
    for tree in trees:
        chain = next((i for i, parent in enumerate(tree.parent) if parent != i - 1), len(tree.parent))
        heads.append(tree.tokens[:min(chain, limit) + 1])  # common_prefix leaves each one token of its own
    return common_prefix(heads, minimum)


def strip_prefix(tree: _Tree, length: int) -> _Tree:
    """The tree without its first `length` (shared, chained) tokens: nodes renumbered, a parent in the prefix becomes
    -1 (a root of what is fed), positions kept (they continue after the prefix)."""
    if not length:
        return tree
    return _Tree(tree.tokens[length:], [max(p - length, -1) for p in tree.parent[length:]], tree.positions[length:],
                 [(p - length, token, choice) for p, token, choice in tree.targets], tree.question)


def _trees(tokenizer, questions: list[ChoiceQuestion]) -> list[_Tree]:
    """One trie per question (build_tree)."""
    return [build_tree([(choice, *split_pair(tokenizer, context, continuation)) for choice, (context, continuation)
                        in enumerate(zip(question.contexts, question.continuations))], q)
            for q, question in enumerate(questions)]


def pack_rows(trees: list[_Tree], row_tokens: int) -> list[list[_Tree]]:
    """Trees packed into rows of at most max(row_tokens, longest tree) tokens, first fit in decreasing length: the
    rows hold almost no padding, and no token attends outside its own tree (the mask is block-diagonal)."""
    width = max([row_tokens] + [len(tree.tokens) for tree in trees])
    rows: list[list[_Tree]] = []
    room: list[int] = []
    for tree in sorted(trees, key=lambda tree: -len(tree.tokens)):
        size = len(tree.tokens)
        slot = next((r for r, free in enumerate(room) if free >= size), None)
        if slot is None:
            rows.append([])
            room.append(width)
            slot = len(rows) - 1
        rows[slot].append(tree)
        room[slot] -= size
    return rows


def _batches(rows: list[list[_Tree]], token_budget: int) -> list[list[list[_Tree]]]:
    """Rows (longest first) cut into batches of rows x longest row <= token_budget (one row always fits)."""
    lengths = [sum(len(tree.tokens) for tree in row) for row in rows]
    order = sorted(range(len(rows)), key=lambda r: -lengths[r])
    batches, current = [], []
    for r in order:
        if current and (len(current) + 1) * lengths[current[0]] > token_budget:
            batches.append(current)
            current = []
        current.append(r)
    return [[rows[r] for r in batch] for batch in batches + ([current] if current else [])]


def _row_inputs(batch: list[list[_Tree]], prefix: int = 0):
    """Input ids, position ids (B, T), the attention mask (B, 1, T, prefix + T) (every token sees the `prefix` cached
    positions, then its own tree) and (row, position, token) of every target."""
    width = max(sum(len(tree.tokens) for tree in row) for row in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    positions = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.eye(width, dtype=torch.bool).repeat(len(batch), 1, 1)  # padding attends to itself only (no NaN)
    rows, where, tokens = [], [], []
    for r, row in enumerate(batch):
        start = 0
        for tree in row:
            n = len(tree.tokens)
            ids[r, start:start + n] = torch.tensor(tree.tokens)
            positions[r, start:start + n] = torch.tensor(tree.positions)
            mask[r, start:start + n, start:start + n] = tree_mask(tree.parent)
            for p, token, _ in tree.targets:
                rows.append(r)
                where.append(start + p)
                tokens.append(token)
            start += n
    if prefix:
        mask = torch.cat([mask.new_ones(len(batch), width, prefix), mask], dim=2)
    return ids, positions, mask[:, None], (torch.tensor(rows), torch.tensor(where), torch.tensor(tokens))


def _prefix_cache(model, ids: list[int], device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values (1, heads, P, d) of every layer for the shared prefix `ids`, encoded once."""
    out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def _rows_cache(model, prefix: list[tuple[torch.Tensor, torch.Tensor]], rows: int):
    """A cache holding the prefix's keys and values for each of `rows` rows (expanded views: the forward's own
    concatenation makes the copies)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer, (keys, values) in enumerate(prefix):
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), layer)
    return cache


def _run_batch(model, head, batch: list[list[_Tree]], device, prefix=None) -> torch.Tensor:
    """The log-prob (float32) of every target of every tree of `batch`, in row and tree order; prefix: the shared
    prefix's keys and values (_prefix_cache) that the batch's trees continue, or None."""
    from rlx.algorithms.logprobs import chunked_linear_logprobs

    ids, positions, mask, (rows, where, tokens) = _row_inputs(batch, prefix[0][0].shape[2] if prefix else 0)
    ids, positions, mask = ids.to(device), positions.to(device), mask.to(device)
    rows, where, tokens = rows.to(device), where.to(device), tokens.to(device)
    cache = (dict(past_key_values=_rows_cache(model, prefix, len(batch)), use_cache=True) if prefix
             else {"use_cache": False})
    if head is None:  # an output layer that is not a plain linear map: the model's own logits at the picked positions
        logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, **cache).logits
        return torch.log_softmax(logits[rows, where].float(), dim=-1).gather(1, tokens[:, None]).squeeze(1).cpu()
    out = model(input_ids=ids, position_ids=positions, attention_mask=mask, **cache,
                output_hidden_states=True, logits_to_keep=1)
    picked = out.hidden_states[-1][rows, where]  # (M, H), after the final norm
    logp, _ = chunked_linear_logprobs(picked, head.weight, tokens, head.bias)
    return logp.float().cpu()


@torch.no_grad()
def choice_loglikelihoods(model, tokenizer, questions: list[ChoiceQuestion], token_budget: int = 2048,
                          row_tokens: int = 0, progress=None, share_prefix: bool = True) -> list[list[float]]:
    """Per question, per choice: the sum of log p(continuation tokens | context) (module docstring), in float32.
    token_budget: rows x padded length of one forward pass; row_tokens: the length trees are packed to (pack_rows; 0:
    the longest tree's, the fastest on a CPU: the attention of a longer row costs more than its padding saves);
    progress: called with the number of questions whose last tree has just been scored; share_prefix: encode a prefix
    that every question starts with once (shared_prefix; False: feed it with each tree)."""
    from rlx.models.forward import _output_head

    device = next(model.parameters()).device
    head = _output_head(model)
    sums = [[0.0] * len(q.continuations) for q in questions]
    rows_left = [0] * len(questions)
    trees = _trees(tokenizer, questions)
    for tree in trees:
        rows_left[tree.question] += 1
    length = shared_prefix(trees) if share_prefix and _plain_cache(model) else 0
    prefix = _prefix_cache(model, trees[0].tokens[:length], device) if length else None
    trees = [strip_prefix(tree, length) for tree in trees]
    for batch in _batches(pack_rows(trees, row_tokens), token_budget):
        values = iter(_run_batch(model, head, batch, device, prefix).tolist())
        finished = 0
        for tree in (tree for row in batch for tree in row):
            for _, _, choice in tree.targets:
                sums[tree.question][choice] += next(values)
            rows_left[tree.question] -= 1
            finished += rows_left[tree.question] == 0
        if progress is not None and finished:
            progress(finished)
    return sums


def _plain_cache(model) -> bool:
    """Whether the model's cache is full attention in every layer (a prefix's keys and values can be handed over)."""
    config = getattr(getattr(model, "module", model), "config", None)
    kinds = getattr(config, "layer_types", None) or ["full_attention"]
    return all(kind == "full_attention" for kind in kinds) and not getattr(config, "sliding_window", None)


def choice_scores(sums: list[float], continuations: tuple[str, ...], gold: int) -> dict:
    """acc and acc_norm of one question from its choices' log-likelihood sums (module docstring); ties go to the
    first choice, as argmax does in lm-evaluation-harness."""
    normed = [s / max(1, len(c.encode("utf-8"))) for s, c in zip(sums, continuations)]
    pick = max(range(len(sums)), key=lambda j: (sums[j], -j))
    pick_norm = max(range(len(normed)), key=lambda j: (normed[j], -j))
    return {"acc": float(pick == gold), "acc_norm": float(pick_norm == gold), "pred": pick, "pred_norm": pick_norm}
