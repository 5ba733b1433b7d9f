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
