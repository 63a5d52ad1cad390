"""`LazyModule`: a module imported on first attribute access, for libraries only some calls use.

A module that parses SQL in a few of its functions names sqlglot at the top (`exp.Column` in its
code, `exp.EQ` in its isinstance checks) like any import; through a `LazyModule` a process that never
reaches those functions (a cold point read with a plain filter, a DAG file) never imports sqlglot.
Type checkers see the real import (`if TYPE_CHECKING:`).
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """Stands for the module `name` and imports it when one of its attributes is first read."""

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self.__name__)
        self.__dict__.update(module.__dict__)  # later reads find the attributes without this call
        return getattr(module, attribute)
