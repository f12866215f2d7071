"""The scripts of tools/analysis/ as modules, for tests that call their functions."""
import importlib.util
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / 'tools' / 'analysis'


def load_tool(name: str) -> ModuleType:
    """tools/analysis/<name>.py, imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
