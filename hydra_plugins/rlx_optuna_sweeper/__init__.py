"""rlx's Optuna sweeper for Hydra (`override /hydra/sweeper: rlx_optuna`), written on Optuna's ask/tell
interface so that a current Optuna works (the hydra-optuna-sweeper plugin needs optuna < 3)."""
