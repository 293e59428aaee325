"""Token-in/token-out across turns without any server or model (rlx/gateway/sessions.py, chat.py, tools.py):
extension vs fork, exact sampled ids, loss masks, limits, tool-call parsing and its render-back."""

import json

import pytest

from rlx.gateway.chat import ChatRenderer, RequestError, normalize_messages, same_message
from rlx.gateway.sessions import TURN_STRIDE, Limits, Session
from rlx.gateway.tools import TOOL_PARSERS, openai_tool_calls, parse_tool_calls
from tests.gateway_fixtures import CALCULATOR, HERMES_TEMPLATE, encode, tiny_tokenizer

EOS = 2  # <|im_end|> of the tiny agent's tokenizer
LIMITS = Limits(max_turns=8, max_new_tokens=16, max_total_tokens=240)


def user(text):
    return {"role": "user", "content": text}


def assistant(text, calls=None):
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def template_ids(messages, tools=None, template=None):
    tok = tiny_tokenizer()
    return encode(tok.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False,
                                          add_generation_prompt=True))


def call(session, renderer, messages, sampled, tools=None, stopped=True, text=None):
    """One call: prepare, "sample" `sampled` ids, record the plain reply; returns the Pending."""
    messages = normalize_messages(messages)
    pending = session.prepare_chat(messages, tools, renderer)
    reply = text if text is not None else tiny_tokenizer().decode(sampled, skip_special_tokens=True)
    session.record(pending, sampled, [-0.25] * len(sampled), stopped, reply, normalize_messages([assistant(reply)])[0],
                   "stop", version=3)
    return pending


@pytest.fixture
def renderer():
    return ChatRenderer(tiny_tokenizer())


def test_a_follow_up_call_extends_the_row_with_the_sampled_ids_and_the_new_messages(renderer):
    """Call 1 renders [u1] with the template; the model samples "L" + EOS. Call 2 sends [u1, a("L"), u2]:
    the row must be prompt(u1) + [L, EOS] + the ids of "\\n<|im_start|>user\\nu2<|im_end|>\\n<|im_start|>assistant\\n"
    (what ChatML puts after the sampled <|im_end|>). Here the sampled ids are the canonical ones, so that equals
    the template's rendering of the whole conversation. Loss mask 1 exactly on the two sampled tokens."""
    session = Session("s", 7, LIMITS, EOS)
    first = call(session, renderer, [user("..A.KD no key")], encode("L") + [EOS])
    assert first.context == template_ids([user("..A.KD no key")])
    assert first.seed == 7 * TURN_STRIDE + 0
    second = call(session, renderer, [user("..A.KD no key"), assistant("L"), user(".A..KD no key")],
                  encode("R") + [EOS])
    assert second.seed == 7 * TURN_STRIDE + 1  # per session and call index, whoever shares the batch
    assert second.context == template_ids([user("..A.KD no key"), assistant("L"), user(".A..KD no key")])
    (row,) = session.rows
    assert session.forks == 0 and len(session.calls) == 2
    sampled = [i for i, m in enumerate(row.loss_mask) if m]
    assert [row.ids[i] for i in sampled] == encode("L") + [EOS] + encode("R") + [EOS]
    assert sampled == [0, 1, len(row.ids) - 2, len(row.ids) - 1]
    assert [row.logprobs[i] for i in sampled] == [-0.25] * 4 and sum(row.logprobs) == -1.0
    assert [c.span for c in session.calls] == [(0, 2), (len(row.ids) - 2, len(row.ids))]
    assert [c.version for c in session.calls] == [3, 3]


def test_sampled_ids_are_never_re_encoded(renderer):
    """The model samples "<", "answ", "er" as separate tokens: decoded that is "<answer", which the tokenizer
    would encode with the merged token "answer". The next call's context must hold the ids as sampled."""
    sampled = encode("<") + encode("answ") + encode("er") + [EOS]
    text = tiny_tokenizer().decode(sampled, skip_special_tokens=True)
    assert text == "<answer" and encode(text) != sampled[:-1]  # re-encoding WOULD change the ids
    session = Session("s", 1, LIMITS, EOS)
    first = call(session, renderer, [user("q")], sampled)
    second = call(session, renderer, [user("q"), assistant(text), user("more")], encode("7") + [EOS])
    assert second.context[: len(first.context) + len(sampled)] == first.context + sampled
    assert second.context != template_ids([user("q"), assistant(text), user("more")])  # the render would differ


def test_a_cut_turn_is_closed_with_an_untrained_stop_token(renderer):
    """A call cut by its token budget (no stop token sampled): the continuation starts with EOS, loss mask 0."""
    session = Session("s", 1, LIMITS, EOS)
    call(session, renderer, [user("q")], encode("LLL"), stopped=False)
    call(session, renderer, [user("q"), assistant("LLL"), user("next")], encode("R") + [EOS])
    row = session.rows[0]
    n = len(encode("LLL"))
    assert row.ids[n] == EOS and row.loss_mask[n] == 0 and row.loss_mask[:n] == [1] * n


def test_rewritten_history_forks_a_row_that_copies_the_shared_turns_as_context(renderer):
    """[u1, a1, u2] then [u1, a1, u2'] (u2 edited): the second row copies prompt(u1) + a1's sampled ids (mask
    0: trained in row 0) and renders u2'. Every sampled token is trained in exactly one row."""
    session = Session("s", 1, LIMITS, EOS)
    a1 = encode("<") + encode("answ") + encode("er") + [EOS]  # non-canonical: copied, not re-rendered
    call(session, renderer, [user("u1")], a1)
    text = tiny_tokenizer().decode(a1, skip_special_tokens=True)
    call(session, renderer, [user("u1"), assistant(text), user("u2")], encode("R") + [EOS])
    third = call(session, renderer, [user("u1"), assistant(text), user("u2 edited")], encode("L") + [EOS])
    assert (session.forks == 1 and len(session.rows) == 2
            and session.fork_reasons == ["history rewritten, trimmed or repeated"])
    fork = session.rows[1]
    head = template_ids([user("u1")])
    assert third.context[: len(head) + len(a1)] == head + a1
    assert fork.loss_mask[: len(a1)] == [0] * len(a1)
    trained = sum(sum(r.loss_mask) for r in session.rows)
    assert trained == len(a1) + 2 + 2  # a1, "R"+EOS, "L"+EOS: each once
    assert session.calls[-1].row == 1


@pytest.mark.parametrize("later", [
    [user("summary of the game so far")],                     # trimmed: nothing shared at a turn end
    [user("u1")],                                              # the same first call again (a retry)
    [user("u1 edited"), assistant("L"), user("u2")],           # an earlier message edited, the conversation longer
])
def test_trimmed_or_repeated_history_forks_a_fresh_row(renderer, later):
    session = Session("s", 1, LIMITS, EOS)
    call(session, renderer, [user("u1")], encode("L") + [EOS])
    pending = call(session, renderer, later, encode("R") + [EOS])
    assert session.forks == 1 and pending.context == template_ids(later)
    assert session.rows[1].loss_mask == [1, 1]


def test_changed_tools_fork(renderer):
    session = Session("s", 1, LIMITS, EOS)
    call(session, renderer, [user("u1")], encode("L") + [EOS])
    call(session, renderer, [user("u1"), assistant("L"), user("u2")], encode("R") + [EOS], tools=[CALCULATOR])
    assert session.forks == 1 and session.fork_reasons == ["tools changed"]


def test_a_second_call_while_the_first_is_generating_forks(renderer):
    session = Session("s", 1, LIMITS, EOS)
    call(session, renderer, [user("u1")], encode("L") + [EOS])
    messages = normalize_messages([user("u1"), assistant("L"), user("u2")])
    first = session.prepare_chat(messages, None, renderer)
    second = session.prepare_chat(messages, None, renderer)  # the row is busy with `first`
    assert not first.new_row and second.new_row and session.forks == 1
    assert second.context == first.context  # the fork copies the same ids


@pytest.mark.parametrize("sent_back", [
    {"role": "assistant", "content": "L", "refusal": None, "annotations": None, "audio": None, "function_call": None,
     "tool_calls": None},                                          # openai's model_dump()
    {"role": "assistant", "content": [{"type": "text", "text": "L"}]},  # content parts
])
def test_the_reply_sent_back_as_clients_serialize_it_still_extends(renderer, sent_back):
    session = Session("s", 1, LIMITS, EOS)
    call(session, renderer, [user("u1")], encode("L") + [EOS])
    call(session, renderer, [user("u1"), sent_back, user("u2")], encode("R") + [EOS])
    assert session.forks == 0 and len(session.rows) == 1


def test_same_message_is_lenient_only_where_clients_differ():
    returned = normalize_messages([assistant(None, openai_tool_calls([{"name": "calc", "arguments": {"x": 1}}],
                                                                     "call_0"))])[0]
    spaced = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "other", "type": "function", "function": {"name": "calc", "arguments": '{ "x" :1 }'}}]}
    assert same_message(normalize_messages([spaced])[0], returned)
    wrong = json.loads(json.dumps(spaced))
    wrong["tool_calls"][0]["function"]["arguments"] = '{"x": 2}'
    assert not same_message(normalize_messages([wrong])[0], returned)
    raw = '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'
    # the raw text kept by the harness
    assert same_message({"role": "assistant", "content": raw}, returned, raw_text=raw)
    assert not same_message({"role": "user", "content": "a"}, {"role": "user", "content": "b"})


def test_limits_refuse_a_call_and_mark_the_session():
    renderer = ChatRenderer(tiny_tokenizer())
    session = Session("s", 1, Limits(max_turns=1, max_new_tokens=16, max_total_tokens=240), EOS)
    call(session, renderer, [user("u1")], encode("L") + [EOS])
    with pytest.raises(RequestError) as info:
        session.prepare_chat(normalize_messages([user("u1"), assistant("L"), user("u2")]), None, renderer)
    assert info.value.code == "max_turns_exceeded" and session.cut == "max_turns"
    prompt = len(template_ids([user("u1")]))
    short = Session("t", 1, Limits(max_turns=8, max_new_tokens=16, max_total_tokens=prompt + 3), EOS)
    pending = short.prepare_chat(normalize_messages([user("u1")]), None, renderer, max_tokens=5)
    assert pending.budget == 3  # min(cap 16, room 3, max_tokens 5)
    assert Session("u", 1, LIMITS, EOS).prepare_chat(normalize_messages([user("u1")]), None, renderer, 5).budget == 5
    tiny = Session("v", 1, Limits(max_turns=8, max_new_tokens=16, max_total_tokens=prompt), EOS)
    with pytest.raises(RequestError) as info:
        tiny.prepare_chat(normalize_messages([user("u1")]), None, renderer)
    assert info.value.code == "context_length_exceeded" and tiny.cut == "max_total_tokens"


def test_completions_extend_by_text_prefix_and_by_token_prefix():
    session = Session("s", 1, LIMITS, EOS)
    first = session.prepare_text("Q: 1+1\nA:", encode)
    session.record(first, encode(" 2"), [-0.1, -0.2], False, " 2", None, "length", 0)
    second = session.prepare_text("Q: 1+1\nA: 2\nQ: 2+2\nA:", encode)
    assert not second.new_row and second.context == encode("Q: 1+1\nA:") + encode(" 2") + encode("\nQ: 2+2\nA:")
    session.record(second, encode(" 4"), None, False, " 4", None, "length", 0)
    ids = session.rows[0].prompt_ids + session.rows[0].ids
    third = session.prepare_text(ids + [7, 8], encode)  # token-id prompts: prefix of the row's ids
    assert third.new_row  # a text row is matched by text; token prompts start their own row
    session.record(third, [9], None, False, "x", None, "length", 0)
    fourth = session.prepare_text(ids + [7, 8, 9, 5], encode)
    assert not fourth.new_row and fourth.prefix == [5]


# ------------------------------------------------------------------ tool calls


@pytest.mark.parametrize("text,content,calls", [
    ('<tool_call>\n{"name": "calc", "arguments": {"expression": "1+2"}}\n</tool_call>', None,
     [{"name": "calc", "arguments": {"expression": "1+2"}}]),
    ('Sure.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
     '<tool_call>{"name": "b", "arguments": "{\\"k\\": 1}"}</tool_call>',
     "Sure.", [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k": 1}}]),
])
def test_hermes_parses_tool_calls(text, content, calls):
    parsed = TOOL_PARSERS["hermes"](text, [CALCULATOR])
    assert parsed.content == content and parsed.tool_calls == calls


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "calc", "arguments": {"expression": "1+2"}</tool_call>',   # broken JSON
    '<tool_call>{"arguments": {}}</tool_call>',                                     # no name
    '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>',                    # arguments not an object
    '<tool_call>{"name": "calc", "arguments": {}}',                                 # unclosed
    '<tool_call>{"name": "calc", "arguments": {}}</tool_call> and then some text',  # text after the call
    # one of two broken
    '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {</tool_call>',
    'no call at all',
])
def test_a_malformed_hermes_call_comes_back_as_plain_content(text):
    parsed = parse_tool_calls("hermes", text, [CALCULATOR])
    assert parsed.content == text and parsed.tool_calls == []


def test_tags_parser_reads_declared_one_parameter_tools_only():
    parsed = TOOL_PARSERS["tags"]("<calc>37*12+5</calc>", [CALCULATOR])
    assert parsed.content is None and parsed.tool_calls == [{"name": "calc", "arguments": {"expression": "37*12+5"}}]
    assert TOOL_PARSERS["tags"]("<answer>449</answer>", [CALCULATOR]).tool_calls == []  # undeclared tag: text
    assert parse_tool_calls("tags", "<calc>1</calc>", None).tool_calls == []  # no tools in the request: no parsing


def test_a_parser_that_raises_leaves_the_text_as_content(monkeypatch):
    monkeypatch.setitem(TOOL_PARSERS, "broken", lambda text, tools: 1 / 0)
    assert parse_tool_calls("broken", "<x>", [CALCULATOR]).content == "<x>"


def test_a_parsed_hermes_call_renders_back_to_the_sampled_text_and_extension_uses_the_sampled_ids_anyway():
    """Canonical sampled text (what the template itself writes): the returned message rendered through the
    template reproduces prompt + sampled text + closing, so the rendering and the kept ids agree. Non-canonical
    text (other JSON spacing) renders back differently; the row still holds the sampled ids, not the rendering."""
    tok = tiny_tokenizer()
    renderer = ChatRenderer(tok, HERMES_TEMPLATE)
    q = [user("37*12+5=?")]
    for sampled_text, canonical in [
        ('<tool_call>\n{"name": "calc", "arguments": {"expression": "37*12+5"}}\n</tool_call>', True),
        ('<tool_call>\n{"name":"calc","arguments":{"expression":"37*12+5"}}\n</tool_call>', False),
    ]:
        parsed = parse_tool_calls("hermes", sampled_text, [CALCULATOR])
        reply = normalize_messages([assistant(parsed.content, openai_tool_calls(parsed.tool_calls, "call_0"))])[0]
        prompt_text = renderer.render(q, [CALCULATOR], True)
        rendered_back = renderer.render(q + [reply], [CALCULATOR], False)
        assert (rendered_back == prompt_text + sampled_text + "<|im_end|>\n") is canonical
        sampled = encode(sampled_text) + [EOS]
        session = Session("s", 1, Limits(8, 64, 512), EOS)
        pending = session.prepare_chat(normalize_messages(q), [CALCULATOR], renderer)
        session.record(pending, sampled, None, True, sampled_text, reply, "tool_calls", 0)
        follow = q + [reply, {"role": "tool", "tool_call_id": "call_0_0", "content": "449"}]
        second = session.prepare_chat(normalize_messages(follow), [CALCULATOR], renderer)
        assert not second.new_row and second.context[: len(pending.context) + len(sampled)] == pending.context + sampled
        full = encode(renderer.render(follow, [CALCULATOR], True))
        assert (second.context == full) is canonical
