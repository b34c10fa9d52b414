"""README = CI: the README's test command is the install script and test run that .ci/run runs. The README
stays a short quick start; the reference lives in docs/, and every relative link between them resolves."""

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


def _reference(text: str) -> dict[str, str]:
    """Each command's entry in the reference's usage blocks: 'fusecli NAME ...' and its continuation lines."""
    entries: dict[str, str] = {}
    for block in _blocks(text):
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


def test_reference_lists_the_shared_analysis_options_each_command_takes():
    """Issue 27: --autodiff was missing from the reference; render --help lacked --patterns, --autodiff
    and --constant-weights that analyze has."""
    from click.testing import CliRunner

    from fusecli.cli import main

    entries = _reference((ROOT / "docs" / "cli.md").read_text())
    for option in ("--autodiff", "--patterns", "--constant-weights"):
        assert option in CliRunner().invoke(main, ["render", "--help"]).output
    assert set(main.commands) <= set(entries), sorted(set(main.commands) - set(entries))  # every command
    for name, command in main.commands.items():
        takes = {o for p in command.params for o in p.opts}
        for option in ("--autodiff", "--patterns", "--constant-weights"):
            assert (option in takes) == (option in entries[name]), (name, option)


def test_the_reference_documents_every_option_of_every_command():
    """docs/cli.md's usage block names each option a command takes (one of its spellings: -v or --verbose)."""
    from fusecli.cli import main

    entries = _reference((ROOT / "docs" / "cli.md").read_text())
    missing = []
    for name, command in main.commands.items():
        for param in command.params:
            opts = [o for o in param.opts + param.secondary_opts if o.startswith("-")]
            named = [o for o in opts if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", entries[name])]
            if opts and not named:
                missing.append((name, opts))
    assert not missing, missing


def test_readme_is_a_short_quick_start():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(doc: Path) -> str:
    """The text outside code blocks (a '# comment' in a block is no heading, a '](x)' there no link)."""
    return re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)


def test_every_relative_link_points_to_a_file_that_exists():
    for doc in _docs():
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            assert linked.exists(), (doc.name, target)
            if anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", _prose(linked), re.M)
                assert anchor in {_slug(h) for h in headings}, (doc.name, target)


def test_readme_links_every_reference_page():
    readme = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in readme, page.name
