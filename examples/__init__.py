"""Agent programs written against the OpenAI client, trained by rlx unchanged (env=harness; docs/agents/harness.md)."""
