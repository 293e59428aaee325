"""Generative benchmark protocols as lm-evaluation-harness runs them: GSM8K 5-shot and MATH (Minerva) 4-shot, and
their 0-shot chat forms; the problems come from the offline benchmark cache (`rlx fetch benchmarks`).

GSM8K (lm-evaluation-harness 0.4.13 `gsm8k`, Cobbe et al. 2021). Prompt: the few-shot examples then the question, each
"Question: {question}\\nAnswer:" and an example's answer after one space, examples joined by "\\n\\n"; greedy; stop
at "Question:", "</s>", "<|im_end|>". Two readers (lm-eval's filters), then exact match:
- strict-match: the FIRST match of `#### (\\-?[0-9\\.\\,]+)` (the GSM8K answer line);
- flexible-extract: the LAST match of `(-?[$0-9.,]{2,})|(-?[0-9]+)` (its first non-empty group: the last number);
  no match: "[invalid]" in lm-eval, None here;
- exact match: both answer and reference (the full solution with its "#### N" line) lose, in order, every ",", every
  "$", everything up to "#### " and a final "."; then lower-cased and compared as strings.
Departure (documented in docs/evaluation.md): lm-eval draws 5 examples from GSM8K's TRAIN split per question (seed
1234); that split is not in the offline data. The OLMES request file `gsm8k/gold_bpb_5shot` holds, in every question's
context, the 8 chain-of-thought examples of Wei et al. (2022) (train questions, answers ending "So the answer is N.").
rlx uses the first `shots` of them, the same for every question, each answer's last sentence written as GSM8K's
answer line "#### N" (the form lm-eval's train examples end with and its strict-match reads).

MATH (lm-eval `minerva_math_*`, Lewkowycz et al. 2022): "Problem:\\n{problem}\\n\\nSolution:", the 4 fixed examples of
the Minerva paper (answers ending "Final Answer: The final answer is X. I hope it is correct."), stop "Problem:"; the
answer is read from that last sentence. rlx grades it with math-verify (lm-eval's `math_verify` metric); lm-eval's
`exact_match` (Minerva's string normalisation + sympy) is not reimplemented. Reference: the last \\boxed{} of the
solution (the request file's `answer` field is mangled in 82 of MATH-500's problems).

MBPP (lm-eval `mbpp`, Austin et al. 2021): "You are an expert Python programmer, and here is your task: {text} Your
code should pass these tests:\n\n{3 asserts}\n[BEGIN]\n", after lm-eval's 3 fixed examples (MBPP's prompt split,
each followed by its code and "\n[DONE]", joined by "\n\n"); stop "[DONE]"; the completion is the program, run in
rlx's sandbox against the 3 asserts (pass@1, greedy). The asserts call the function by name, as lm-eval runs them,
so the sandbox's plain-data check on `candidate` does not apply (a reference returning a Counter passes, as in
lm-eval; an object whose == always holds would pass too, as in lm-eval). Problems: the 500 of OLMES's `codex_mbpp`
(MBPP's test split).

0-shot chat forms: the question alone as "Question: {question}\\nAnswer:" (GSM8K) or "Problem:\\n...\\n\\nSolution:"
(MATH) as the user message, put through the model's chat template by `rlx eval` (benchmark chat_template: true), as
lm-eval's `--apply_chat_template --num_fewshot 0` does.
"""

from __future__ import annotations

import re

from rlx.errors import UserError
from rlx.tasks.readers import last_boxed  # noqa: F401  (MATH's reference answers; tests import it from here)

GSM8K_UNTIL = ("Question:", "</s>", "<|im_end|>")
MINERVA_UNTIL = ("Problem:",)
MBPP_UNTIL = ("[DONE]",)
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED = (",", r"\$", r"(?s).*#### ", r"\.$")  # lm-eval gsm8k's regexes_to_ignore, applied in this order
MINERVA_FINAL = re.compile(r"Final Answer: The final answer is(.*?). I hope it is correct.")
_SO_THE_ANSWER = re.compile(r"\s*So the answer is (.+?)\.?\s*$")

MBPP_EXAMPLES = (  # MBPP's prompt split, task ids 2-4: the 3 fixed examples of lm-eval's mbpp (Austin et al. 2021)
    ('Write a function to find the similar elements from the given two tuple lists.',
     'def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & set(test_tup2))\r\n  return (res) ',
     ('assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)',
      'assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)',
      'assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)')),
    ('Write a python function to identify non-prime numbers.',
     'import math\r\ndef is_not_prime(n):\r\n    result = False\r\n    for i in range(2,int(math.sqrt(n)) + 1):\r\n'
     '        if n % i == 0:\r\n            result = True\r\n    return result',
     ('assert is_not_prime(2) == False',
      'assert is_not_prime(10) == True',
      'assert is_not_prime(35) == True')),
    ('Write a function to find the largest integers from a given list of numbers using heap queue algorithm.',
     'import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n'
     '  largest_nums = hq.nlargest(n, nums)\r\n  return largest_nums',
     ('assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ',
      'assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ',
      'assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]')),
)

MINERVA_EXAMPLES = (  # Lewkowycz et al. 2022, appendix: the 4 fixed MATH examples of minerva_math
    ("Find the domain of the expression  $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.",
     "The expressions inside each square root must be non-negative. Therefore, $x-2 \\ge 0$, so $x\\ge2$, and $5 - x "
     "\\ge 0$, so $x \\le 5$. Also, the denominator cannot be equal to zero, so $5-x>0$, which gives $x<5$. Therefore, "
     "the domain of the expression is $\\boxed{[2,5)}$.\nFinal Answer: The final answer is $[2,5)$. I hope it is "
     "correct."),
    ("If $\\det \\mathbf{A} = 2$ and $\\det \\mathbf{B} = 12,$ then find $\\det (\\mathbf{A} \\mathbf{B}).$",
     "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (\\det \\mathbf{A})(\\det \\mathbf{B}) = (2)(12) = "
     "\\boxed{24}.$\nFinal Answer: The final answer is $24$. I hope it is correct."),
    ("Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights instead, how many times "
     "must Terrell lift them in order to lift the same total weight?",
     "If Terrell lifts two 20-pound weights 12 times, he lifts a total of $2\\cdot 12\\cdot20=480$ pounds of weight. "
     " If he lifts two 15-pound weights instead for $n$ times, he will lift a total of $2\\cdot15\\cdot n=30n$ "
     "pounds of weight.  Equating this to 480 pounds, we can solve for "
     "$n$:\n\\begin{align*}\n30n&=480\\\\\n\\Rightarrow\\qquad n&=480/30=\\boxed{16}\n\\end{align*}\nFinal Answer: "
     "The final answer is $16$. I hope it is correct."),
    ("If the system of equations\n\n\\begin{align*}\n6x-4y&=a,\\\\\n6y-9x &=b.\n\\end{align*}has a solution $(x, y)$ "
     "where $x$ and $y$ are both nonzero,\nfind $\\frac{a}{b},$ assuming $b$ is nonzero.",
     "If we multiply the first equation by $-\\frac{3}{2}$, we obtain\n\n$$6y-9x=-\\frac{3}{2}a.$$Since we also know "
     "that $6y-9x=b$, we have\n\n$$-\\frac{3}{2}a=b\\Rightarrow\\frac{a}{b}=\\boxed{-\\frac{2}{3}}.$$\nFinal Answer: "
     "The final answer is $-\\frac{2}{3}$. I hope it is correct."),
)


# ------------------------------------------------------------------------------------------------------------------
# Readers and exact match (pure functions; tests/test_protocols.py derives their answers by hand)
# ------------------------------------------------------------------------------------------------------------------


def cut_at(text: str, until: tuple[str, ...]) -> str:
    """The text before the first occurrence of any stop string (lm-eval's generate_until post-processing)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


def gsm8k_strict(completion: str, problem: dict | None = None) -> str | None:
    """lm-eval gsm8k "strict-match": the first `#### N` answer line's number, stripped; None when there is none."""
    found = STRICT.findall(cut_at(completion, GSM8K_UNTIL))
    return found[0].strip() if found else None


def gsm8k_flexible(completion: str, problem: dict | None = None) -> str | None:
    """lm-eval gsm8k "flexible-extract": the last number-like span (the first non-empty group of the last match of
    `(-?[$0-9.,]{2,})|(-?[0-9]+)`), stripped; None when there is none."""
    found = FLEXIBLE.findall(cut_at(completion, GSM8K_UNTIL))
    if not found:
        return None
    groups = [g for g in found[-1] if g]
    return groups[0].strip() if groups else None


def gsm8k_normalize(text: str) -> str:
    """lm-eval gsm8k's exact-match normalisation: IGNORED regexes removed in order, then lower case."""
    for pattern in IGNORED:
        text = re.sub(pattern, "", text)
    return text.lower()


def gsm8k_exact_match(answer: str | None, reference: str) -> float:
    """1.0 when the read answer equals the reference after gsm8k_normalize (None reads as lm-eval's "[invalid]")."""
    return float(gsm8k_normalize("[invalid]" if answer is None else answer) == gsm8k_normalize(reference))


def gsm8k_verify(extracted: list[str | None], problems: list[dict]) -> list[float]:
    """Benchmark verify function: exact match against each problem's full `solution` (its "#### N" line)."""
    return [gsm8k_exact_match(a, p["solution"]) for a, p in zip(extracted, problems)]


def minerva_answer(completion: str, problem: dict | None = None) -> str | None:
    """The X of "Final Answer: The final answer is X. I hope it is correct." (lm-eval minerva_math's
    get_unnormalized_answer: the closing sentence may be cut off by the stop, so it is appended before matching)."""
    found = MINERVA_FINAL.search(cut_at(completion, MINERVA_UNTIL) + "I hope it is correct.")
    return found.group(1).strip() if found else None


# ------------------------------------------------------------------------------------------------------------------
# Prompts and loaders
# ------------------------------------------------------------------------------------------------------------------


def gsm8k_examples(olmes_context: str) -> list[tuple[str, str]]:
    """The (question, answer) examples of an OLMES GSM8K context, each answer's closing "So the answer is N." made
    GSM8K's answer line "#### N" (module docstring)."""
    examples = []
    for block in olmes_context.split("\n\n")[:-1]:  # the last block is the question asked
        question, _, answer = block.partition("\nAnswer: ")
        found = _SO_THE_ANSWER.search(answer)
        if not question.startswith("Question: ") or not found:
            raise ValueError(f"not an OLMES GSM8K example: {block[:80]!r}")
        examples.append((question[len("Question: "):], f"{answer[:found.start()]}\n#### {found.group(1)}"))
    return examples


def gsm8k_prompt(question: str, examples: list[tuple[str, str]]) -> str:
    """lm-eval gsm8k's prompt: examples "Question: q\\nAnswer: a" joined by "\\n\\n", then the question."""
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in examples)
    return f"{shots}Question: {question}\nAnswer:"


def gsm8k_problems(shots: int = 5, size: int | None = None, hub_id: str = "openai/gsm8k") -> list[dict]:
    """GSM8K test problems {id, prompt, answer (the number), solution (with "#### N"), question}; shots: the number
    of examples in the prompt (0: the question alone, for a chat template). From the offline cache (`rlx fetch
    benchmarks`); when it is absent, from the hub dataset `hub_id` if it is cached (then shots must come from the
    cache too, so shots > 0 needs it)."""
    from rlx.evaluation import olmes

    try:
        docs = olmes.request_docs("gsm8k", "gold_bpb_5shot")
    except UserError as missing:
        if shots:
            raise
        docs = _hub_gsm8k(hub_id, missing)
    if shots > 8:
        raise UserError(f"gsm8k has 8 offline examples; set shots to at most 8 (got {shots})")
    examples = gsm8k_examples(docs[0]["olmes_context"])[:shots] if shots else []
    problems = []
    for index, doc in enumerate(docs[:size] if size else docs):
        solution = doc["answer"]
        problems.append({"id": f"gsm8k/{doc.get('doc_id', index)}", "question": doc["question"],
                         "prompt": gsm8k_prompt(doc["question"], examples), "solution": solution,
                         "answer": solution.split("####")[-1].strip()})
    return problems


def _hub_gsm8k(hub_id: str, missing: UserError) -> list[dict]:
    from rlx.data.readers import read_hub

    try:
        rows = read_hub(hub_id, "main", "test", "run `rlx fetch benchmarks`")
    except UserError:
        raise missing from None
    return [{"question": r["question"], "answer": r["answer"], "doc_id": i} for i, r in enumerate(rows)]


def mbpp_prompt(text: str, tests: tuple[str, ...] | list[str]) -> str:
    """lm-eval mbpp's question: the task, its first 3 asserts, "[BEGIN]"."""
    asserts = "\n".join(tests[:3])
    return (f"You are an expert Python programmer, and here is your task: {text} Your code should pass these tests:"
            f"\n\n{asserts}\n[BEGIN]\n")


def mbpp_entry_point(code: str, tests: list[str]) -> str:
    """The function the asserts call: the first name defined by `def` in the reference code that a test calls."""
    defined = re.findall(r"^def\s+(\w+)\s*\(", code, flags=re.M)
    for name in defined:
        if any(re.search(rf"\b{name}\s*\(", t) for t in tests):
            return name
    return defined[0] if defined else "solution"


def mbpp_problems(shots: int = 3, size: int | None = None) -> list[dict]:
    """MBPP test problems {id, prompt, test (a check(candidate) over the asserts), entry_point, answer} from OLMES's
    codex_mbpp request file; shots: 0-3 of lm-eval's fixed examples."""
    from rlx.evaluation import olmes

    if not 0 <= shots <= len(MBPP_EXAMPLES):
        raise UserError(f"mbpp has {len(MBPP_EXAMPLES)} examples; set shots to 0..3 (got {shots})")
    header = "".join(f"{mbpp_prompt(t, tests)}{code}\n[DONE]\n\n" for t, code, tests in MBPP_EXAMPLES[:shots])
    problems = []
    docs = olmes.request_docs("codex_mbpp", "gold_bpb_0shot")
    for doc in docs[:size] if size else docs:
        tests = list(doc["test_list"])
        entry = mbpp_entry_point(doc["code"], tests)
        setup = doc.get("test_setup_code") or ""
        if entry == "check":  # the harness's own check(candidate) would shadow it: keep the program's under a new name
            setup += "\n_mbpp_check = check\n"
            tests = [re.sub(r"\bcheck\s*\(", "_mbpp_check(", t) for t in tests]
        body = "".join(f"    {t.strip()}\n" for t in tests)  # the asserts call the function by name
        problems.append({"id": f"mbpp/{doc['task_id']}", "prompt": header + mbpp_prompt(doc["text"], doc["test_list"]),
                         "test": f"{setup}\ndef check(candidate):\n{body}", "entry_point": entry,
                         "answer": doc["code"]})
    return problems


def mbpp_program(completion: str, problem: dict | None = None) -> str:
    """The program of an MBPP completion: the text before "[DONE]" (lm-eval mbpp scores the raw generation)."""
    return cut_at(completion, MBPP_UNTIL)


def minerva_prompt(problem: str, shots: int) -> str:
    """lm-eval minerva_math's prompt: `shots` of the fixed examples, then the problem."""
    examples = "".join(f"Problem:\n{p}\n\nSolution: {s}\n\n" for p, s in MINERVA_EXAMPLES[:shots])
    return f"{examples}Problem:\n{problem}\n\nSolution:"


def minerva_problems(task: str = "minerva_math_500", shots: int = 4, size: int | None = None) -> list[dict]:
    """MATH problems of an OLMES request file (minerva_math_500 or minerva_math_<subject>) {id, prompt, answer (the
    solution's last \\boxed{}), solution, level}; shots: 0-4 Minerva examples."""
    from rlx.evaluation import olmes

    if not 0 <= shots <= len(MINERVA_EXAMPLES):
        raise UserError(f"minerva_math has {len(MINERVA_EXAMPLES)} examples; set shots to 0..4 (got {shots})")
    variants = sorted(p.name for p in (olmes.benchmark_root() / "oe_eval_tasks" / task).glob("*"))
    if not variants:
        raise UserError(f"no request file for {task} in the benchmark data; use minerva_math_500 or "
                        f"minerva_math_<subject>")
    docs = olmes.request_docs(task, variants[0])
    problems = []
    for index, doc in enumerate(docs[:size] if size else docs):
        problems.append({"id": f"{task}/{doc.get('doc_id', index)}", "prompt": minerva_prompt(doc["problem"], shots),
                         "answer": last_boxed(doc["solution"]) or str(doc.get("answer", "")),
                         "solution": doc["solution"], "level": str(doc.get("level", ""))})
    return problems


# ------------------------------------------------------------------------------------------------------------------
# Generation until stop strings (the parity benchmark's rlx side)
# ------------------------------------------------------------------------------------------------------------------


def stop_token_ids(tokenizer, until: tuple[str, ...]) -> list[int]:
    """The first token of each stop string as a stop id (rlx's decoder stops on ids, lm-eval on strings): a
    completion then ends at the first "Question" token, where lm-eval goes on to check for the ":" after it."""
    ids = set()
    for stop in until:
        encoded = tokenizer.encode(stop, add_special_tokens=False)
        if len(encoded) == 1 or stop.strip() and not stop.startswith("<"):
            ids.add(encoded[0])
    return sorted(ids)


def generate_until(model, tokenizer, prompts: list[str], until: tuple[str, ...], max_new_tokens: int,
                   batch_size: int = 16) -> list[str]:
    """Greedy completions through rlx's generator (HFGenerator, KV-cached), stopping at the model's end-of-text or
    the first token of a stop string, then cut at the stop strings (cut_at)."""
    from rlx.engines.generator import Draw, eval_policy_generator, sample_rollout

    config = model.generation_config
    eos = config.eos_token_id
    base = list(eos) if isinstance(eos, list) else [eos if eos is not None else tokenizer.eos_token_id]
    extra = stop_token_ids(tokenizer, until)
    config.eos_token_id = sorted(set(base) | set(extra))
    stop_words = [tokenizer.decode([i]) for i in extra]
    try:
        generator = eval_policy_generator(model, tokenizer, batch_size)
        texts = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            out = sample_rollout(generator, tokenizer, chunk, Draw(1, max_new_tokens, greedy=True), [0] * len(chunk))
            texts += out.texts
    finally:
        config.eos_token_id = eos
    cut = []
    for text in texts:
        for word in stop_words:
            if text.endswith(word):
                text = text[:-len(word)]
                break
        cut.append(cut_at(text, until))
    return cut
