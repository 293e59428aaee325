"""Generation engines: the `Generator` Protocol (token ids in, sampled ids and log-probs out) and what implements
it in this process (transformers with rlx's decode step, vLLM colocated), the sampling helpers, the records an
engine returns, and the speculative-lane Protocol (lane.py) a producer of rounds is given (the fleet implements
it). The lowest of the three generation packages (engines < fleet < rollout): it knows nothing of servers or
producers."""
