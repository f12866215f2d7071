"""The code's structure, read from its import statements (every one, at the top of a module or inside a function):
no import circle among the package's modules (``kernels/`` counted as ``nalaformer.kernels``; importing a module
counts as importing the packages above it, whose ``__init__`` runs first), no module importing another module's
private (underscore) name, no tool importing another tool."""
import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {'nalaformer': ROOT / 'nalaformer', 'nalaformer.kernels': ROOT / 'kernels'}


def package_modules() -> Dict[str, Path]:
    """{dotted module name: file} of the installed package, as setup.py lays it out."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob('*.py')):
            parts = list(path.relative_to(folder).with_suffix('').parts)
            if parts[-1] == '__init__':
                parts.pop()
            modules['.'.join([package, *parts])] = path
    return modules


def imports(name: str, path: Path, modules: Dict[str, Path]) -> Iterator[Tuple[str, str, int]]:
    """(imported module, imported name or '', line) of each import statement in ``path`` that reaches the package."""
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, '', node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')[:len(package.split('.')) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f'{base}.{alias.name}'
                yield (submodule, '', node.lineno) if submodule in modules else (base, alias.name, node.lineno)


def import_graph() -> Tuple[Dict[str, Set[str]], List[str]]:
    """{module: the package's modules it imports} and the imports of private names across modules."""
    modules = package_modules()
    graph, private = {name: set() for name in modules}, []
    for name, path in modules.items():
        for target, imported, line in imports(name, path, modules):
            while target and target not in modules:  # `import a.b.c` where a.b.c is a name inside a.b
                target = target.rpartition('.')[0]
            if not target or target == name:
                continue
            graph[name].add(target)
            # importing a.b.c first runs the __init__ of a.b (and of a), unless the importer is inside it
            parent = target.rpartition('.')[0]
            while parent and not name.startswith(parent + '.'):
                graph[name].add(parent)
                parent = parent.rpartition('.')[0]
            if imported.startswith('_') and not imported.startswith('__'):
                private.append(f'{path.relative_to(ROOT)}:{line} imports {imported} from {target}')
    return graph, private


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_is_read_whole():
    graph, _ = import_graph()
    # the graph reaches across the layers it must see, so an empty or misread graph fails here
    assert 'nalaformer.kernels.nala_triton' in graph and 'nalaformer.ops.backend' in graph
    assert 'nalaformer.kernels.nala_jit' in graph['nalaformer.kernels.nala_triton']
    assert 'nalaformer.checkpoint.errors' in graph['nalaformer.models.family']


def test_no_import_circle_in_the_package():
    graph, _ = import_graph()
    assert circles(graph) == []


def test_circle_finder_finds_a_circle():
    assert circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]


def test_no_module_imports_another_modules_private_name():
    _, private = import_graph()
    assert private == []


@pytest.mark.parametrize('tool', sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / 'tools').rglob('*.py')))
def test_no_tool_imports_another_tool(tool):
    tree = ast.parse((ROOT / tool).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module or '' for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert not {m for m in modules if m == 'tools' or m.startswith('tools.')}, modules
    assert 'spec_from_file_location' not in calls and 'run_path' not in calls  # loading a tool by its path


# The layers, from the ground up: (package, what of this package its modules may import, libraries they must not).
HEAVY = {'torch', 'timm', 'mmengine', 'mmcv', 'mmseg', 'mmdet', 'triton'}
GROUND = {'nalaformer.errors', 'nalaformer.files'}
LAYERS = [
    ('nalaformer.images', GROUND | {'nalaformer.images'}, HEAVY),
    ('nalaformer.datasets', GROUND | {'nalaformer.images', 'nalaformer.datasets'}, HEAVY),
]
# The runner core names no task: no arrow from it to a task plug-in, the dataset writers or what stands above it.
ABOVE_THE_ENGINE = ('nalaformer.classification', 'nalaformer.sr', 'nalaformer.dense', 'nalaformer.datasets',
                    'nalaformer.analysis', 'nalaformer.deployment', 'nalaformer.dense_demo')


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + '.')


def libraries(path: Path) -> Set[str]:
    """The top-level names of what ``path`` imports from outside the package (stdlib included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split('.')[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add((node.module or '').split('.')[0])
    return names - {'nalaformer'}


@pytest.mark.parametrize('package, allowed, heavy', LAYERS, ids=[layer[0] for layer in LAYERS])
def test_the_ground_floor_stands_on_nothing_above_it(package, allowed, heavy):
    graph, modules = import_graph()[0], package_modules()
    members = [name for name in graph if in_package(name, package)]
    assert members, package  # the layer exists
    for name in members:
        above = {target for target in graph[name] if not any(in_package(target, a) for a in allowed)}
        assert not above, f'{name} imports {sorted(above)}'
        assert not libraries(modules[name]) & heavy, f'{name} imports {sorted(libraries(modules[name]) & heavy)}'


def test_the_engine_names_no_task():
    graph, _ = import_graph()
    engine = [name for name in graph if in_package(name, 'nalaformer.engine')]
    assert 'nalaformer.engine.launch' in engine
    arrows = {(name, target) for name in engine for target in graph[name]
              if any(in_package(target, task) for task in ABOVE_THE_ENGINE)}
    assert not arrows


def test_a_converter_shows_its_help_without_torch(tmp_path):
    """``bicubic_downsample.py --help`` as a user runs it (``-X importtime`` lists every module the process imports)."""
    tool = ROOT / 'tools' / 'dataset_converters' / 'bicubic_downsample.py'
    result = subprocess.run([sys.executable, '-X', 'importtime', str(tool), '--help'], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0 and 'HR_DIR' in result.stdout, result.stderr[-2000:]
    imported = {line.rsplit('|', 1)[-1].strip().split('.')[0] for line in result.stderr.splitlines()
                if line.startswith('import time:')}
    assert 'argparse' in imported and not imported & HEAVY, sorted(imported & HEAVY)
