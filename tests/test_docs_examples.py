"""Every example of README.md and docs/*.md runs as written, so a doc that drifts fails here.

For each markdown file, its ```sh / ```bash / ```console and ```python blocks run in order in
one fresh temporary folder (the folder a reader works in, with ``docs/examples`` copied in),
with the worktree's ``.venv/bin`` on PATH (so ``cka-atlas`` and ``python`` are this
checkout's), ``CKA_DATA_DIR`` a fresh store, and — when the file talks to
``localhost:8000`` — a live ``cka-atlas serve`` on a free port over that same store, the
examples' ``localhost:8000`` rewritten to it. Shell blocks run under ``bash -euo pipefail``
(a ``console`` block's ``$ `` prompts are stripped, and the output it shows under them must be
what its commands print, both streams in order, with ``mktemp -d``'s folder written
``/tmp/tmp.XXXX``), Python blocks with this interpreter.
``cka-atlas`` commands and Python blocks run in children forked from one interpreter that has
already imported the CLI and the libraries (:mod:`tests.preloaded`): the same code, arguments,
folder and environment as a fresh process, without its seconds of imports.

A block that must not run here (``make run``, ``docker compose``, hour-long studies, a GPU)
is preceded in the markdown by ``<!-- skip: reason -->``; the test reports each skipped
block with its reason, and fails on a skip marker without a reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.preloaded import Preloaded
from tests.servers import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "console", "shell"}
PYTHON = {"python", "py"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*$")
SKIP = re.compile(r"<!--\s*skip(?::\s*(?P<reason>.*?))?\s*-->")
BLOCK_TIMEOUT_S = 600
DOC_URL = re.compile(r"(?:localhost|127\.0\.0\.1):8000")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it starts, its language, its code, why it is skipped."""

    line: int
    lang: str
    code: str
    skip: str | None


def blocks(text: str) -> list[Block]:
    """The shell and Python blocks of a markdown text, in order, with their skip reasons."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    pending: str | None = None
    while i < len(lines):
        marker = SKIP.search(lines[i])
        if marker:
            reason = (marker.group("reason") or "").strip()
            if not reason:
                raise AssertionError(f"line {i + 1}: a skip marker needs a reason")
            pending = reason
            i += 1
            continue
        fence = FENCE.match(lines[i])
        if not fence:
            if lines[i].strip():
                pending = None  # a skip marker covers the next block only when nothing is between
            i += 1
            continue
        start, lang, indent = i + 1, fence.group("lang").lower(), len(fence.group("indent"))
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:])
            i += 1
        i += 1
        if lang in SHELL or lang in PYTHON:
            found.append(Block(start, lang, "\n".join(body) + "\n", pending))
        pending = None
    return found


def _console(code: str) -> str:
    """A console block's commands: the ``$ `` lines (and their continuations), not the output."""
    if not any(line.startswith("$ ") for line in code.splitlines()):
        return code
    out: list[str] = []
    continued = False
    for line in code.splitlines():
        if line.startswith("$ "):
            out.append(line[2:])
        elif continued:
            out.append(line)
        continued = bool(out) and out[-1].endswith("\\") and (line.startswith("$ ") or continued)
    return "\n".join(out) + "\n"


def _console_output(code: str) -> str:
    """A console block's shown output: every line that is not a command or its continuation
    (none where the block has no ``$ `` prompt: then it is all commands)."""
    if not any(line.startswith("$ ") for line in code.splitlines()):
        return ""
    shown, continued = [], False
    for line in code.splitlines():
        if line.startswith("$ ") or continued:
            continued = line.endswith("\\")
        else:
            shown.append(line)
    return "\n".join(shown)


# A folder ``mktemp -d`` made, as the docs write it.
TEMP_DIR = re.compile(r"/tmp/tmp\.\w+")


class LiveServer:
    """``cka-atlas serve`` over the example's store, on a free loopback port."""

    def __init__(self, data_dir: Path, env: dict[str, str], log: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        port = self.url.rsplit(":", 1)[1]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", port],
                cwd=data_dir.parent,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_ready(self.url, self.proc, log, BLOCK_TIMEOUT_S)
        except BaseException:  # it exited, or never became ready (pytest.fail)
            self.stop()
            raise

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _environment(work: Path, first: Path | None = None) -> dict[str, str]:
    """The examples' environment; ``first``: a folder put before the venv on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKA_")}
    path = [str(first)] if first is not None else []
    path += [str(Path(sys.executable).parent), env.get("PATH", "")]
    env.update(
        PATH=os.pathsep.join(path),
        CKA_DATA_DIR=str(work / "var"),
        CKA_DEVICE="cpu",
        CKA_POLL_S="0.2",
        CKA_HEARTBEAT_S="0.5",
        CKA_LOG_LEVEL="warning",
        OMP_NUM_THREADS="1",  # torch threads fighting over busy cores slow it many times over
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
    )
    return env


@pytest.fixture(scope="session")
def preloaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Preloaded]:
    """One interpreter that has imported the CLI and the libraries, forking a child for each
    ``cka-atlas`` command and Python block (:mod:`tests.preloaded`): the examples run the same
    code with the same arguments, folder and environment, without importing torch, timm and
    torchvision anew dozens of times."""
    folder = tmp_path_factory.mktemp("preloaded")
    with Preloaded(folder, _environment(folder)) as server:
        server.shim("cka-atlas")
        server.shim("python-preloaded", mode="python")
        yield server


def _run(
    block: Block, work: Path, env: dict[str, str], url: str | None, python: Path | str
) -> None:
    code = block.code
    if url is not None:
        code = DOC_URL.sub(url.removeprefix("http://"), code)
    if block.lang in PYTHON:
        argv = [str(python), "-c", code]
    else:
        script = _console(code) if block.lang == "console" else code
        # a console block shows what its commands print, both streams in order
        merged = "exec 2>&1\n" if block.lang == "console" else ""
        argv = ["bash", "-euo", "pipefail", "-c", merged + script]
    done = subprocess.run(
        argv, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    if done.returncode != 0:
        pytest.fail(
            f"the {block.lang} block at line {block.line} exited with {done.returncode}:\n"
            f"{code}\n--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
        )
    if block.lang == "console" and (shown := _console_output(code).strip()):
        printed = TEMP_DIR.sub("/tmp/tmp.XXXX", done.stdout).strip()
        assert printed == shown, (
            f"the console block at line {block.line} shows other output than its commands "
            f"print:\n--- shown ---\n{shown}\n--- printed ---\n{printed}"
        )


def test_block_parser_reads_fences_skips_and_console_prompts() -> None:
    text = (
        "intro\n<!-- skip: needs a GPU -->\n```sh\nnvidia-smi\n```\n\n"
        "```python\nprint(1)\n```\n```json\n{}\n```\n"
        "<!-- skip: long -->\nsome words\n```bash\necho ok\n```\n"
        "```console\n$ echo a \\\n  b\na b\n$ true\n```\n"
    )
    found = blocks(text)
    assert [(b.lang, b.skip) for b in found] == [
        ("sh", "needs a GPU"),
        ("python", None),
        ("bash", None),
        ("console", None),
    ]
    assert found[0].line == 3 and found[1].code == "print(1)\n"
    assert _console(found[3].code) == "echo a \\\n  b\ntrue\n"
    assert _console_output("$ echo a \\\n  b\na b\n$ true\n") == "a b"
    with pytest.raises(AssertionError, match="needs a reason"):
        blocks("<!-- skip -->\n```sh\ntrue\n```\n")


@pytest.mark.slow
@pytest.mark.timeout(BLOCK_TIMEOUT_S * 2)
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_examples_run_as_written(
    doc: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], preloaded: Preloaded
) -> None:
    found = blocks(doc.read_text(encoding="utf-8"))
    runnable = [b for b in found if b.skip is None]
    with capsys.disabled():
        for b in found:
            if b.skip is not None:
                print(f"\n{doc.name}:{b.line}: {b.lang} block skipped ({b.skip})", end="")
    if not runnable:
        return
    work = tmp_path / "work"
    work.mkdir()
    if (ROOT / "docs" / "examples").is_dir():
        shutil.copytree(ROOT / "docs" / "examples", work / "docs" / "examples")
    env = _environment(work, first=preloaded.bin)
    server = None
    if any(DOC_URL.search(b.code) for b in runnable):
        server = LiveServer(work / "var", env, tmp_path / "server.log")
    try:
        for b in runnable:
            _run(b, work, env, server.url if server else None, preloaded.bin / "python-preloaded")
    finally:
        if server is not None:
            server.stop()
