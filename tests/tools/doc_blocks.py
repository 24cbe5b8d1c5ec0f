"""The command blocks the docs promise are tested as written, and a runner that executes one.

A block is marked by the line ``<!-- tested verbatim: ... -->`` directly above its ```` ```bash ````
fence (an HTML comment: invisible on the rendered page). Used by tests/unit/test_docs.py (the
markers, and the blocks that need no cluster) and tests/cluster/test_control_plane.py (the
README's whole cluster install against the control plane)."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

MARKER = "<!-- tested verbatim:"


def tested_blocks(path: Path) -> list[list[str]]:
    """The commands of each marked ```` ```bash ```` block of ``path``, in order, as written:
    continuation lines (``\\`` at the end) joined to their command, blank and comment-only lines
    dropped (a trailing comment stays: bash ignores it). AssertionError, naming the line, when a
    marker is not directly followed by a bash fence or its block is not closed."""
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if not line.startswith(MARKER):
            continue
        assert i + 1 < len(lines) and lines[i + 1] == "```bash", \
            f"{path}:{i + 1}: the marker must be directly followed by a ```bash fence"
        assert "```" in lines[i + 2:], f"{path}:{i + 2}: the marked block is not closed"
        end = lines.index("```", i + 2)
        text = "\n".join(lines[i + 2:end]).replace("\\\n", " ")
        blocks.append([c.strip() for c in text.splitlines() if c.strip() and not c.lstrip().startswith("#")])
    return blocks


@dataclass
class BlockRun:
    """One block run in one shell: each command's exit status, in order, and the shell's output."""

    commands: list[str]
    codes: list[int]
    output: str

    def failed(self, allowed: dict[str, tuple[int, ...]] | None = None) -> list[tuple[str, int]]:
        """(command, exit status) of each command that did not exit 0, or one of ``allowed[word]``
        when the command contains ``word``; a command that never ran (the shell ended) counts
        with status -1."""
        allowed = allowed or {}
        codes = self.codes + [-1] * (len(self.commands) - len(self.codes))
        bad = []
        for command, code in zip(self.commands, codes):
            ok = next((v for k, v in allowed.items() if k in command), (0,))
            if code not in ok:
                bad.append((command, code))
        return bad


def run_block(commands: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 600) -> BlockRun:
    """Run ``commands`` in order in ONE bash (an ``export`` reaches the commands after it), in
    ``cwd`` with ``env``; each one's exit status recorded, every command run whatever the one
    before returned."""
    status = cwd / ".block-status"
    status.unlink(missing_ok=True)
    script = "".join(f"{c}\necho $? >> {shlex.quote(str(status))}\n" for c in commands)
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout_s)
    codes = [int(x) for x in status.read_text().split()] if status.exists() else []
    status.unlink(missing_ok=True)
    return BlockRun(commands, codes, r.stdout + r.stderr)
