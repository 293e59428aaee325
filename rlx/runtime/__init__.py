"""Runtime of a run: process launch, data-parallel collectives, checkpoints, the run directory, trackers."""
