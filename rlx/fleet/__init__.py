"""The server fleet: a `Generator` over HTTP inference servers (routing, failover, weight versions), the
publishers that carry the trainer's weights to them, the servers' processes and guards, the speculative lane that
draws the next step's rounds on servers a step spares (`overlap.StepOverlap`), and the choice of backend
(`backends.build_generator`). Above the engines, beside the producers: rlx.rollout never imports it; the builder
hands a producer the fleet as a `Generator` (and its lane as a `SpeculativeLane`)."""
