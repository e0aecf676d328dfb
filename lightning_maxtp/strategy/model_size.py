"""``ModelSize``: a model's parameter counts, and the unit FSDP gathers at once (pure).

``ModelSize.from_module`` counts a module's parameters and simulates how FSDP's size-based
auto-wrap policy would cut it into units, mirroring ``torch.distributed.fsdp.wrap
._recursive_wrap`` (tests compare the two), so the memory formula knows how many parameters
FSDP holds unsharded at one time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["FSDP_MIN_UNIT_PARAMS", "ModelSize"]

FSDP_MIN_UNIT_PARAMS = 10_000_000
"""``min_num_params`` of the size-based auto-wrap policy ``AutoMaxTP`` gives FSDP: small enough
that a stack of blocks becomes many units (a larger threshold can leave one unit holding the
whole model, which FSDP then gathers at once), large enough to keep the number of collectives
per step modest."""


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts of a model, as the memory formula needs them."""

    num_params: int
    trainable_params: int
    largest_unit_params: int
    """Parameters FSDP gathers at once: the largest unit of the size-based auto-wrap policy with
    ``FSDP_MIN_UNIT_PARAMS`` (the whole model when only a count is known: an upper bound)."""
    param_bytes: int
    """Bytes the parameters take as the module holds them now."""

    @classmethod
    def from_count(cls, num_params: int, *, trainable_params: int | None = None) -> ModelSize:
        """A model known only by its parameter count (fp32, all trainable, one FSDP unit).

        Raises:
            ValueError: If a count is negative or ``trainable_params > num_params``.
        """
        if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 0:
            raise ValueError(
                f"`num_params` must be an int >= 0, got {num_params!r}; pass the parameter "
                "count, e.g. sum(p.numel() for p in model.parameters())"
            )
        trainable = num_params if trainable_params is None else trainable_params
        if not 0 <= trainable <= num_params:
            raise ValueError(
                f"`trainable_params` must be between 0 and num_params={num_params}, got "
                f"{trainable_params!r}"
            )
        return cls(num_params, trainable, num_params, 4 * num_params)

    @classmethod
    def from_module(
        cls, module: nn.Module, *, min_unit_params: int = FSDP_MIN_UNIT_PARAMS
    ) -> ModelSize:
        """Count a module's parameters (shared ones once) and simulate FSDP's size-based wrap.

        Args:
            module: The model (a ``LightningModule`` or any ``torch.nn.Module``). Parameters on
                the meta device count too; parameters a ``configure_model`` hook creates later
                do not exist yet and are not counted.
            min_unit_params: ``min_num_params`` of the wrap policy to simulate.
        """
        params = list(module.parameters())
        num = sum(p.numel() for p in params)
        trainable = sum(p.numel() for p in params if p.requires_grad)
        nbytes = sum(p.numel() * p.element_size() for p in params)
        return cls(num, trainable, _largest_fsdp_unit(module, min_unit_params), nbytes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)

    def __str__(self) -> str:
        return f"{_count(self.num_params)} params ({_count(self.trainable_params)} trainable)"


def _largest_fsdp_unit(root: nn.Module, min_params: int) -> int:
    """Mirror ``torch.distributed.fsdp.wrap._recursive_wrap`` with ``size_based_auto_wrap_policy``.

    Children are wrapped first; a module becomes a unit when the parameters not yet wrapped
    below it reach ``min_params`` (``ModuleList``/``ModuleDict`` never, ``MultiheadAttention`` is
    not recursed into); the root unit holds whatever is left.
    """
    from torch import nn

    units: list[int] = []

    def visit(module: nn.Module) -> int:
        """Wrap below (and maybe at) ``module``; return the parameters wrapped."""
        total = sum(p.numel() for p in module.parameters())
        if total < min_params or isinstance(module, nn.MultiheadAttention):
            return 0
        wrapped = sum(visit(child) for child in module.children())
        remainder = total - wrapped
        if (
            module is not root
            and remainder >= min_params
            and not isinstance(module, nn.ModuleList | nn.ModuleDict)
        ):
            units.append(remainder)
            return total
        return wrapped

    wrapped = visit(root)
    units.append(sum(p.numel() for p in root.parameters()) - wrapped)
    return max(units)


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


_OPTIMIZER_NAMES = (
    ("AdamW", "adamw"),
    ("Adam", "adam"),
    ("RMSprop", "rmsprop"),
    ("Adagrad", "adagrad"),
    ("SGD", "sgd"),
)
"""Optimizer classes (or a base class in their MRO) and their ``OPTIMIZER_STATES`` names."""


def optimizer_name(model: Any) -> tuple[str | None, str]:
    """The optimizer ``model.configure_optimizers()`` returns, as an ``OPTIMIZER_STATES`` name.

    The result is only read (its optimizers hold no state until they step); Lightning calls
    ``configure_optimizers`` again when it sets the model up.

    Returns:
        ``(name, why)``: the name, or ``None`` with why it could not be read.
    """
    try:
        found = model.configure_optimizers()
    except Exception as err:  # it may need what only Lightning's setup provides
        return None, f"configure_optimizers() could not be called yet ({type(err).__name__})"
    stack, optimizers = [found], []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.append(item.get("optimizer"))
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif hasattr(item, "param_groups") and hasattr(item, "step"):
            optimizers.append(item)
    names = []
    for opt in optimizers:
        mro = [c.__name__ for c in type(opt).__mro__]
        name = next((n for cls, n in _OPTIMIZER_NAMES if cls in mro), None)
        if name == "sgd" and any(g.get("momentum", 0) for g in opt.param_groups):
            name = "sgd_momentum"
        if name is None:
            return None, f"{type(opt).__name__} is not in the memory table"
        names.append(name)
    if not names:
        return None, "configure_optimizers() returned no optimizer"
    states = {"adamw": 2, "adam": 2, "rmsprop": 1, "adagrad": 1, "sgd_momentum": 1, "sgd": 0}
    return max(names, key=lambda n: states[n]), "read from configure_optimizers()"
