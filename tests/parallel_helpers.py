"""Compare a 1-process run with an N-process run of the same global batch (used by test_parallel.py).

A loop family added later (e.g. the preference loop) gets its equivalence test with one call:
    assert_same_parameters(tmp_path, ["algorithm=dpo", "steps=2", ...])
"""

from safetensors.torch import load_file

from rlx.config.paths import ASSETS_DIR
from tests.conftest import run_rlx

# Adam's update is invariant to a constant gradient scale unless eps dominates the second moment; a
# large eps makes the update ~ lr * gradient, so a wrong loss scale or normaliser shows in the weights.
SENSITIVE = ["optim.eps=1.0", "optim.lr=0.05", "optim.max_grad_norm=null", "optim.warmup_steps=0"]
QUIET = ["hardware.num_threads=1", "save.plot=false", "eval.size=4", "eval.every=0", "eval.at_start=false",
         "log.samples_every=0", "checkpoint.every=0"]


def final_weights(tmp_path, name):
    runs = sorted((tmp_path / "outputs" / "train").glob(f"*_{name}"))
    assert len(runs) == 1, runs
    return load_file(runs[0] / "final" / "model.safetensors")


def checkpoint_weights(tmp_path, name, step, file="model.safetensors"):
    """A file of run `name`'s checkpoint at `step` (model_1.safetensors: the second prepared model)."""
    runs = sorted((tmp_path / "outputs" / "train").glob(f"*_{name}"))
    assert len(runs) == 1, runs
    return load_file(runs[0] / "checkpoints" / f"step_{step:06d}" / file)


def train_both(tmp_path, args, processes=2, strategy="ddp", many_args=()):
    """Run `args` on 1 process and on `processes` gloo processes under hardware=`strategy` (ddp, fsdp, deepspeed_zero2),
    the latter with `many_args` added (settings of that strategy's group); return (one, many, start) weights."""
    common = [*args, *SENSITIVE, *QUIET]
    one = run_rlx(["train", *common, "name=one"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    on_cpu = [] if strategy.startswith("deepspeed") else ["hardware.cpu=true"]  # DeepSpeed finds the CPU itself
    many = run_rlx(["train", *common, "name=many", f"hardware={strategy}", *on_cpu, "hardware.mixed_precision=no",
                    f"hardware.num_processes={processes}", *many_args], tmp_path)
    assert many.returncode == 0, many.stderr[-3000:]
    start = load_file(ASSETS_DIR / "tiny" / "model.safetensors")
    return final_weights(tmp_path, "one"), final_weights(tmp_path, "many"), start


def assert_same_parameters(tmp_path, args, processes=2, atol=1e-5, strategy="ddp", many_args=()):
    one, many, start = train_both(tmp_path, args, processes, strategy, many_args)
    moved = max((one[k] - start[k]).abs().max().item() for k in one if k in start)  # a fresh head is not in start
    gap = max((one[k] - many[k]).abs().max().item() for k in one)
    assert moved > 100 * atol, f"training barely moved the weights ({moved:.2e}); the comparison would prove nothing"
    assert gap < atol, (f"{processes}-process run differs from the 1-process run by {gap:.2e} (weights moved "
                        f"{moved:.2e})")
