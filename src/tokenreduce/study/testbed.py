"""``Testbed``: what a study's runs start from and are measured on, a parameter of every study."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import TokenReduceError


@dataclass(frozen=True)
class Testbed:
    """Three kinds, one dataclass (``kwargs``: timm create_model keyword arguments of ``model``):

    - ``reference``: a built-in reference recipe (``fmnist-vit``, ``scenes-vit``): its trained checkpoint
      (``train.recipes.reference_checkpoint``) starts every run, its dataset is the data;
    - ``model``: a timm model name, from scratch, with timm's ``pretrained`` weights (network) or a local ``weights``
      file (a state dict timm loads through ``pretrained_cfg_overlay``), on ``data``: a dataset name or a folder
      (Fashion-MNIST idx files, or an ImageFolder ROOT/{train,val}/<class>/);
    - ``synthetic`` (smoke): Fashion-MNIST-format random images written under the run folder, so a smoke study needs
      no downloaded data; with ``data`` a dataset built from Fashion-MNIST (``fmnist_scenes``), made from them.

    The recipe's other settings (optimiser, schedule, subset) apply to every kind."""

    reference: str | None = None
    model: str | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()
    pretrained: bool = False
    weights: str | None = None
    data: str | None = None
    synthetic: bool = False

    def __post_init__(self) -> None:
        if self.reference and self.model:
            raise TokenReduceError("a test bed is a reference recipe or a timm model, not both")
        if (self.pretrained or self.weights) and not self.model:
            raise TokenReduceError("--pretrained and --weights need --model NAME (a timm model)")
        if self.weights and not Path(self.weights).is_file():
            raise TokenReduceError(f"--weights {self.weights}: no such file")
        if isinstance(self.kwargs, dict):
            object.__setattr__(self, "kwargs", tuple(sorted(self.kwargs.items())))

    def describe(self) -> dict[str, Any]:
        """A JSON-able record of the test bed (stored in every run's JSON, compared on a rerun)."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, False, ())}
        if self.kwargs:
            d["kwargs"] = dict(self.kwargs)
        return json.loads(json.dumps(d))

    def text(self) -> str:
        """One line for tables and the report."""
        if self.reference:
            what = f"the {self.reference} reference"
        elif self.model:
            weights = " with timm's pretrained weights" if self.pretrained else \
                f" with weights {Path(self.weights).name}" if self.weights else " from scratch"
            what = f"timm {self.model}{weights}"
        else:
            what = "the recipe's model"
        data = " from ".join(filter(None, (self.data, "synthetic Fashion-MNIST-format images"))) if self.synthetic \
            else self.data
        return f"{what}{f' on {data}' if data else ''}"

    def slug(self) -> str:
        """A folder name for this test bed's results (a test bed other than the study's default)."""
        parts = [self.reference or self.model or "recipe", Path(self.data).name if self.data else None,
                 "pretrained" if self.pretrained else None, Path(self.weights).stem if self.weights else None]
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(p for p in parts if p))

    def train_fields(self, scratch: Path) -> dict[str, Any]:
        """TrainConfig fields of this test bed; ``scratch`` is where synthetic data goes."""
        fields: dict[str, Any] = {}
        if self.reference:
            from ..train.recipes import get_recipe

            fields.update(init=self.checkpoint(), model=None,
                          data=get_recipe(self.reference).get("data", "fashion_mnist"))
        elif self.model:
            kwargs = dict(self.kwargs)
            model: dict[str, Any] = {"name": self.model, "kwargs": kwargs}
            if self.weights:  # timm's own route to a local file: pretrained with the file overlaid
                kwargs["pretrained_cfg_overlay"] = {"file": str(Path(self.weights).resolve())}
            if self.weights or self.pretrained:
                model["pretrained"] = True
            fields["model"], fields["init"] = model, None
        if self.synthetic and self.data:
            fields["data"], fields["data_dir"] = self.data, str(synthetic_data(scratch))
        elif self.synthetic:
            fields["data"] = str(synthetic_data(scratch))
        elif self.data:
            fields["data"] = self.data
        return fields

    def fmnist(self) -> bool:
        """Whether the data is Fashion-MNIST (named, a folder read as it, or the synthetic stand-in)."""
        from ..data.build import detect
        from ..train.recipes import get_recipe

        if self.synthetic:
            return self.data in (None, "fashion_mnist")
        data = self.data or (get_recipe(self.reference).get("data") if self.reference else None)
        return data == "fashion_mnist" or bool(data and detect(data) == "fashion_mnist")

    def checkpoint(self) -> str | None:
        """The reference checkpoint runs start from, or None (a model built from its config)."""
        if not self.reference:
            return None
        from ..train.recipes import reference_checkpoint

        return str(reference_checkpoint(self.reference))


def synthetic_data(scratch: Path) -> Path:
    """Fashion-MNIST-format synthetic images under ``scratch`` (written once)."""
    from ..data.fashion_mnist import make_synthetic

    root = Path(scratch) / "synthetic-fmnist"
    if not (root / ".done").is_file():
        make_synthetic(root, n_train=96, n_test=32)
        (root / ".done").write_text("")
    return root
