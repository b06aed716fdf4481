"""The documents' code runs as written.

Every ```python block of README.md, docs/cli.md, docs/quantization.md and docs/architecture.md: the CPU ones run in
order, each written to a .py file and run by a fresh interpreter (GRAPH_MODE needs a file), in one temporary folder
per document (a later block uses what an earlier one wrote, as a reader following it would); the Ascend ones (they
call ``ms.set_device("Ascend")``) are compiled, and the ms_swiglu names they import must exist. Every command line
in the other blocks and in inline code (``ms-swiglu ...``, ``python -m ...``, ``python verify_on_device.py``,
``msrun ...``) uses only options that its ``--help`` lists, and docs/cli.md names every option of every command.
The README starts with the two-command block, stays short, and its links point to files.
"""
import ast
import functools
import importlib
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "docs/cli.md", "docs/quantization.md", "docs/architecture.md")
GENERATED = {"docs/performance.md"}  # written by the performance tool; a link to it may precede it
PYTHON = sys.executable
BIN = os.path.dirname(PYTHON)
FIRST_LINES = [
    "```",
    "make demo    # creates .venv, installs ms_swiglu (compiles its C++ kernel), runs a 7B-shaped packed MLP, "
    "exports MindIR",
    "make test    # same set-up, then the test suite",
    "```",
]
ASCEND = re.compile(r"""set_device\(\s*["']Ascend["']""")
OPTION = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
COMMANDS = ("run", "convert", "export", "bench")
# options a command takes that its --help does not list: the worker prints its own path for msrun's command line
UNLISTED = {"ms_swiglu.launch.worker": {"--path"}}


def _read(doc):
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


def _blocks(text):
    """[(language, code)] of the fenced blocks of a Markdown text."""
    blocks, lang, lines = [], None, []
    for line in text.splitlines():
        if lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line.strip() == "```":
            blocks.append((lang, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, "a fenced block is not closed"
    return blocks


def _python_blocks(doc):
    return [code for lang, code in _blocks(_read(doc)) if lang == "python"]


@pytest.mark.parametrize("doc", DOCS)
def test_the_cpu_snippets_run_as_written(doc, tmp_path):
    cpu = [code for code in _python_blocks(doc) if not ASCEND.search(code)]
    if doc == "README.md":
        assert len(cpu) >= 3, "the README's quick start lost its CPU snippets"
    for i, code in enumerate(cpu):
        path = tmp_path / f"snippet_{i}.py"
        path.write_text(code)
        proc = subprocess.run([PYTHON, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{doc}, python block {i} (exit {proc.returncode}):\n{code}\n{proc.stderr[-3000:]}"


def _imported_names(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ms_swiglu":
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ms_swiglu":
                    yield alias.name, []


@pytest.mark.parametrize("doc", DOCS)
def test_the_ascend_snippets_compile_and_their_names_exist(doc):
    for code in (c for c in _python_blocks(doc) if ASCEND.search(c)):
        tree = ast.parse(compile(code, doc, "exec", ast.PyCF_ONLY_AST))
        compile(tree, doc, "exec")
        for module, names in _imported_names(tree):
            mod = importlib.import_module(module)
            missing = [n for n in names if not hasattr(mod, n)]
            assert not missing, f"{doc}: {module} has no {missing}"
    if doc == "README.md":
        assert any(ASCEND.search(c) for c in _python_blocks(doc)), "the README's Ascend quick start is gone"


@functools.cache
def _help(kind, name):
    """The options a command's --help lists."""
    if kind == "ms-swiglu":
        cmd = [os.path.join(BIN, "ms-swiglu"), name, "--help"]
    elif kind == "module":
        cmd = [PYTHON, "-m", name, "--help"]
    else:
        cmd = [os.path.join(BIN, "msrun"), "--help"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    return frozenset(OPTION.findall(proc.stdout))


def _command_lines(text):
    """The command lines of a document: the lines of its non-Python blocks (continuations joined) and its inline
    code spans."""
    for lang, code in _blocks(text):
        if lang != "python":
            yield from code.replace("\\\n", " ").splitlines()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    yield from (span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose))


def _checks(line):
    """[(kind, name, the options the line gives it)] for each command the line runs."""
    line = line.split("#")[0]
    found = []
    for m in re.finditer(r"ms-swiglu\s+(run|convert|export|bench)\b([^|;]*)", line):
        found.append(("ms-swiglu", m.group(1), OPTION.findall(m.group(2))))
    for m in re.finditer(r"python\s+-m\s+([\w.]+)((?:\s+(?!\$\()[^\s)]+)*)", line):
        if m.group(1).startswith("ms_swiglu"):
            found.append(("module", m.group(1), OPTION.findall(m.group(2))))
    m = re.search(r"python\s+verify_on_device\.py(.*)", line)
    if m:
        found.append(("module", "ms_swiglu.export.verify_on_device", OPTION.findall(m.group(1))))
    if line.lstrip().startswith("msrun "):
        head, _, worker = line.partition("$(")
        found.append(("msrun", "msrun", OPTION.findall(head)))
        found.append(("module", "ms_swiglu.launch.worker", OPTION.findall(worker.partition(")")[2])))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_option_is_in_the_commands_help(doc):
    bad = []
    for line in _command_lines(_read(doc)):
        for kind, name, options in _checks(line):
            unknown = sorted(set(options) - _help(kind, name) - UNLISTED.get(name, set()) - {"--help"})
            if unknown:
                bad.append(f"{name}: {', '.join(unknown)} in {line.strip()!r}")
    assert not bad, f"{doc}: options no --help lists:\n" + "\n".join(bad)


def test_the_cli_document_names_every_option_of_every_command():
    text = _read("docs/cli.md")
    for command in COMMANDS:
        missing = sorted(o for o in _help("ms-swiglu", command) - {"--help"} if o not in text)
        assert not missing, f"docs/cli.md: ms-swiglu {command} {', '.join(missing)} not documented"


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    lines = _read("README.md").splitlines()
    assert lines[:4] == FIRST_LINES
    assert len(lines) <= 300, len(lines)


@pytest.mark.parametrize("doc", DOCS)
def test_links_point_to_files_and_the_text_speaks_of_the_product(doc):
    text = _read(doc)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
        assert os.path.exists(os.path.join(ROOT, path)) or path in GENERATED, f"{doc}: link to {target}: no file"
    for pattern in (r"\bsessions?\b", r"\bthis machine\b", r"\bhere\b", r"\bnot kept\b", r"\btried\b",
                    r"\breview", r"\bthis host\b"):
        assert not re.search(pattern, text, re.I), f"{doc}: {pattern!r} (the documents speak of the product)"
