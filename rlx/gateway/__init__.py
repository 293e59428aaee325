"""An OpenAI-compatible endpoint that trains agent programs written against the OpenAI client (issue 28).

    server.py    Gateway: uvicorn in a background thread, sessions, token, policy version
    app.py       the routes: /v1/chat/completions, /v1/completions, /v1/models, /health (also /sessions/{sid}/v1/...)
    batcher.py   requests of all live sessions -> one Generator.generate_ids call (count and wait time)
    sessions.py  token-in/token-out across turns: extension, forks, loss mask, log-probs, limits
    chat.py      message normalization, comparison and chat-template rendering
    tools.py     tool-call parsers (registry): hermes, tags
    harness.py   env=harness: run(task, base_url, api_key) per episode, concurrency, timeouts, play_harness
    episodes.py  sessions -> Episodes -> training rows
    cli.py       `rlx gateway`: serve a model by hand
User guide: docs/agents/harness.md.
"""
