"""Every defined check class by name, and the issue codes each declares: what a
``requires`` and ``preflight.disable`` are validated against.

Defining a concrete ``Check`` subclass registers it (``Check.__init_subclass__``), so a
recipe's or plugin's own checks are known as soon as its module is imported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from optimus_preflight.preflight.framework.issues import FRAMEWORK_CODES, STAGE_ORDER, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.check import Check

# How an issue code is written: an upper-case token such as "DP15" or "ENV_DISK".
CODE_FORM = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*")


class CheckDefinitionError(TypeError):
    """A developer's mistake in a check class or a check list, raised when the class is
    defined or the list is registered, never as a crashed or silently skipped check."""


# Every concrete check class by name, so a ``requires`` can be told from a typo.
_KNOWN_CHECKS: dict[str, type[Check]] = {}


def known_checks() -> dict[str, type[Check]]:
    """Every concrete check class defined so far, by name: the shipped ones and those of
    any imported recipe or plugin module."""
    return dict(_KNOWN_CHECKS)


def known_codes() -> dict[str, list[str]]:
    """Every issue code a defined check (or the framework, for any check) can report,
    with the names of the checks that declare it."""
    codes: dict[str, list[str]] = {code: ["(any check)"] for code in FRAMEWORK_CODES}
    for name, cls in _KNOWN_CHECKS.items():
        for code in cls.codes:
            codes.setdefault(code, []).append(name)
    return codes


def define_check(cls: type[Check], base: type[Check]) -> None:
    """Validate a concrete check class (``base`` is ``Check``) and register it by name."""
    where = f"{cls.__module__}.{cls.__qualname__}"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise CheckDefinitionError(
            f"{where} has no name: set a class attribute such as name = \"data.my_check\" "
            "(or declare a base class with `class {cls.__name__}(Check, abstract=True)`).")
    stage = getattr(cls, "stage", None)
    try:
        cls.stage = Stage(stage)
    except ValueError:
        raise CheckDefinitionError(
            f"{where} ({name}) has stage={stage!r}: set stage to one of "
            f"{', '.join('Stage.' + member.name for member in Stage)}.") from None
    if isinstance(cls.requires, str) or not all(isinstance(other, str) for other in cls.requires):
        example = f" such as ({cls.requires!r},)" if isinstance(cls.requires, str) else ""
        raise CheckDefinitionError(
            f"{where} ({name}) has requires={cls.requires!r}: give a tuple of check names{example}.")
    cls.requires = tuple(cls.requires)
    codes = getattr(cls, "codes", ())
    if isinstance(codes, str) or not all(isinstance(code, str) and CODE_FORM.fullmatch(code) for code in codes):
        example = f" such as ({codes!r},)" if isinstance(codes, str) else ""
        raise CheckDefinitionError(
            f"{where} ({name}) has codes={codes!r}: give a tuple of the upper-case issue codes "
            f"its run() can report{example}, e.g. (\"DATA_EMPTY\", \"DP4\").")
    cls.codes = tuple(codes)
    if not callable(getattr(cls, "run", None)) or cls.run is base.run:
        raise CheckDefinitionError(f"{where} ({name}) does not implement run(self, ctx, findings).")
    previous = _KNOWN_CHECKS.get(name)
    # A subclass that keeps its parent's name replaces it (a tuned default check); the
    # same class defined again (a reloaded module, a re-run notebook cell) replaces itself.
    if previous is not None and not issubclass(cls, previous) and (
            f"{previous.__module__}.{previous.__qualname__}" != where):
        raise CheckDefinitionError(
            f"two checks are named {name!r}: {previous.__module__}.{previous.__qualname__} and {where}; "
            "give one of them another name.")
    _KNOWN_CHECKS[name] = cls


def validate_checks(checks: Iterable[Check | type[Check]]) -> None:
    """Refuse a check list the runner could only run wrongly: two checks with one name
    (one result would hide the other), or a ``requires`` naming an unknown check, a
    check of a later stage, or a check placed after it in the same stage (each would
    skip the dependent on every run)."""
    classes = [check if isinstance(check, type) else type(check) for check in checks]
    ordered = sorted(classes, key=lambda cls: STAGE_ORDER.index(cls.stage))
    position: dict[str, int] = {}
    for index, cls in enumerate(ordered):
        if cls.name in position:
            raise CheckDefinitionError(f"the check list holds {cls.name!r} twice: drop one.")
        position[cls.name] = index
    for cls in ordered:
        for needed in cls.requires:
            required = _KNOWN_CHECKS.get(needed)
            if required is None:
                close = [known for known in _KNOWN_CHECKS if known.split(".")[-1] == needed.split(".")[-1]]
                raise CheckDefinitionError(
                    f"{cls.name} requires {needed!r}, which is no known check"
                    + (f" (did you mean {close[0]!r}?)" if close else "") + ".")
            if STAGE_ORDER.index(required.stage) > STAGE_ORDER.index(cls.stage):
                raise CheckDefinitionError(
                    f"{cls.name} (stage {cls.stage.value}) requires {needed} of the later stage "
                    f"{required.stage.value}, which runs after it: move {cls.name} to stage "
                    f"{required.stage.value} or later, or drop the requirement.")
            if needed in position and position[needed] > position[cls.name]:
                raise CheckDefinitionError(
                    f"{cls.name} requires {needed}, which comes after it in stage {cls.stage.value}: "
                    "list it first.")
