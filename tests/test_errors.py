"""One exception base per package (httpx's way): every error a package raises on purpose derives from its base, so
a caller catches a package's failures with one `except` and nothing else. Checked on the imported modules, so a
new exception class that forgets its base fails here."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

BASES = {
    "mm_core": "mm_core.errors.CoreError",
    "chatops": "chatops.errors.ChatopsError",
    "workers": "workers.errors.WorkerError",
    "bot": "bot.errors.BotError",
    "playground": "playground.errors.PlaygroundError",
    "commands": "commands.errors.CommandError",
}


def exceptions_defined_in(package: str) -> list[type[BaseException]]:
    root = importlib.import_module(package)
    found = []
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == module.__name__ and issubclass(value, BaseException):
                found.append(value)
    return found


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_error_a_package_defines_derives_from_its_base(package: str) -> None:
    module_name, _, base_name = BASES[package].rpartition(".")
    base = getattr(importlib.import_module(module_name), base_name)
    errors = exceptions_defined_in(package)
    assert errors, f"{package} defines no exception: the check would see nothing"
    strays = sorted(f"{e.__module__}.{e.__qualname__}" for e in errors if not issubclass(e, base))
    assert strays == [], f"not under {BASES[package]}: {strays}"
