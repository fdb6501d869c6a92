"""Every Python snippet in README.md and docs/*.md runs as written (in a fresh process, outside
the checkout), so what a newcomer copies works; README stays a short tour with the two set-up
commands first."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [(page.relative_to(ROOT).as_posix(), code) for page in PAGES
            for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def test_readme_and_docs_have_snippets():
    assert len(SNIPPETS) >= 7 and any(page == "README.md" for page, _ in SNIPPETS)


def test_readme_is_a_short_tour_with_the_two_setup_commands_first():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    first_block = re.search(r"```sh\n(.*?)```", text, flags=re.S).group(1).strip().splitlines()
    assert first_block == ['python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/tirbyoc run',
                           ".venv/bin/python -m pytest"]
    for link in re.findall(r"\]\((docs/[\w.]+\.md)", text):
        assert (ROOT / link).exists(), link


@pytest.mark.parametrize("n", range(len(SNIPPETS)), ids=lambda n: f"{SNIPPETS[n][0]}-{n + 1}")
def test_snippet_runs_as_written(n, tmp_path):
    page, code = SNIPPETS[n]
    path = tmp_path / f"snippet{n + 1}.py"
    path.write_text(code)
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{page} snippet failed:\n{code}\n{done.stderr[-3000:]}"
