"""The core: types, the provider interface, validation, formulas (with the float64 reference), the driver, the
provider registry and the distributed combine. Nothing here imports a backend; backends import only this
package's interface (the names below)."""
from .provider import Provider, WholeRowsProvider, device_name, file_digest
from .types import (LOGPROBS, LOSS, Coefs, EntropyStats, Grads, LossTerms, Options, Problem, Stats, Tensors,
                    TokenWeights, op_fields)

__all__ = ["Provider", "WholeRowsProvider", "device_name", "file_digest", "LOSS", "LOGPROBS", "Coefs",
           "EntropyStats", "Grads", "LossTerms", "Options", "Problem", "Stats", "Tensors", "TokenWeights",
           "op_fields"]
