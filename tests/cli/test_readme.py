"""README = CI: the README's test command is the install script and test run that .ci/run runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _blocks(text: str) -> list[str]:
    return re.findall(r"```\n(.*?)```", text, re.S)


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install = (ROOT / ".ci" / "install").read_text()
    assert ".ci/install && python -m pytest -q\n" in _blocks(readme)
    commands = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert ".ci/install" in commands and "python3 -m pytest -q" in commands
    assert "tf_keras" in install and "'.[test,tf]'" in install  # the Keras 2 tests' package too
    assert "|| echo" not in install  # a missing package fails the install, never skips tests silently


def test_readme_names_graphvizs_system_package():
    readme = (ROOT / "README.md").read_text()
    try_it = readme.split("## Try it on a fresh machine")[1].split("## ")[0]
    assert "apt-get install graphviz" in try_it and "brew install graphviz" in try_it


def _reference(readme: str) -> dict[str, str]:
    """Each command's entry in the README's usage blocks: 'fusecli NAME ...' and its continuation lines."""
    entries: dict[str, str] = {}
    for block in _blocks(readme):
        name = None
        for line in block.splitlines():
            m = re.match(r"fusecli (\w+) ", line)
            if m:
                name = m.group(1)
                entries[name] = entries.get(name, "") + line
            elif name and line.startswith(" "):
                entries[name] += line
            else:
                name = None
    return entries


def test_readme_reference_lists_the_shared_analysis_options_each_command_takes():
    """Issue 27: --autodiff was missing from the reference; render --help lacked --patterns, --autodiff
    and --constant-weights that analyze has."""
    from click.testing import CliRunner

    from fusecli.cli import main

    entries = _reference((ROOT / "README.md").read_text())
    for option in ("--autodiff", "--patterns", "--constant-weights"):
        assert option in CliRunner().invoke(main, ["render", "--help"]).output
    for name, command in main.commands.items():
        if name not in entries:
            continue
        takes = {o for p in command.params for o in p.opts}
        for option in ("--autodiff", "--patterns", "--constant-weights"):
            assert (option in takes) == (option in entries[name]), (name, option)
