"""The shell and Python blocks of README.md and the guide run as written, so the docs cannot rot.

Every block is listed in HOW: run, or not run with the reason (a tool this machine lacks, a
second machine). A block added to the docs and not listed here fails the test that reads them
all, and so does an entry whose block is gone.

The blocks of one page run in order in one working folder, as a reader would type them: a
`uma run` starts the daemon in the background (the shell function in SHELL_PRELUDE waits for
its `uma: serving` line, and stops the daemon a previous `uma run` left), later blocks and the
Python ones talk to it, and the page's last daemon is stopped at the end. What a reader has and
the test has not is substituted: any `*.gguf` path becomes the tiny synthetic model, the HTTP
ports free ones, key files one written here, a folder of models the test's own; the socket
is one of this test's own.

The README's install command runs in a fresh virtual environment (`pip install .` reuses the
build folder the first install made, as a user's second install does); its test command is the
one CI runs, and is checked to be there verbatim.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from uma import synth
from uma.testing import short_socket_path

from .helpers import fetched_or_skip, free_port

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
LANGUAGES = {"sh", "python"}
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # the fence's line, from 1
    language: str
    text: str

    @property
    def key(self) -> tuple[str, str]:
        return self.page, self.text.splitlines()[0].strip()


@dataclasses.dataclass(frozen=True)
class How:
    """How a block runs: `run` (in its page's session), `install` (a fresh environment), `ci`
    (CI runs it: checked to be in .ci/run) or `not run` with `why`; `files` are written into
    the working folder first, each from a TOML block of the page (its first line); `leave_out`
    names lines not run, and `why` says why; `model` is what a `*.gguf` path becomes;
    `continues`: a Python block that goes on from the page's Python blocks before it;
    `daemon`: a block that talks to the daemon an earlier block started (one run elsewhere):
    one is started for it first."""

    kind: str = "run"
    why: str = ""
    files: tuple[tuple[str, str], ...] = ()
    leave_out: tuple[str, ...] = ()
    model: str = "tiny"
    continues: bool = False
    daemon: bool = False


NOT_HERE = "needs {} (not on a test machine); the same flags are run in the blocks above"
HOW: dict[tuple[str, str], How] = {
    ("README.md", "pip install . && uma run smollm2"): How("install", model="smollm2"),
    ("README.md", "pip install '.[test]' && pytest"): How("ci"),
    ("README.md", 'uma generate -p "Once upon a time" --max-tokens 64   '
                  '# -p - reads the prompt from stdin'): How(daemon=True),
    ("README.md", "uma run ~/models/qwen2.5-coder-7b-instruct-q8_0.gguf --ctx 16384 "
                  "--parallel 8"): How(),
    ("README.md", "from uma import Client"): How(),
    ("README.md", "import uma"): How(),
    ("README.md", "uma run model.gguf --http 0.0.0.0:8080 --api-key-file ~/.uma-key  "
                  "# anyone who has the key"): How(),
    ("README.md", "from openai import OpenAI"): How(),
    ("docs/guide/configuration.md", "UMA_CTX=16384 UMA_PARALLEL=8 uma run model.gguf "
                                    "--max-tokens 2048"):
        How(files=(("uma.toml", "# uma.toml"),)),
    ("docs/guide/configuration.md", "uma service install ~/models/model.gguf -c "
                                    "~/.config/uma/uma.toml"):
        How("not run", why="installs a systemd user service; needs systemd"),
    ("docs/guide/connect-your-tools.md", "uma run ~/models/model.gguf --http 127.0.0.1:8080"):
        How(),
    ("docs/guide/connect-your-tools.md", "from openai import OpenAI"): How(),
    ("docs/guide/connect-your-tools.md", "export OPENAI_API_BASE=http://127.0.0.1:8080/v1"):
        How("not run", why=NOT_HERE.format("aider")),
    ("docs/guide/connect-your-tools.md", "docker run -d -p 3000:8080 --add-host="
                                         "host.docker.internal:host-gateway \\"):
        How("not run", why=NOT_HERE.format("Docker and Open WebUI")),
    ("docs/guide/developing.md", "pip install --no-build-isolation scikit-build-core cython pip"):
        How("not run", why="the editable install of a developer's checkout; the README's "
                           "install runs in a fresh environment above"),
    ("docs/guide/developing.md", "pytest                                  # the tests (the "
                                 "README's command installs them)"):
        How("not run", why="the checks CI runs (.ci/run); pytest inside pytest would recurse"),
    ("docs/guide/developing.md", "import numpy as np"): How(),
    ("docs/guide/http-api.md", "uma run model.gguf --http 0.0.0.0:8080 --api-key-file "
                               "~/.uma-key  # anyone who has the key"): How(),
    ("docs/guide/http-api.md", "from openai import OpenAI"): How(),
    ("docs/guide/http-api.md", "uma run smollm2 --http 127.0.0.1:11434    # Ollama's usual "
                               "port, if Ollama is not running"): How(model="smollm2"),
    ("docs/guide/http-api.md", "import ollama"): How(model="smollm2"),
    ("docs/guide/http-api.md", "curl -s 127.0.0.1:8080/load -d '{\"model\": \"gemma3-270m\"}'"
                               "     # {\"model\": ..., \"loaded\": true, \"load_ms\": ...}"):
        How("not run", why="needs a second model in the model directory (Gemma 3 270M, "
                           "fetched); tests/server/test_models_http.py loads and unloads one "
                           "through the same endpoints"),
    ("docs/guide/models.md", "uma run smollm2               # fetched on first use"):
        How(model="smollm2"),
    ("docs/guide/models.md", "uma model synth tiny          # 8.5M params, f32, Llama-2 "
                             "tokenizer (tests)"):
        How(leave_out=("uma model synth 1b", "uma model synth 8b", "uma model info 8b.gguf"),
            why="they write 2.5 and 8.5 GB"),
    ("docs/guide/models.md", "uma models                        # the model directory and "
                             "the fetched catalogue models"): How(),
    ("docs/guide/models.md", "uma run smollm2 --max-loaded 3 --keep-alive 600   # serves "
                             "smollm2; others load on demand"):
        How("not run", why="needs a second real model fetched (Gemma 3 270M, 253 MB); "
                           "tests/server/test_daemon_models.py runs the same commands (uma "
                           "generate -m, load, ps, unload) on a second model of a directory"),
    ("docs/guide/scaling-out.md", "uma rpc-worker --host 10.0.0.2 --port 50052     "
                                  "# a private address of that machine"):
        How("not run", why=NOT_HERE.format("a second machine")),
    ("docs/guide/scaling-out.md", "uma run model.gguf --rpc 10.0.0.2:50052,10.0.0.3:50052 "
                                  "--tensor-split 1,1,2"):
        How("not run", why=NOT_HERE.format("two more machines")),
    ("docs/guide/scaling-out.md", "uma rpc-worker --port 50052 &"): How(),
    ("docs/guide/scaling-out.md", "uma run model.gguf --http 0.0.0.0:8080 --api-key-file "
                                  "/etc/uma/key"): How(),
    ("docs/guide/scaling-out.md", "uma run --http 127.0.0.1:8081 --socket /tmp/uma-a.sock &"):
        How("not run", why=NOT_HERE.format("nginx")),
    ("docs/guide/structured-output-and-tools.md", "uma run model.gguf --http 127.0.0.1:8080"):
        How(),
    ("docs/guide/structured-output-and-tools.md", "from openai import OpenAI"): How(),
    ("docs/guide/structured-output-and-tools.md", "import json"): How(continues=True),
    ("docs/guide/structured-output-and-tools.md", "r = client.chat.completions.create("
                                                  "model=model, messages=messages, "
                                                  "max_tokens=8,"): How(continues=True),
    ("docs/guide/structured-output-and-tools.md", "r = client.embeddings.create(model=model, "
                                                  "input=[\"a cat on a mat\", \"a dog on a "
                                                  "log\"])"): How(continues=True),
    ("docs/guide/structured-output-and-tools.md", "import uma"): How(continues=True),
}

# `uma run` in a block: started in the background, ready once it says so, the previous one
# stopped first (a block's alternatives run in turn); a daemon that exits before it is ready
# fails the block with its output.
SHELL_PRELUDE = r"""
set -euo pipefail
uma() {
  if [ "${1:-}" = rpc-worker ]; then  # started with `&`: a subshell, which must not hold
    [ "$BASHPID" != $$ ] || { command uma "$@"; return; }  # the test's output pipes open
    exec uma "$@" < /dev/null >> "$DOCS_TMP/workers.log" 2>&1
  fi
  if [ "${1:-}" != run ]; then command uma "$@"; return; fi
  if [ -f "$DOCS_TMP/daemon.pid" ]; then
    kill -TERM "$(cat "$DOCS_TMP/daemon.pid")" 2>/dev/null || true
    wait "$(cat "$DOCS_TMP/daemon.pid")" 2>/dev/null || true
    rm -f "$DOCS_TMP/daemon.pid"
  fi
  rm -f "$DOCS_TMP/daemon.fifo"; mkfifo "$DOCS_TMP/daemon.fifo"
  command uma "$@" < /dev/null > "$DOCS_TMP/daemon.out" 2> "$DOCS_TMP/daemon.fifo" &
  echo $! > "$DOCS_TMP/daemon.pid"
  exec 7< "$DOCS_TMP/daemon.fifo"
  local line
  while IFS= read -r line <&7; do
    echo "$line" >> "$DOCS_TMP/daemon.log"
    case $line in *"uma: serving"*)
      cat <&7 >> "$DOCS_TMP/daemon.log" 2>/dev/null & exec 7<&-; return 0;;
    esac
  done
  echo "uma run $* exited before serving:" >&2; cat "$DOCS_TMP/daemon.log" >&2; return 1
}
"""


def read_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            match = FENCE.match(lines[i])
            if match:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
                if match.group(2) in LANGUAGES:
                    blocks.append(Block(str(page.relative_to(ROOT)), i + 1, match.group(2),
                                        "\n".join(lines[i + 1:end])))
                i = end
            i += 1
    return blocks


def toml_block(page: str, first_line: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    found = re.search(r"```toml\n(" + re.escape(first_line) + r"\n.*?)```", text, re.S)
    assert found, f"{page}: no TOML block starting {first_line!r}"
    return found.group(1)


class PageSession:
    """One page's blocks in one folder, with the substitutions the module docstring lists."""

    def __init__(self, tmp: Path, models: dict[str, Path]) -> None:
        self.tmp = tmp
        self.models = models
        self.key = tmp / "key"
        self.key.write_text("docs-test-key\n")
        self.python_so_far: list[str] = []
        self.ports = {port: str(free_port()) for port in ("8080", "11434", "50052", "50053")}
        bindir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "DOCS_TMP": str(tmp), "UMA_SOCKET": short_socket_path(),
                    "UMA_PREFIX_CACHE_DISK_MB": "0", "PATH": f"{bindir}:{os.environ['PATH']}"}

    def substitute(self, text: str, how: How) -> str:
        model = str(self.models[how.model])
        text = re.sub(r"(?:~/|/)?[\w./-]*\.gguf\b", model, text)
        text = re.sub(r"~/models\b", str(self.tmp), text)  # a folder of models
        text = re.sub(r"\b(uma run) smollm2\b", rf"\1 {model}", text)
        for port, free in self.ports.items():
            text = re.sub(rf"(?<=[: ]){port}\b", free, text)
        text = text.replace("~/.uma-key", str(self.key)).replace("/etc/uma/key", str(self.key))
        return "\n".join(line for line in text.splitlines()
                         if not line.startswith(how.leave_out or ("\0",)))

    def run(self, block: Block, how: How) -> None:
        for name, first_line in how.files:
            (self.tmp / name).write_text(toml_block(block.page, first_line))
        text = self.substitute(block.text, how)
        if how.daemon:
            text = f"uma run {self.models[how.model]}\n{text}"
        if block.language == "sh":
            argv = ["bash", "-c", SHELL_PRELUDE + text]
        else:
            argv = [sys.executable, "-c", "\n".join([*self.python_so_far, text]
                                                    if how.continues else [text])]
            self.python_so_far.append(text)
        done = subprocess.run(argv, cwd=self.tmp, env=self.env, input="Hi!\n", text=True,
                              capture_output=True, timeout=300)
        assert done.returncode == 0, (
            f"{block.page}:{block.line} failed ({done.returncode}):\n{text}\n--- stdout\n"
            f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}\n--- daemon\n"
            f"{self.daemon_log()}")

    def daemon_log(self) -> str:
        log = self.tmp / "daemon.log"
        return log.read_text()[-3000:] if log.exists() else "(none)"

    def close(self) -> None:
        pid_file = self.tmp / "daemon.pid"
        if pid_file.exists():
            subprocess.run(["kill", "-TERM", pid_file.read_text().strip()], capture_output=True)
        # workers a block started with `&` (uma rpc-worker) outlive its shell
        for port in self.ports.values():
            subprocess.run(["pkill", "-TERM", "-f", f"rpc-worker --port {port}"],
                           capture_output=True)


BLOCKS = read_blocks()


def test_every_block_is_listed_and_every_entry_is_a_block():
    keys = {block.key for block in BLOCKS}
    assert [b.key for b in BLOCKS if b.key not in HOW] == []
    assert [key for key in HOW if key not in keys] == []
    for how in HOW.values():
        assert how.kind in {"run", "install", "ci", "not run"}
        assert how.kind != "not run" or how.why, "a block not run says why"


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return {"tiny": synth.cached_model("tiny"), "smollm2": fetched_or_skip("smollm2")}


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted({b.page for b in BLOCKS
                                         if HOW.get(b.key, How()).kind == "run"}))
def test_a_pages_blocks_run_in_order(page, models, tmp_path):
    session = PageSession(tmp_path, models)
    try:
        for block in (b for b in BLOCKS if b.page == page):
            how = HOW[block.key]
            if how.kind == "run":
                session.run(block, how)
    finally:
        session.close()


def test_the_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    for block in BLOCKS:
        if HOW.get(block.key, How()).kind == "ci":
            command = block.text.strip().replace("pip install", "python3 -m pip install")
            command = command.replace("&& pytest", "&& python3 -m pytest")
            assert command in ci, f"{block.page}:{block.line}: CI does not run {block.text!r}"


@pytest.mark.slow
def test_the_readme_install_in_a_fresh_environment(models, tmp_path):
    """`pip install . && uma run smollm2` in a new virtual environment; the daemon it starts
    answers, then stops."""
    (block,) = [b for b in BLOCKS if HOW[b.key].kind == "install"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    session = PageSession(tmp_path, models)
    session.env["PATH"] = f"{venv / 'bin'}:{os.environ['PATH']}"
    session.env["VIRTUAL_ENV"] = str(venv)
    text = block.text + '\numa generate -p "The capital of France is" --max-tokens 8\numa stop'
    try:
        done = subprocess.run(["bash", "-c", SHELL_PRELUDE + text], cwd=ROOT, env=session.env,
                              text=True, capture_output=True, timeout=1500)
    finally:
        session.close()
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:],
                                  session.daemon_log())
    assert shutil.which("uma", path=str(venv / "bin")), "the install put no uma on PATH"
    assert done.stdout.strip(), "the served model generated nothing"
