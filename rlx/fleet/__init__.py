"""The server fleet: a `Generator` over HTTP inference servers (routing, failover, weight versions), the
publishers that carry the trainer's weights to them, the servers' processes and guards, and the choice of backend
(`backends.build_generator`). Above the engines, beside the producers: rlx.rollout never imports it; the builder
hands a producer the fleet as a `Generator`."""
