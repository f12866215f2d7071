"""Every fenced shell command of README.md, docs/*.md and configs/*/README.md, checked against the repository; every
relative link resolved.

A fenced block counts when its language is bash, sh, shell or none. Each command line (``\\`` continuations joined,
``# comments`` dropped, ``&&``, ``||``, ``;`` and ``|`` separating commands, ``NAME=value`` lines defining ``$NAME``
for the rest of the block) that runs ``python3``, ``bash`` or a script under tools/ or scripts/ is checked:

* ``python3``, never ``python`` (setup installs into python3);
* the script (or ``-m`` module) exists;
* every ``--flag`` is one its parser takes, read off the script's ``--help`` (run here, as the short commands of the
  docs); the launchers' positional arguments come from their usage line, and the options they forward are
  checked against tools/train.py's or tools/test.py's ``--help``;
* ``--cfg-options key=value`` keys exist in the named config, checked as tools/train.py checks them
  (``nalaformer.engine.launch.check_cfg_options``; a placeholder value is not type-checked);
* every path it reads exists, or an earlier line of the page writes it (in its block or an earlier one; a
  training line writes its work dir, ``work_dirs/<config name>`` unless ``--work-dir`` or the launcher's WORK_DIR
  says otherwise; ``--out*``, ``--work-dir``, ``--show-dir`` and positionals named out/dst/... are written), or is
  a placeholder (an UPPER-CASE
  word such as CONFIG, CKPT, work_dirs/RUN/..., epoch_N; ``<...>``, ``...``, ``$VAR``, ``[optional]``). A path under
  work_dirs/ must always come from an earlier line of the page (or be a placeholder), and every training line of
  the same config before it must write that work dir (one node or Slurm: either one works).

Conventions in the Markdown: an HTML comment on a line right above the fence.

* ``<!-- needs: gpu, imagenet -->``: the block needs what CI does not have (the words of NEEDS). Paths outside the
  repository's own folders (data/, checkpoints/, your own files) then need not exist; scripts, configs, flags and
  keys are still checked. Commands running tools/dist_*.sh need ``gpu``, tools/slurm_*.sh ``slurm``.
* ``<!-- runs-in-ci -->``: the block is cheap and is run here as written, in a scratch folder holding links to
  configs/, tools/ and scripts/ (what it writes stays there).
"""
import argparse
import functools
import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md')), *sorted((ROOT / 'configs').glob('*/README.md'))]
NEEDS = {
    'gpu': 'a CUDA GPU (or several)', 'slurm': 'a Slurm cluster', 'imagenet': 'ImageNet-1K', 'ade20k': 'ADE20K',
    'cityscapes': 'Cityscapes', 'coco': 'COCO 2017', 'div2k': 'DIV2K', 'sr-benchmarks': 'Set5, Set14, B100, Urban100, '
    'Manga109', 'checkpoint': 'a trained checkpoint of yours', 'release': "the authors' release files",
    'your-data': 'your own images or dataset', 'hours': 'hours of CPU time', 'network': 'downloads'}
LAUNCHER_NEEDS = {'dist_train.sh': 'gpu', 'dist_test.sh': 'gpu', 'slurm_train.sh': 'slurm', 'slurm_test.sh': 'slurm',
                  'gpu_acceptance.sh': 'gpu'}
SHELL_LANGUAGES = {'', 'bash', 'sh', 'shell'}
REPOSITORY_FOLDERS = {'configs', 'tools', 'scripts', 'docs', 'tests', 'nalaformer', 'kernels'}
TRAIN_TOOL = 'tools/train.py'
LAUNCHERS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'tools').glob('*.sh'))  # print usage, exit 2
# where the parser's options write: their values are outputs, not inputs
OUTPUT_OPTION = re.compile(r'^--(out|work-dir|show-dir|save)')
OUTPUT_POSITIONAL = re.compile(r'^(out|dst|dest|output|lr_root|work_dir|save)', re.IGNORECASE)
PATH_SUFFIXES = {'.py', '.pth', '.pt', '.safetensors', '.json', '.png', '.jpg', '.jpeg', '.onnx', '.txt', '.csv',
                 '.mat', '.tar', '.gz', '.zip', '.md', '.sh', '.yaml', '.yml'}
FENCE = re.compile(r'^\s*(`{3,}|~{3,})\s*([\w+-]*)\s*$')
MARK = re.compile(r'<!--\s*(runs-in-ci|needs:\s*(.*?))\s*-->')


# ------------------------------------------------------------------------------------------- reading the Markdown

@dataclass
class Block:
    file: str  # relative to the repository
    line: int  # of the opening fence
    lines: List[Tuple[int, str]]
    needs: Set[str]
    runs_in_ci: bool
    language: str


@dataclass
class Command:
    block: Block
    line: int
    text: str  # continuations joined
    words: List[str]  # variables of the block expanded, env assignments removed

    @property
    def where(self) -> str:
        return f'{self.block.file}:{self.line}'


def closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes a block opened by ``fence`` (the same characters, at least as many, nothing else)."""
    return line.strip().startswith(fence) and not line.strip().strip(fence[0])


def outside_fences(lines: List[str]) -> List[Tuple[int, str]]:
    """(number, line) of the lines that are not inside a fenced block."""
    kept, fence = [], None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and closes(line, fence):
            fence = None
        elif fence is None:
            kept.append((number, line))
    return kept


def fenced_blocks(path: Path) -> List[Block]:
    lines, blocks, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language = match.group(1), match.group(2).lower()
        end = i + 1
        while end < len(lines) and not closes(lines[end], fence):
            end += 1
        marks, k = [], i - 1
        while k >= 0 and lines[k].strip().startswith('<!--'):
            marks += MARK.findall(lines[k])
            k -= 1
        needs = {word.strip() for mark, words in marks if mark.startswith('needs') for word in words.split(',')}
        if language in SHELL_LANGUAGES:
            blocks.append(Block(str(path.relative_to(ROOT)), i + 1, [(n + 1, lines[n]) for n in range(i + 1, end)],
                                needs - {''}, any(mark == 'runs-in-ci' for mark, _ in marks), language))
        i = end + 1
    return blocks


def command_lines(block: Block) -> List[Tuple[int, str]]:
    """(first line number, text) of each command line, ``\\`` continuations joined."""
    joined, pending, start = [], '', None
    for number, text in block.lines:
        start = number if start is None else start
        if text.rstrip().endswith('\\'):
            pending += text.rstrip()[:-1] + ' '
            continue
        joined.append((start, pending + text))
        pending, start = '', None
    return joined


def split_words(text: str) -> List[str]:
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = '#'
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: not a shell command (a table, some output)
        return []


def expand(word: str, variables: Dict[str, str]) -> str:
    return re.sub(r'\$\{?(\w+)\}?', lambda m: variables.get(m.group(1), m.group(0)), word)


def commands(block: Block) -> List[Command]:
    found, variables = [], {}
    for line, text in command_lines(block):
        words = split_words(text)
        while words:
            cut = next((i for i, w in enumerate(words) if w in ('&&', '||', ';', '|')), len(words))
            part, words = words[:cut], words[cut + 1:]
            n = 0
            while n < len(part) and re.match(r'^[A-Za-z_]\w*=', part[n]):  # NAME=value before the program
                n += 1
            if n == len(part):  # only NAME=value: a variable for the rest of the block
                variables.update(word.split('=', 1) for word in part)
                continue
            found.append(Command(block, line, text, [expand(word, variables) for word in part[n:]]))
    return found


ALL_BLOCKS = [block for path in DOCS for block in fenced_blocks(path)]
ALL_COMMANDS = [command for block in ALL_BLOCKS for command in commands(block)]


# ---------------------------------------------------------------------------------------------- what a command runs

@dataclass
class Invocation:
    kind: str  # 'python', 'bash', 'module'
    target: str  # script path or module
    args: List[str]


def invocation(words: List[str], shell: bool = True) -> Optional[Invocation]:
    """What a command runs; a script named without an interpreter only in a block marked as shell (``shell``): in
    a block without a language, a line such as ``tools/test.py`` is a name, not a command."""
    program, args = words[0], words[1:]
    if program in ('python', 'python3'):
        if not args or args[0] == '-c':
            return None
        if args[0] == '-m':
            return Invocation('module', args[1], args[2:]) if len(args) > 1 else None
        return Invocation('python', args[0], args[1:])
    if program in ('bash', 'sh') and args:
        return Invocation('bash', args[0], args[1:])
    if shell and program.startswith(('tools/', 'scripts/', './')) and program.endswith(('.py', '.sh')):
        return Invocation('bash' if program.endswith('.sh') else 'python', program, args)
    return None


def script_path(target: str) -> str:
    """A script as the repository names it (``./tools/x.sh`` -> ``tools/x.sh``); ``$(...)`` evaluated by bash."""
    if '$(' in target:
        target = subprocess.run(['bash', '-c', f'printf "%s" "{target}"'], capture_output=True, text=True,
                                cwd=ROOT, timeout=120).stdout
    return os.path.normpath(target) if not os.path.isabs(target) else target


def is_placeholder(word: str) -> bool:
    if any(mark in word for mark in ('$', '<', '>', '...', '[', ']', '{', '}', '*')):
        return True
    return any(re.fullmatch(r'[A-Z][A-Z0-9_]*', part) for part in re.split(r'[^A-Za-z0-9_]+|_', word) if part)


def is_path(word: str) -> bool:
    word = word.strip('[]')
    if '://' in word or '(' in word or '=' in word:
        return False
    return '/' in word or os.path.splitext(word)[1].lower() in PATH_SUFFIXES


def is_option(word: str) -> bool:
    word = word.lstrip('[')
    return word.startswith('-') and len(word) > 1 and not re.match(r'-\.?\d', word)


# ------------------------------------------------------------------------------------------ parsers, from --help

@dataclass
class Parser:
    options: Dict[str, object] = field(default_factory=dict)  # option string -> nargs (0, n, '?', '+', '*')
    positionals: List[Tuple[str, bool]] = field(default_factory=list)  # (name, optional)
    subcommands: List[str] = field(default_factory=list)
    forwards_to: Optional[str] = None  # a launcher: the tool its options go to


def nargs_of(rest: str):
    rest = rest.strip()
    if not rest:
        return 0
    if '...' in rest:
        return '*' if rest.startswith('[') else '+'
    if rest.startswith('['):
        return '?'
    return len(rest.split())


def parse_help(text: str) -> Parser:
    """The options and positionals of argparse's ``--help`` output."""
    parser, section = Parser(), None
    for line in text.splitlines():
        header = re.fullmatch(r'(\S.*):', line.rstrip())
        if header:
            if header.group(1).lower() in ('positional arguments', 'options', 'optional arguments') or section:
                section = header.group(1).lower()
            continue
        entry = re.match(r'^  (\S.*?)(?:\s{2,}|$)', line)
        if section is None or not entry:
            continue
        entry = entry.group(1)
        if entry.startswith('-'):
            for form in entry.split(', '):
                name, _, rest = form.partition(' ')
                parser.options[name] = nargs_of(rest)
        elif section == 'positional arguments':
            if entry.startswith('{'):
                parser.subcommands = entry.strip('{}').split(',')
            else:
                parser.positionals.append((entry, False))
    return parser


def parse_launcher_usage(text: str) -> Parser:
    """``usage: [GPUS=8] $0 PARTITION JOB_NAME CONFIG [WORK_DIR] [tools/train.py options]``."""
    words = text.split('usage:', 1)[1].split('\n')[0].split()
    words = words[next(i for i, w in enumerate(words) if w.endswith('.sh')) + 1:]
    parser = Parser()
    for word in words:
        tool = re.search(r'tools/\w+\.py', word)
        if tool:
            parser.forwards_to = tool.group(0)
        elif re.fullmatch(r'\[?[A-Z_]+\]?', word):
            parser.positionals.append((word.strip('[]'), word.startswith('[')))
    return parser


HELP_RUNNER = r'''
import contextlib, io, json, re, runpy, sys
results = {}
def run(script, args):
    out, err, code = io.StringIO(), io.StringIO(), None
    saved = sys.argv
    sys.argv = [script, *args, '--help']
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(script, run_name='__main__')
    except SystemExit as e:
        code = e.code
    except BaseException as e:
        code = f'{type(e).__name__}: {e}'
    finally:
        sys.argv = saved
    results[' '.join([script, *args])] = {'code': code, 'out': out.getvalue(), 'err': err.getvalue()[-3000:]}
    return out.getvalue()
for script in json.loads(sys.argv[1]):
    text = run(script, [])
    choices = re.search(r'^positional arguments:\n  \{([\w,-]+)\}', text, re.M)
    for sub in (choices.group(1).split(',') if choices else []):
        run(script, [sub])
with open(sys.argv[2], 'w') as f:
    json.dump(results, f)
'''


def documented_scripts() -> List[str]:
    """The Python scripts of the repository that the commands run."""
    scripts = set()
    for command in ALL_COMMANDS:
        called = invocation(command.words, bool(command.block.language))
        if called is None or called.kind == 'module' or is_placeholder(called.target) or '$(' in called.target:
            continue
        path = script_path(called.target)
        if path.endswith('.py') and (ROOT / path).is_file():
            scripts.add(path)
    return sorted(scripts)


PYTHON_SCRIPTS = documented_scripts()


@functools.lru_cache(maxsize=None)
def help_outputs() -> Dict[str, dict]:
    """``SCRIPT [SUBCOMMAND] --help`` of every documented Python script, run in one process from the repository
    root (each script as ``python3 SCRIPT`` runs it, as ``__main__``)."""
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / 'help.json'
        env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
        run = subprocess.run([sys.executable, '-c', HELP_RUNNER, json.dumps(PYTHON_SCRIPTS), str(result_file)],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        assert run.returncode == 0 and result_file.exists(), run.stdout[-2000:] + run.stderr[-4000:]
        return json.loads(result_file.read_text())


@functools.lru_cache(maxsize=None)
def launcher_usage(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', script], capture_output=True, text=True, cwd=ROOT, timeout=60)


def parser_of(script: str, subcommand: Optional[str] = None) -> Parser:
    """A Python script's parser (from its --help); a launcher's usage (tools/*.sh, run without arguments); no
    arguments known for other shell scripts (setup, the GPU acceptance run: never run here)."""
    if script.endswith('.sh'):
        return parse_launcher_usage(launcher_usage(script).stderr) if script in LAUNCHERS else Parser()
    key = ' '.join([script] + ([subcommand] if subcommand else []))
    return parse_help(help_outputs()[key]['out'])


# ------------------------------------------------------------------------------------------ one command, checked

@dataclass
class Reading:
    """What a command reads and writes, its unknown flags and its --cfg-options."""
    reads: List[str] = field(default_factory=list)
    writes: List[str] = field(default_factory=list)
    unknown: List[str] = field(default_factory=list)
    cfg_options: List[str] = field(default_factory=list)
    config: Optional[str] = None
    work_dir: Optional[str] = None  # --work-dir, or a launcher's WORK_DIR
    trains_into: Optional[str] = None  # the work dir of a training command


def take_values(words: List[str], i: int, nargs) -> Tuple[List[str], int]:
    """The values of the option at ``words[i - 1]``: (values, index after them)."""
    if nargs == 0:
        return [], i
    if nargs == '?':
        return (words[i:i + 1], i + 1) if i < len(words) and not is_option(words[i]) else ([], i)
    if nargs in ('+', '*'):
        end = i
        while end < len(words) and not is_option(words[end]):
            end += 1
        return words[i:end], end
    return words[i:i + nargs], i + nargs


def read_arguments(words: List[str], parser: Parser, reading: Reading, positionals=None) -> None:
    positionals = list(parser.positionals if positionals is None else positionals)
    i = 0
    while i < len(words):
        word = words[i]
        if is_option(word):
            name, _, inline = word.lstrip('[').rstrip(']').partition('=')
            nargs = parser.options.get(name)
            if nargs is None:
                reading.unknown.append(name)
                nargs = '*'
            values, i = ([inline], i + 1) if inline else take_values(words, i + 1, nargs)
            if name == '--cfg-options':
                reading.cfg_options += values
            elif name == '--config' and values:
                reading.config = values[0]
            elif name == '--work-dir' and values:
                reading.work_dir = values[0]
            (reading.writes if OUTPUT_OPTION.match(name) else reading.reads).extend(v for v in values if is_path(v))
            continue
        name = positionals.pop(0)[0] if positionals else 'extra'
        if name.lower() == 'config':
            reading.config = word
        if OUTPUT_POSITIONAL.match(name):
            reading.writes.append(word)
        elif is_path(word):
            reading.reads.append(word)
        i += 1


def read_command(called: Invocation) -> Reading:
    script, reading = script_path(called.target), Reading()
    parser = parser_of(script) if (ROOT / script).is_file() else Parser()
    if script.endswith('.sh'):
        if parser.forwards_to is None:  # a script without documented arguments (setup, GPU acceptance)
            return reading
        args = list(called.args)
        for name, optional in parser.positionals:  # an optional one only when the next word is not an option
            if not args or optional and is_option(args[0]):
                continue
            word = args.pop(0)
            if name == 'CONFIG':
                reading.config = word
            if name == 'WORK_DIR':
                reading.work_dir = word
                reading.writes.append(word)
            elif name in ('CONFIG', 'CHECKPOINT'):
                reading.reads.append(word)
        read_arguments(args, parser_of(parser.forwards_to), reading, positionals=[])
        script = parser.forwards_to
    else:
        subcommand = called.args[0] if called.args and called.args[0] in parser.subcommands else None
        read_arguments(called.args[1:] if subcommand else called.args, parser_of(script, subcommand) if subcommand
                       else parser, reading)
    if script == TRAIN_TOOL and reading.config:
        reading.trains_into = reading.work_dir or default_work_dir(reading.config)
    return reading


def default_work_dir(config: str) -> str:
    """Where tools/train.py (and the launchers) write a run of ``config`` without --work-dir."""
    return f'work_dirs/{Path(config).stem}'


def under(path: str, folder: str) -> bool:
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder + os.sep)


@dataclass
class Written:
    path: str
    line: int
    config: Optional[str] = None  # a training line's config


def earlier_writes(command: Command) -> List[Written]:
    """What the lines before the command write: its block's, and those of the earlier blocks of its document
    (a page that trains in one block and converts or tests in the next)."""
    written = []
    for earlier in ALL_COMMANDS:
        if earlier.block.file != command.block.file or earlier.line >= command.line:
            continue
        called = invocation(earlier.words, bool(earlier.block.language))
        if called is None or called.kind == 'module' or is_placeholder(called.target):
            continue
        script = script_path(called.target)
        if not (ROOT / script).is_file():
            continue
        reading = read_command(called)
        written += [Written(w, earlier.line) for w in reading.writes]
        if reading.trains_into:
            written.append(Written(reading.trains_into, earlier.line, reading.config))
    return written


def concrete_part(path: str) -> str:
    """The folders of ``path`` before its first placeholder (all of it when it has none; '' when it starts with one):
    in work_dirs/nala-t/best_epoch_N.pth the work dir is meant as written."""
    parts = path.split('/')
    first = next((i for i, part in enumerate(parts) if is_placeholder(part)), len(parts))
    return '/'.join(parts[:first])


def path_problem(path: str, command: Command, written: List[Written], config: Optional[str]) -> Optional[str]:
    """Why the command may not read ``path`` (or the folders of it before a placeholder); None when it may."""
    path = concrete_part(path)
    if not path or path in ('work_dirs', '/'):
        return None
    if under(path, 'work_dirs'):
        if not any(under(path, w.path) for w in written):
            return (f'reads {path}, but no earlier line of the page writes that work dir: train into it first '
                    f'(tools/train.py writes work_dirs/<config name>) or write a placeholder (work_dirs/RUN/...)')
        same_config = [w for w in written if w.config is not None and config is not None
                       and os.path.normpath(w.config) == os.path.normpath(config)]
        elsewhere = [w for w in same_config if not under(path, w.path)]
        if elsewhere:
            return (f'reads {path}, but line {elsewhere[0].line} trains {config} into {elsewhere[0].path}: every '
                    f'training line of the page must write the work dir the later lines read')
        return None
    in_repository = not os.path.isabs(path) and Path(path).parts[0] in REPOSITORY_FOLDERS
    if in_repository and (ROOT / path).exists() or any(under(path, w.path) or under(w.path, path) for w in written):
        return None  # (data/, work_dirs/, checkpoints/ here do not count: CI has none)
    if command.block.needs and not in_repository:
        return None  # data, checkpoints or your files, which the block says it needs
    return (f'reads {path}, which does not exist, no earlier line of the page writes, and is no placeholder; '
            f'mark the block <!-- needs: ... --> if it needs data CI lacks')


@functools.lru_cache(maxsize=None)
def load_config(path: str):
    from mmengine.config import Config
    return Config.fromfile(str(ROOT / path))


def cfg_options_problem(config: str, pairs: List[str]) -> Optional[str]:
    from mmengine.config import DictAction

    from nalaformer.engine.launch import check_cfg_options
    from nalaformer.errors import ConfigError
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    options = vars(parser.parse_args(['--cfg-options', *pairs]))['cfg_options']
    options = {key: None if is_placeholder(pair.split('=', 1)[1]) else options[key]
               for pair in pairs for key in [pair.split('=', 1)[0]]}
    try:
        check_cfg_options(load_config(config), options)
    except ConfigError as e:
        return str(e)
    return None


def problems_of(command: Command) -> List[str]:
    problems = []
    if re.search(r'(?<![\w./-])python(?=\s|$)', command.text):
        problems.append('runs `python`: write `python3` (setup installs into python3)')
    block = command.block
    unknown = block.needs - set(NEEDS)
    if unknown:
        problems.append(f'<!-- needs: --> words {sorted(unknown)} are not among {sorted(NEEDS)}')
    called = invocation(command.words, bool(command.block.language))
    if command.words[0] == 'pytest':
        problems.append('runs `pytest`: write `python3 -m pytest` (the pytest of the python3 setup installs into)')
    if called is None:
        return problems
    if called.kind == 'module':
        if not module_exists(called.target.split('.')[0]) or (
                '.' in called.target and importlib.util.find_spec(called.target) is None):
            problems.append(f'python3 -m {called.target}: no such module')
        return problems
    if is_placeholder(called.target) and '$(' not in called.target:
        return problems
    script = script_path(called.target)
    if not (os.path.isabs(script) and Path(script).is_file() or (ROOT / script).is_file()):
        return problems + [f'runs {called.target}, which does not exist']
    if os.path.isabs(script):  # a script outside the repository (an installed package's): exists, not parsed
        return problems
    needed = LAUNCHER_NEEDS.get(Path(script).name)
    if needed and needed not in block.needs:
        problems.append(f'runs {script}: mark the block <!-- needs: {needed} -->')
    if script.endswith('.sh') and parser_of(script).forwards_to is None:
        return problems
    reading = read_command(called)
    problems += [f'{script} takes no option {name}' for name in reading.unknown]
    written = earlier_writes(command)
    problems += [p for p in (path_problem(path, command, written, reading.config) for path in reading.reads) if p]
    if reading.cfg_options:
        if reading.config is None or is_placeholder(reading.config):
            pass  # a template: CONFIG [--cfg-options k=v ...]
        elif (ROOT / reading.config).is_file():
            problem = cfg_options_problem(reading.config, reading.cfg_options)
            if problem:
                problems.append(problem)
    return problems


def is_command(command: Command) -> bool:
    """A line that runs something this test knows, or names python: not a line of output or a folder tree."""
    return (invocation(command.words, bool(command.block.language)) is not None
            or re.search(r'(?<![\w./-])(python3?|pytest)(?=\s|$)', command.text) is not None)


def command_ids(found: List[Command]) -> List[str]:
    """file:line, and file:line#k for the k-th of several commands on one line."""
    ids = []
    for i, command in enumerate(found):
        same = [c for c in found[:i] if c.where == command.where]
        ids.append(command.where + (f'#{len(same) + 1}' if same else ''))
    return ids


CHECKED_COMMANDS = [c for c in ALL_COMMANDS if is_command(c)]


def module_exists(name: str) -> bool:
    """Whether the top-level module ``name`` can be imported, looked up on sys.path first: ``importlib.util.find_spec``
    of 'pip' runs setuptools' distutils hack (its finder on sys.meta_path), which then hands out the standard
    library's distutils for the rest of the process, and inductor's compiler, importing setuptools after it, fails
    on its assertion (a compile test on the same pytest worker)."""
    return (importlib.machinery.PathFinder.find_spec(name) is not None
            or importlib.util.find_spec(name) is not None)


@pytest.mark.xdist_group('docs_commands')
@pytest.mark.parametrize('command', CHECKED_COMMANDS, ids=command_ids(CHECKED_COMMANDS))
def test_documented_command(command):
    problems = problems_of(command)
    assert not problems, f'{command.where}: {command.text.strip()}\n  ' + '\n  '.join(problems)


def test_the_docs_have_commands():
    """The extraction itself: every document is read and the usual commands are found."""
    files = {c.block.file for c in ALL_COMMANDS}
    assert {'README.md', 'docs/data.md', 'configs/nalaformer/README.md'} <= files
    assert sum(1 for c in ALL_COMMANDS if invocation(c.words, bool(c.block.language)) is not None) > 80
    assert any(block.needs for block in ALL_BLOCKS) and any(block.runs_in_ci for block in ALL_BLOCKS)


# ---------------------------------------------------------------------------------- the short ones, run as written

@pytest.mark.xdist_group('docs_commands')
@pytest.mark.parametrize('script', PYTHON_SCRIPTS)
def test_help_runs(script):
    runs = {key: value for key, value in help_outputs().items() if key.split(' ')[0] == script}
    for key, result in runs.items():
        assert result['code'] == 0 and result['out'].startswith('usage:'), f'{key} --help: {result}'


@pytest.mark.parametrize('script', LAUNCHERS)
def test_launcher_prints_its_usage(script):
    result = launcher_usage(script)
    assert result.returncode == 2 and result.stderr.startswith('usage:'), result
    parser = parse_launcher_usage(result.stderr)
    assert parser.positionals and parser.forwards_to in ('tools/train.py', 'tools/test.py')


CHEAP_BLOCKS = [block for block in ALL_BLOCKS if block.runs_in_ci]


@pytest.mark.slow  # seconds each, on real data setup installs
@pytest.mark.parametrize('block', CHEAP_BLOCKS, ids=[f'{b.file}:{b.line}' for b in CHEAP_BLOCKS])
def test_cheap_block_runs_as_written(block, tmp_path):
    for folder in ('configs', 'tools', 'scripts'):
        (tmp_path / folder).symlink_to(ROOT / folder)
    script = '\n'.join(text for _, text in block.lines)
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    result = subprocess.run(['bash', '-euo', 'pipefail', '-c', script], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, f'{block.file}:{block.line}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}'


# ------------------------------------------------------------------------------------------------------- links

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading.strip().lower())
    return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> Set[str]:
    found, seen = set(), {}
    for _, line in outside_fences(path.read_text().splitlines()):
        match = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
        if match:
            base = slug(match.group(1))
            found.add(base if base not in seen else f'{base}-{seen[base]}')
            seen[base] = seen.get(base, 0) + 1
    return found


def relative_links() -> List[Tuple[str, Path, str]]:
    links = []
    for path in DOCS:
        for number, line in outside_fences(path.read_text().splitlines()):
            line = re.sub(r'`[^`]*`', '', line)
            for target in re.findall(r'\]\(([^)\s]+)(?:\s+"[^"]*")?\)', line):
                if not re.match(r'^[a-z][a-z0-9+.-]*:', target):
                    links.append((f'{path.relative_to(ROOT)}:{number}', path, target))
    return links


LINKS = relative_links()


@pytest.mark.parametrize('where, path, target', LINKS, ids=[f'{w} {t}' for w, _, t in LINKS])
def test_relative_link_resolves(where, path, target):
    file, _, anchor = target.partition('#')
    linked = (path.parent / file).resolve() if file else path
    assert linked.exists(), f'{where}: the link {target} names {linked}, which does not exist'
    if anchor and linked.suffix == '.md':
        assert anchor in anchors(linked), f'{where}: {linked.name} has no heading with the anchor #{anchor}'
