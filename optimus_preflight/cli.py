"""`optimus-train [overrides]` (and `python -m optimus_preflight.cli`, which torchrun
runs): the recipe class is the one the config's ``recipe._target_`` names."""

from __future__ import annotations

from omegaconf import DictConfig

from optimus_preflight.app import run_app
from optimus_preflight.config.instantiate import locate
from optimus_preflight.errors import UserError
from optimus_preflight.recipe import TrainRecipe


def resolve_recipe_class(cfg: DictConfig) -> type[TrainRecipe]:
    target = cfg.recipe._target_
    recipe_class = locate(target, "recipe._target_")
    if not (isinstance(recipe_class, type) and issubclass(recipe_class, TrainRecipe)):
        raise UserError(
            f"recipe._target_={target!r} is not a TrainRecipe subclass",
            key="recipe._target_",
            fix="Point recipe._target_ at a class deriving from optimus_preflight.TrainRecipe.",
        )
    return recipe_class


def main() -> None:
    run_app(resolve=resolve_recipe_class)


if __name__ == "__main__":
    main()
