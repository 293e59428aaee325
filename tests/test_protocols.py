"""GSM8K and MATH readers of rlx.evaluation.protocols on hand-written completions.

Each expected answer is derived by hand from lm-evaluation-harness 0.4.13's gsm8k filters (quoted in the protocols
module): strict-match = first match of `#### (\\-?[0-9\\.\\,]+)`; flexible-extract = the last match of
`(-?[$0-9.,]{2,})|(-?[0-9]+)`, its non-empty group; exact match drops ",", "$", up to "#### ", a final "." and lowers.
tests/test_lmeval_parity.py checks the same readers against lm-eval's own filters on the real model's generations.
"""

import pytest

from rlx.evaluation.protocols import (
    gsm8k_exact_match,
    gsm8k_examples,
    gsm8k_flexible,
    gsm8k_prompt,
    gsm8k_strict,
    last_boxed,
    minerva_answer,
    minerva_prompt,
)

REFERENCE_18 = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"

# (completion, strict, flexible): derivations in the comments
CASES = [
    # strict: "#### 18"; flexible: matches "9", "2", "$18." (the first group takes '$' and the '.'), "18": last "18"
    ("She makes 9 * 2 = $18.\n#### 18", "18", "18"),
    # no "####": strict none; flexible: "5" (second group), then "1,234.5." (first group): last, kept whole
    ("5 boxes cost 1,234.5.", None, "1,234.5."),
    # cut at "Question:" first: strict "-3,000" (the later "#### 7" is gone); flexible: "$5" then "-3,000"
    ("He pays $5 each; #### -3,000\nQuestion: next one #### 7", "-3,000", "-3,000"),
    # two answer lines: strict takes the FIRST; flexible the last number
    ("#### 5\n#### 6", "5", "6"),
    # "..." is a match of the first group (three characters of [$0-9.,]) and comes last
    ("It is 42. Hope so...", None, "..."),
    ("No numbers here.", None, None),
]


@pytest.mark.parametrize("completion, strict, flexible", CASES)
def test_gsm8k_readers_match_the_regexes_by_hand(completion, strict, flexible):
    assert gsm8k_strict(completion) == strict
    assert gsm8k_flexible(completion) == flexible


@pytest.mark.parametrize("answer, reference, expected", [
    ("18", REFERENCE_18, 1.0),
    ("$18.", REFERENCE_18, 1.0),       # "$" dropped, then the final "."
    ("1,234.5.", "#### 1234.5", 1.0),  # "," dropped, then the final "."
    ("7..", "#### 7", 0.0),            # only ONE final "." goes: "7." != "7"
    ("...", "#### 42", 0.0),
    (None, "#### 4", 0.0),             # lm-eval's "[invalid]"
    ("-3,000", "#### -3000", 1.0),
])
def test_gsm8k_exact_match(answer, reference, expected):
    assert gsm8k_exact_match(answer, reference) == expected


def test_gsm8k_examples_and_prompt_from_an_olmes_context():
    context = ("Question: Ann has 2 cats and gets 3 more. How many?\nAnswer: 2 + 3 = 5. So the answer is 5.\n\n"
               "Question: Bo had $10 and spent $4. How much is left?\nAnswer: 10 - 4 = 6. So the answer is 6.\n\n"
               "Question: The asked question?\nAnswer:")
    examples = gsm8k_examples(context)
    assert examples == [("Ann has 2 cats and gets 3 more. How many?", "2 + 3 = 5.\n#### 5"),
                        ("Bo had $10 and spent $4. How much is left?", "10 - 4 = 6.\n#### 6")]
    assert gsm8k_prompt("Q?", examples[:1]) == (
        "Question: Ann has 2 cats and gets 3 more. How many?\nAnswer: 2 + 3 = 5.\n#### 5\n\nQuestion: Q?\nAnswer:")
    assert gsm8k_prompt("Q?", []) == "Question: Q?\nAnswer:"


def test_minerva_reader_and_prompt():
    assert minerva_answer("So $x=3$.\nFinal Answer: The final answer is $3$. I hope it is correct.") == "$3$"
    # the stop cut the closing sentence off after "is $3$.": the reader appends "I hope it is correct." as lm-eval's
    # get_unnormalized_answer does, and "(.*?). I hope" needs a character then " I hope": "$3$" + "." + " I hope"
    assert minerva_answer("Final Answer: The final answer is $3$. ") == "$3$"
    assert minerva_answer("I think it is 3.") is None
    assert minerva_answer("x\nProblem:\nFinal Answer: The final answer is 4. I hope it is correct.") is None
    assert minerva_prompt("What is 1+1?", 0) == "Problem:\nWhat is 1+1?\n\nSolution:"
    assert minerva_prompt("P", 1).startswith("Problem:\nFind the domain") and minerva_prompt("P", 1).endswith(
        "I hope it is correct.\n\nProblem:\nP\n\nSolution:")


def test_last_boxed_balances_braces():
    assert last_boxed("so \\boxed{\\frac{1}{2}} and then \\boxed{3}.") == "3"
    assert last_boxed("$\\boxed{\\frac{a}{b}}$") == "\\frac{a}{b}"
    assert last_boxed("no box") is None


def test_mbpp_prompt_program_and_entry_point():
    from rlx.evaluation.protocols import mbpp_entry_point, mbpp_program, mbpp_prompt

    assert mbpp_prompt("Add two numbers.",
                       ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 4"]) == (
        "You are an expert Python programmer, and here is your task: Add two numbers. Your code should pass these "
        "tests:\n\nassert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(2, 2) == 4\n[BEGIN]\n")
    assert mbpp_program("def add(a, b):\n    return a + b\n[DONE]\nYou are an "
                        "expert") == "def add(a, b):\n    return a + b\n"
    # a helper defined first is not the entry point: the tests call `add`
    assert mbpp_entry_point("def helper(x):\n    return x\ndef add(a, b):\n    return helper(a) + b",
                            ["assert add(1, 2) == 3"]) == "add"
