"""The README's commands work when pasted.  Every line of every ```sh block in README.md is either run here
against a running `ksi dev` (the session's, on free ports: the README's default ports are rewritten to
them), or listed in NOT_RUN with the reason; a new command in the README fails this test until it is one
or the other.  A trailing `# prints X` comment is checked against the output, the `ksi status` sample is
checked against what `ksi status` draws, and every command of the CLI table answers --help."""

from __future__ import annotations

import re
import subprocess

import pytest

from dev_run import REPO_ROOT, DevRun, ksi_env

README = REPO_ROOT / "README.md"
NOT_RUN = {
    "make run": "the test starts `ksi dev` itself, on free ports (tests/integration/dev_run.py); make run is that"
                " plus the installs make test has done",
    "make test": "this is the test suite",
}
COMMENT = re.compile(r"\s{2,}#\s?(.*)$")  # a comment after two or more spaces


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(info string, lines) of every fenced code block."""
    blocks: list[tuple[str, list[str]]] = []
    info: str | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if info is None:
                info = line[3:].strip()
                blocks.append((info, []))
            else:
                info = None
        elif info is not None:
            blocks[-1][1].append(line)
    return blocks


def sh_blocks(text: str) -> list[list[str]]:
    return [lines for info, lines in fenced_blocks(text) if info == "sh"]


def commands() -> list[tuple[str, str]]:
    """(command, comment) for every line of every sh block."""
    found = []
    for block in sh_blocks(README.read_text()):
        for line in block:
            if not line.strip():
                continue
            match = COMMENT.search(line)
            found.append((line[:match.start()].strip() if match else line.strip(), match[1] if match else ""))
    return found


def localized(command: str, dev: DevRun) -> str:
    """The README's command with ksi dev's default ports replaced by the session's."""
    return (command.replace("127.0.0.1:9192", dev.bootstrap)
            .replace("http://127.0.0.1:8081", dev.registry_url)
            .replace("127.0.0.1:9404", f"127.0.0.1:{dev.metrics_port}"))


def run(command: str, dev: DevRun) -> subprocess.CompletedProcess[str]:
    # KSI_CONFIG points `ksi status` at the session's ksi dev, as ./.ksi-dev/ksi.toml would for a user
    # (that lookup itself is tested in tests/ksi/test_cli.py).
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT, env={**dev.env(), "KSI_CONFIG": str(dev.config_path)}, check=False)


def test_the_readme_has_commands_and_each_is_run_or_excused() -> None:
    listed = commands()
    assert len(listed) >= 6
    assert {c for c, _ in listed} >= set(NOT_RUN), "NOT_RUN names a command the README no longer has"


@pytest.mark.parametrize("command,comment", [c for c in commands() if c[0] not in NOT_RUN],
                         ids=lambda value: str(value)[:60])
def test_readme_command_works_when_pasted(ksi_dev: DevRun, command: str, comment: str) -> None:
    result = run(localized(command, ksi_dev), ksi_dev)
    assert result.returncode == 0, f"{command}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.strip(), f"{command} printed nothing"
    expected = re.match(r"prints (\S+?)(:|$)", comment)
    if expected:
        assert result.stdout.strip() == expected[1], (command, result.stdout[-500:])


def test_the_status_sample_is_what_ksi_status_draws(ksi_dev: DevRun) -> None:
    text = README.read_text()
    sample = "\n".join(next(lines for info, lines in fenced_blocks(text) if not info and "hot wm" in "".join(lines)))
    drawn = run(".venv/bin/ksi status", ksi_dev).stdout.splitlines()
    # the snapshot id and the lag's age differ from run to run
    def shape(line: str) -> str:
        return re.sub(r"snapshot \d+", "snapshot N", re.sub(r"/ [\d.]+[smhd]$", "/ T", line.rstrip()))

    for line in sample.splitlines():
        if line.strip() != "...":
            assert shape(line) in {shape(d) for d in drawn}, (line, drawn)


def test_every_command_in_the_cli_table_answers_help() -> None:
    text = README.read_text()
    table = text[text.index("## CLI"):text.index("## Configuration")]
    names = sorted(set(re.findall(r"^\| `ksi (\w+)", table, re.M)))
    assert {"serve", "dev", "status", "archive", "compact", "registry"} <= set(names)
    for name in names:
        result = subprocess.run([".venv/bin/ksi", name, "--help"], capture_output=True, text=True, timeout=60,
                                cwd=REPO_ROOT, env=ksi_env(), check=False)
        assert result.returncode == 0 and "usage: ksi" in result.stdout, (name, result.stderr)
    version = subprocess.run([".venv/bin/ksi", "--version"], capture_output=True, text=True, cwd=REPO_ROOT,
                             env=ksi_env(), check=False)
    assert version.returncode == 0 and version.stdout.startswith("ksi ")
