"""`ModelCall`: one model as it is built and called - its Relax module, the target it is built
for, its entry function and its input arrays.

`build_and_time`, `build_reference`, `run_offloaded` and the sweep pass these four values along
together, and each time one of them changes (the offloaded module in place of the legalized
one, TVM's baseline build of it, inputs drawn at another size) the other three stay: `on`,
`offloaded` and `with_arrays` say which one changed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tirbyoc.app.running.targets import model_target


@dataclass(frozen=True)
class ModelCall:
    mod: object  # the Relax IRModule (legalized; offloaded or not)
    target: object  # what it is built for (a Target or its dict form)
    entry: str  # the Relax function called
    arrays: list  # the inputs, in the entry function's parameter order

    def on(self, mod) -> "ModelCall":
        """The same call of another module (the offloaded one, TVM's baseline of it)."""
        return replace(self, mod=mod)

    def offloaded(self, mod) -> "ModelCall":
        """The same call of ``mod``, an offloaded module, built where the model runs for this
        target (`model_target`: this CPU when the offloaded code runs in an emulator)."""
        return replace(self, mod=mod, target=model_target(self.target))

    def with_arrays(self, arrays) -> "ModelCall":
        """The same module called with other inputs (another binding of its sizes)."""
        return replace(self, arrays=list(arrays))


__all__ = ["ModelCall"]
