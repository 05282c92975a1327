"""How the user started this process, for the commands a message tells them to run: a
recipe started as ``python my_recipes.py`` (``MyRecipe.main()``) takes the same overrides
as ``optimus-train``, but a user told to run ``optimus-train --cfg job`` would get the
default recipe's config, not theirs."""

from __future__ import annotations

import sys
from pathlib import Path

# Names sys.argv[0] has when the process is optimus-train itself (its console script,
# ``python -m optimus_preflight.cli`` and torchrun's launch of the same module).
OWN_ENTRY_POINTS = ("optimus-train", "cli.py", "__main__.py")


def program() -> str:
    """``optimus-train``, or ``python my_recipes.py`` for a recipe's own script."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if not name or name in OWN_ENTRY_POINTS or not name.endswith(".py"):
        return "optimus-train"
    return f"python {name}"


def speaker() -> str:
    """The name a message to stderr starts with: ``optimus-train``, or ``my_recipes.py`` for a
    recipe's own script (as argparse names a script), so a ``python my_recipes.py`` user does not
    read an error from a program they never ran."""
    command = program()
    return command.removeprefix("python ")
