"""Test doubles and shared test helpers (not part of the product): the float64 comparison helpers, the gloo
process pool; the AscendC CPU twin and the fake torch_npu live here too."""


def options_block(family: str = "loss", **values) -> list:
    """The options block of a ``family`` ("loss" / "logprobs") op's positional arguments: the
    ``fused_lce.core.Options`` fields of that family in schema order, ``values`` where given and the defaults
    elsewhere: a test that calls an op positionally spells only what it sets (a new option needs no edit)."""
    from fused_lce.core.types import Options, op_fields

    names = op_fields(family)
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"options_block: {sorted(unknown)} are not options of the {family} ops")
    defaults = Options()
    return [values[k] if k in values else getattr(defaults, k) for k in names]


def clean_env() -> dict:
    """This process's environment without the variables that steer fused_lce, CANN or the test doubles: what a
    subprocess that sets its own starts from."""
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("FUSED_LCE_", "ASCEND_", "FAKE_"))}


def run_reporting_script(path: str, prefix: str, timeout: int):
    """Run the Python script ``path`` in a clean environment and return the JSON of its stdout line that
    starts with ``prefix`` (failing with the script's output when there is none)."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, path], capture_output=True, text=True, env=clean_env(),
                       timeout=timeout)
    line = next((x for x in r.stdout.splitlines() if x.startswith(prefix)), None)
    assert line is not None, f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(line[len(prefix):])
